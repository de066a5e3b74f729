package loadgen

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzReadStream feeds arbitrary bytes to the event-stream reader, which
// reads what a server sends: it must never panic, and what it reports must
// be consistent with the bytes.
func FuzzReadStream(f *testing.F) {
	for _, seed := range []string{
		"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata:[DONE]",
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}\n\n",
		"data: {\"error\":{\"message\":\"x\"}}\n\n",
		"data: {\"error\":null,\"choices\":[{\"text\":\"\"}]}\n\n",
		": ping\n\nevent: message\ndata: [DONE]\n",
		"data: {\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		texts := 0
		res, err := readStream(bytes.NewReader(data), func() { texts++ })
		if err != nil && !errors.Is(err, errMalformed) {
			t.Fatalf("error %v not marked malformed", err)
		}
		if res.done && res.errorEvent {
			t.Fatal("both [DONE] and an error event")
		}
		if res.done && !bytes.Contains(data, []byte("[DONE]")) {
			t.Fatal("[DONE] reported for a stream without one")
		}
		if texts > bytes.Count(data, []byte("data:")) {
			t.Fatalf("%d text events from %d data lines", texts, bytes.Count(data, []byte("data:")))
		}
	})
}
