package gateway_test

import (
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestStopSequenceNeedsACleanEnd: after a stop sequence the gateway aborts
// the rest; if the backend's terminal result is then a failure (say a
// violation found in the same step) rather than the plain abort, the
// response must not be a 200.
func TestStopSequenceNeedsACleanEnd(t *testing.T) {
	fake := gatewaytest.NewFake()
	fake.Behave = func(request.Params) gatewaytest.Behavior {
		return gatewaytest.Behavior{Reply: "abc STOP def", AbortErr: fmt.Errorf("%w: isolation check failed", request.ErrInternal)}
	}
	h := newHarness(t, fake)
	for _, stream := range []bool{false, true} {
		r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "x", "stop": "STOP", "stream": stream})
		if !stream && r.status == 200 {
			t.Errorf("non-streaming: 200 for a request whose end failed: %s", r.body)
		}
		if stream {
			s := summarize(t, r.body)
			if s.done || s.errObj == nil {
				t.Errorf("streaming: [DONE] %v, error event %v; want an error event and no [DONE]", s.done, s.errObj)
			}
		}
	}
}
