package fairlockotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fairlock/fairlock/fairlockotel"
	"github.com/fairlock/fairlock/latch"
)

// A countdown latch's Wait that had to wait counts as a waiter of the
// latch's name while it waits, under a "fairlock.wait" span, and ends in
// fairlock.wait.duration as opened (the latch opened) or abandoned (its
// context ended); the observer then remembers nothing of it.
func TestLatchWaitsCounted(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c := r.client()
	l, err := latch.New(c, "go", 1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Wait(ctx) }()
	waitFor(t, "the latch's waiter counted", func() bool { return r.gauge("fairlock.waiters", "go") == 1 })
	if err := l.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Wait() = %v once the latch opened", err)
	}
	shut, err := latch.New(c, "shut", 2)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- shut.Wait(cctx) }()
	waitFor(t, "the second latch's waiter counted", func() bool { return r.gauge("fairlock.waiters", "shut") == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait() = %v", err)
	}
	if g, s := r.gauge("fairlock.waiters", "go"), r.gauge("fairlock.waiters", "shut"); g != 0 || s != 0 {
		t.Fatalf("fairlock.waiters after the waits ended: go %d, shut %d; want 0", g, s)
	}
	waits := hists(t, r.metrics()["fairlock.wait.duration"])
	for _, k := range []string{"fairlock.outcome=opened,fairlock.semaphore=go", "fairlock.outcome=abandoned,fairlock.semaphore=shut"} {
		if waits[k].Count != 1 {
			t.Errorf("fairlock.wait.duration{%s} counts %d waits, want 1 (all: %v)", k, waits[k].Count, waits)
		}
	}
	if h := r.gauge("fairlock.holders", "go"); h != 0 {
		t.Errorf("fairlock.holders of the latch = %d, want 0: an opened latch grants nothing", h)
	}
	if n := len(r.spans.Started()) - len(r.spans.Ended()); n != 0 {
		t.Errorf("%d spans not ended", n)
	}
	if n := fairlockotel.Live(r.obs); n != 0 {
		t.Errorf("the observer remembers %d waits, want 0", n)
	}
}
