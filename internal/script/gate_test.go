package script

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
)

// Until a call of a script has returned, its calls run one at a time;
// one whose context ends while it waits its turn returns the context's
// error and sends nothing; once the first has returned (an error too),
// the calls that waited, and those after, run side by side.
func TestFormsGateFirstCalls(t *testing.T) {
	f := &Forms{Eval: NewEvalCode("return 1"), gate: make(chan struct{}, 1), wait: time.Hour}
	set := &Set{}
	var sends atomic.Int32
	release := make(chan Result)
	// Each send counts, and blocks until answered or its ctx ends.
	run := func(ctx context.Context) <-chan Result {
		send := func(backend.Script) Result {
			sends.Add(1)
			select {
			case r := <-release:
				return r
			case <-ctx.Done():
				return Result{Err: ctx.Err()}
			}
		}
		ch := make(chan Result, 1)
		go func() { ch <- f.Run(ctx, set, nil, false, send, nil, nil) }()
		return ch
	}
	waitSends := func(n int32, what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); sends.Load() != n; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d sends, want %d: %s", sends.Load(), n, what)
			}
		}
	}
	first := run(context.Background())
	waitSends(1, "the first call")
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if r := <-run(short); !errors.Is(r.Err, context.DeadlineExceeded) || sends.Load() != 1 {
		t.Fatalf("a call waiting its turn past its deadline = %v, %d sends; want its context's error, nothing sent", r.Err, sends.Load())
	}
	second, third := run(context.Background()), run(context.Background())
	time.Sleep(20 * time.Millisecond)
	if n := sends.Load(); n != 1 {
		t.Fatalf("%d sends before the first call returned, want 1", n)
	}
	release <- Result{Err: errors.New("connection refused")}
	if r := <-first; r.Err == nil {
		t.Fatal("the first call's error was lost")
	}
	// Returned: the two that waited go side by side, and so do later calls.
	waitSends(3, "the calls that waited did not run side by side")
	fourth := run(context.Background())
	waitSends(4, "a call after the first returned waited")
	for _, ch := range []<-chan Result{second, third, fourth} {
		release <- Result{Val: int64(1)}
		_ = ch
	}
	for _, ch := range []<-chan Result{second, third, fourth} {
		if r := <-ch; r.Val != int64(1) {
			t.Fatalf("a call = %v", r)
		}
	}
}

// A call that waited its turn for FirstCallWait goes anyway: a first call
// Redis leaves unanswered does not hold the others.
func TestFormsGateWaitsABoundedTime(t *testing.T) {
	f := &Forms{Eval: NewEvalCode("return 1"), gate: make(chan struct{}, 1), wait: 50 * time.Millisecond}
	var sends atomic.Int32
	stalled := make(chan struct{})
	defer close(stalled)
	go f.Run(context.Background(), &Set{}, nil, false, func(backend.Script) Result {
		sends.Add(1)
		<-stalled
		return Result{Err: errors.New("stalled")}
	}, nil, nil)
	for sends.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan Result, 1)
	go func() {
		done <- f.Run(context.Background(), &Set{}, nil, false, func(backend.Script) Result {
			sends.Add(1)
			return Result{Val: int64(1)}
		}, nil, nil)
	}()
	select {
	case r := <-done:
		if r.Val != int64(1) || sends.Load() != 2 {
			t.Fatalf("the call behind a stalled first call = %v after %d sends", r, sends.Load())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a call waited on a stalled first call past FirstCallWait")
	}
}
