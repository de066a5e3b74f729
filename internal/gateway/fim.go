package gateway

import (
	"fmt"
	"net/http"
)

// FillInTheMiddle is what a Backend whose model was trained to fill a gap
// offers: its prefix, suffix and middle tokens (ok false: none). A
// completion with a suffix is sent as [BOS] PRE prompt SUF suffix MID
// (prefix-suffix-middle order, as llama.cpp's infill builds it), and the
// model writes the middle. Without them `suffix` is refused: any other
// prompt would make a model that never saw the format answer something
// else than what was asked.
type FillInTheMiddle interface {
	FIM() (pre, suf, mid int, ok bool)
}

// fillInTheMiddle returns how to build a prompt around suffix, or nil when
// there is no suffix; a 400 naming suffix when the model cannot fill.
func (s *Server) fillInTheMiddle(suffix string) (func(prompt string) ([]int, error), *apiError) {
	if suffix == "" {
		return nil, nil
	}
	f, ok := s.backend.(FillInTheMiddle)
	var pre, suf, mid int
	if ok {
		pre, suf, mid, ok = f.FIM()
	}
	if !ok {
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "unsupported_parameter", Param: "suffix",
			Message: "'suffix' needs a model trained for fill-in-the-middle (with prefix, suffix and middle tokens), and this model has none."}
	}
	return func(prompt string) ([]int, error) {
		// Only BOS, where the model puts it: the texts themselves are
		// tokenized without special tokens, so that they cannot forge a
		// FIM marker.
		bos, err := s.backend.Tokenize("", true, false)
		if err != nil {
			return nil, err
		}
		p, err := s.backend.Tokenize(prompt, false, false)
		if err != nil {
			return nil, err
		}
		x, err := s.backend.Tokenize(suffix, false, false)
		if err != nil {
			return nil, fmt.Errorf("suffix: %w", err)
		}
		ids := append(append([]int(nil), bos...), pre)
		ids = append(append(ids, p...), suf)
		return append(append(ids, x...), mid), nil
	}, nil
}
