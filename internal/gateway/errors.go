package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Sentinel errors of this package.
var (
	ErrOwnerMismatch = errors.New("gateway: backend output carries another owner")
	ErrBadStream     = errors.New("gateway: backend stream broke its contract")
	ErrDraining      = errors.New("gateway: server is draining")
)

// statusClientClosed is nginx's "client closed request": used in logs and
// metrics for a client that left before its answer, never sent to anyone.
const statusClientClosed = 499

// apiError is what every handler returns on failure. Message (and Param,
// Code, Type) reach the client; Err is logged and never sent, so internals
// (paths, addresses, stack traces, other tenants' data) cannot leak through
// an error body. This is the tsweb pattern from STYLE.md.
type apiError struct {
	Status     int
	Type       string // OpenAI error type
	Code       string // OpenAI error code; "" is sent as null
	Param      string // offending parameter; "" is sent as null
	Message    string
	Err        error         // internal cause, logged only
	RetryAfter time.Duration // sets Retry-After when > 0
}

func (e *apiError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%d %s: %s: %v", e.Status, e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message)
}

func (e *apiError) Unwrap() error { return e.Err }

// errorBody is OpenAI's error shape.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() errorBody {
	o := errorObject{Message: e.Message, Type: e.Type}
	if e.Param != "" {
		o.Param = &e.Param
	}
	if e.Code != "" {
		o.Code = &e.Code
	}
	return errorBody{Error: o}
}

// writeAPIError sends e as an HTTP error response. Only for use before any
// byte of the response was written.
func writeAPIError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		secs := int((e.RetryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.Itoa(secs))
	}
	w.WriteHeader(e.Status)
	b, _ := json.Marshal(e.body())
	w.Write(append(b, '\n'))
}

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

func unsupported(param, what string) *apiError {
	e := badRequest(param, "%s is not supported by this server", what)
	e.Code = "unsupported_parameter"
	return e
}

func internalError(err error) *apiError {
	return &apiError{Status: http.StatusInternalServerError, Type: "server_error", Code: "internal_error",
		Message: "The server had an error while processing your request.", Err: err}
}

// contextLengthError refuses a request over the window; param names the
// field the prompt came from ("messages" or "prompt"), as OpenAI does. The
// callers bound both numbers, so the sum cannot overflow.
func contextLengthError(param string, window, prompt, completion int) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "context_length_exceeded", Param: param,
		Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d for the completion). Please reduce the prompt or max_tokens.",
			window, prompt+completion, prompt, completion)}
}

var (
	errUnauthorized = &apiError{Status: http.StatusUnauthorized, Type: "invalid_request_error", Code: "invalid_api_key",
		Message: "Incorrect or missing API key. Send it as 'Authorization: Bearer KEY'."}
	errDraining = &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down",
		Message: "The server is shutting down; retry on another instance.", RetryAfter: time.Second}
	errPaused = &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "draining",
		Message: "The server is draining for maintenance; retry on another instance.", RetryAfter: time.Second}
	errOverloaded = &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "overloaded",
		Message: "The server is overloaded; retry later.", RetryAfter: time.Second}
)

// backendError maps an error or failed terminal result from the backend to
// the client's status. Unknown errors are internal: their text is logged,
// never sent.
func backendError(err error) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, request.ErrContextLength):
		return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "context_length_exceeded",
			Message: "The request exceeds the model's context window.", Err: err}
	case errors.Is(err, request.ErrOverloaded):
		e := *errOverloaded
		e.Err = err
		return &e
	case errors.Is(err, request.ErrShuttingDown), errors.Is(err, ErrDraining):
		e := *errDraining
		e.Err = err
		return &e
	case errors.Is(err, request.ErrQuota):
		// The scheduler refuses with ErrQuota only a request that can
		// never fit the tenant's page cap: retrying cannot help.
		return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "kv_page_limit_exceeded", Param: "max_tokens",
			Message: "The request needs more KV pages than your tenant may hold; lower max_tokens or shorten the prompt.", Err: err}
	case errors.Is(err, request.ErrAborted):
		// The client did not ask for this abort (client disconnects
		// never reach a response), so the server gave up on it.
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "aborted",
			Message: "The request was aborted by the server before it finished; it was not completed.", RetryAfter: time.Second, Err: err}
	case errors.Is(err, request.ErrNodeFailed):
		// A node going down is an availability event, not a bug in the
		// request or the server's logic: 503 so that clients retry.
		return &apiError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "node_failed",
			Message: "A node serving the request failed before it finished; it was not completed. Retry.", RetryAfter: time.Second, Err: err}
	}
	return internalError(err)
}
