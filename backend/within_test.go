package backend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
)

// Within returns the call's result when it comes first, ctx's error (through
// ended) once ctx ends first, at once for a context already ended, and runs
// the call on the caller's goroutine when ctx cannot end.
func TestWithin(t *testing.T) {
	ended := func(err error) error { return err }
	ok := errors.New("answered")
	if got := backend.Within(context.Background(), func() error { return ok }, ended); got != ok {
		t.Fatalf("Within under a context that cannot end = %v, want the call's result", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if got := backend.Within(ctx, func() error { return ok }, ended); got != ok {
		t.Fatalf("Within, the call answering = %v, want the call's result", got)
	}
	release := make(chan struct{})
	defer close(release)
	time.AfterFunc(20*time.Millisecond, cancel)
	start := time.Now()
	got := backend.Within(ctx, func() error { <-release; return ok }, ended)
	if !errors.Is(got, context.Canceled) {
		t.Fatalf("Within, ctx ending while the call waits = %v, want context.Canceled", got)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Within returned %v after ctx ended", took)
	}
	called := false
	if got := backend.Within(ctx, func() error { called = true; return ok }, ended); !errors.Is(got, context.Canceled) || called {
		t.Fatalf("Within under an ended context = %v (call made: %v), want context.Canceled without a call", got, called)
	}
}
