package sched

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"

	"github.com/pagewarden/pagewarden/internal/request"
)

// TestNodeSubmitContextCancelAborts is the contract of Node.Submit:
// cancelling the context it was given later aborts the request, whether it
// is running or still waiting for pages. Its stream then ends with
// FinishAbort and request.ErrAborted, after at most the tokens of the step
// that was in flight: never with success.
func TestNodeSubmitContextCancelAborts(t *testing.T) {
	for _, tc := range []struct {
		name      string
		waiting   bool
		maxTokens int // of the tokens the aborted request may have got
	}{
		{"running", false, 1},
		{"waiting for pages", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				n, g, _, _ := newTestNode(t, nodeOpts{window: 16, pageSize: 4, pages: 4, batchTokens: 16, gate: true})
				stop := make(chan struct{})
				defer close(stop)
				run := func() { // lets every batch run from now on
					go func() {
						for {
							select {
							case g.gate <- struct{}{}:
							case <-stop:
								return
							}
						}
					}()
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				p := testParams("a", 12, 4, 1) // 3 of the 4 pages, growing to 4
				if tc.waiting {
					bp := testParams("b", 12, 4, 2)
					blocker, err := n.Submit(context.Background(), bp)
					if err != nil {
						t.Fatal(err)
					}
					synctest.Wait() // the loop is inside the executor with blocker's batch
					got := make(chan *Stream, 1)
					go func() {
						s, err := n.Submit(ctx, p)
						if err != nil {
							t.Error(err)
						}
						got <- s
					}()
					synctest.Wait()      // the submission waits for the loop
					g.gate <- struct{}{} // which applies it after the batch: p waits for pages
					s := <-got
					if s == nil {
						t.FailNow()
					}
					synctest.Wait() // the loop is inside the executor with the next batch
					cancel()
					synctest.Wait() // the cancellation hook queued the abort
					run()
					checkCancelled(t, s, p, tc.maxTokens)
					if _, res := collect(t, blocker, bp); res.Reason != request.FinishLength {
						t.Errorf("blocker: %+v", res)
					}
					return
				}
				s, err := n.Submit(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait() // the loop is inside the executor with p's first batch
				cancel()
				synctest.Wait() // the cancellation hook queued the abort
				run()
				checkCancelled(t, s, p, tc.maxTokens)
			})
		})
	}
}

func checkCancelled(t *testing.T, s *Stream, p request.Params, maxTokens int) {
	t.Helper()
	toks, res := collect(t, s, p)
	if res.Reason != request.FinishAbort || !errors.Is(res.Err, request.ErrAborted) || len(toks) > maxTokens {
		t.Errorf("after the Submit context was cancelled: %s %v after %d tokens, want an abort after at most %d", res.Reason, res.Err, len(toks), maxTokens)
	}
}
