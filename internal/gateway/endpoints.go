package gateway

import (
	"encoding/json"
	"fmt"
)

// models lists the one served model, as OpenAI's GET /v1/models does.
func (s *Server) models(c *call) *apiError {
	return writeOK(c, map[string]any{"object": "list", "data": []any{s.modelObject()}})
}

// model is GET /v1/models/{id}: the served model's entry, or 404.
func (s *Server) model(c *call) *apiError {
	if id := c.r.PathValue("id"); id != s.backend.ModelID() {
		return s.modelNotFound(id)
	}
	return writeOK(c, s.modelObject())
}

// modelObject is the served model in OpenAI's model shape. created is the
// server's start time, so that it is the same on every call.
func (s *Server) modelObject() map[string]any {
	return map[string]any{
		"id": s.backend.ModelID(), "object": "model", "created": s.created.Unix(),
		"owned_by": "pagewarden", "root": s.backend.ModelID(), "parent": nil,
		"max_model_len": s.limits.MaxContext,
	}
}

// tokenizeRequest is vLLM's /tokenize body: either a prompt or messages.
type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              *string         `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	AddSpecialTokens    *bool           `json:"add_special_tokens"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

// tokenize counts against the tenant's quota like a generation request:
// one request, a concurrency slot while it runs, and, up front, as many
// tokens as the body has bytes (no text yields more tokens than bytes, bar
// the special ones), refunded down to the tokens it produced. Tokenizing is
// CPU the tenant asked for; outside every quota, a few megabyte bodies a
// second would take a core from everyone.
func (s *Server) tokenize(c *call) *apiError {
	body, e := c.readBody()
	if e != nil {
		return e
	}
	grant, e := c.acquire(len(body)+2, 0)
	if e != nil {
		return e
	}
	used := len(body) + 2
	defer func() { grant.Release(s.now(), used) }()
	var req tokenizeRequest
	if e := decodeJSON(body, &req); e != nil {
		return e
	}
	if e := c.checkModel(req.Model); e != nil {
		return e
	}
	var ids []int
	switch {
	case req.Prompt != nil && !isNull(req.Messages):
		return badRequest("messages", "Send either 'prompt' or 'messages', not both.")
	case req.Prompt != nil:
		add := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		var err error
		if ids, err = s.backend.Tokenize(*req.Prompt, add, true); err != nil {
			return internalError(fmt.Errorf("tokenize: %w", err))
		}
	case !isNull(req.Messages):
		// The same path as chat completions, so the count is exactly
		// what a chat request with these messages is charged.
		chatBody, _ := json.Marshal(map[string]json.RawMessage{"messages": req.Messages})
		_, msgs, _, e := parseChat(chatBody)
		if e != nil {
			return e
		}
		addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		if ids, _, e = s.chatPrompt(msgs, addGen, nil); e != nil {
			return e
		}
	default:
		return badRequest("prompt", "'prompt' or 'messages' is required.")
	}
	used = len(ids)
	if ids == nil {
		ids = []int{}
	}
	return writeOK(c, map[string]any{"count": len(ids), "max_model_len": s.limits.MaxContext, "tokens": ids})
}

func (s *Server) detokenize(c *call) *apiError {
	body, e := c.readBody()
	if e != nil {
		return e
	}
	var req struct {
		Model  string `json:"model"`
		Tokens []int  `json:"tokens"`
	}
	if e := decodeJSON(body, &req); e != nil {
		return e
	}
	if e := c.checkModel(req.Model); e != nil {
		return e
	}
	if req.Tokens == nil {
		return badRequest("tokens", "'tokens' is required.")
	}
	// Under the quota as tokenize is: a request, a slot, its tokens.
	grant, e := c.acquire(len(req.Tokens), 0)
	if e != nil {
		return e
	}
	defer grant.Release(s.now(), len(req.Tokens))
	for _, id := range req.Tokens {
		if id < 0 {
			return badRequest("tokens", "Token ids must not be negative.")
		}
	}
	text, err := s.backend.Detokenize(req.Tokens)
	if err != nil {
		e := badRequest("tokens", "'tokens' holds an id that is not in the model's vocabulary.")
		e.Err = err
		return e
	}
	return writeOK(c, map[string]any{"prompt": text})
}

func writeOK(c *call, v any) *apiError {
	if err := c.writeJSON(v); err != nil {
		c.err = err
	}
	return nil
}
