package gateway_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

func benchServer(b *testing.B) *gateway.Server {
	fake := gatewaytest.NewFake()
	fake.Behave = func(request.Params) gatewaytest.Behavior { return gatewaytest.Behavior{Reply: "ok"} }
	srv, err := gateway.New(gateway.Config{
		Backend: fake, Tenants: testTenants(tenants.Limits{}, tenants.Limits{}),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// BenchmarkTrivialChat is the gateway's own cost for a chat request whose
// backend answers two tokens at once: decode, auth, template, tokenize,
// admission, relay, encode, metrics and log. In-process, no network.
func BenchmarkTrivialChat(b *testing.B) {
	for _, stream := range []bool{false, true} {
		name := "non-stream"
		body := `{"model":"fake-model","messages":[{"role":"user","content":"Hi"}],"max_tokens":8}`
		if stream {
			name = "stream"
			body = `{"model":"fake-model","messages":[{"role":"user","content":"Hi"}],"max_tokens":8,"stream":true}`
		}
		b.Run(name, func(b *testing.B) {
			srv := benchServer(b)
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+keyAlpha)
				w := httptest.NewRecorder()
				srv.ServeHTTP(w, req)
				if w.Code != 200 {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}

// BenchmarkTrivialChatLoopback adds a real loopback HTTP round trip.
func BenchmarkTrivialChatLoopback(b *testing.B) {
	srv := benchServer(b)
	ts := httptest.NewServer(srv)
	defer ts.Close()
	client := ts.Client()
	body := `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":8}`
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", ts.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+keyBeta)
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}
