package latch_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// A client's observer sees a Wait that had to wait from its start to its
// end under one ID: WaitEnded when the latch opened, WaitAbandoned (with
// its cause) when its context ended; a Wait on an open latch, which
// waits for nothing, reports nothing.
func TestObserverSeesLatchWaits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		rec := &fltest.Events{}
		c := e.Client(fairlock.WithObserver(rec))
		l := e.latch(e.Client(), "obs", 1)
		ch := waitAsync(ctx, e.latch(c, "obs", 1))
		e.WaitFor("the waiter", func() bool { return e.waiters("obs") == 1 })
		e.countDown(l)
		if err := receive(t, ch, "Wait"); err != nil {
			t.Fatalf("Wait() = %v once the latch opened, want nil", err)
		}
		got := rec.Take()
		if len(got) != 2 || got[0].Kind != fairlock.WaitStarted || got[1].Kind != fairlock.WaitEnded ||
			got[0].ID == 0 || got[1].ID != got[0].ID || got[1].Wait <= 0 || got[1].Names[0] != "obs" || got[1].Err != nil {
			t.Fatalf("events of a Wait the latch's opening ended: %v, want wait_started and wait_ended under one ID", got)
		}
		if err := e.latch(c, "obs", 1).Wait(ctx); err != nil {
			t.Fatalf("Wait() on an open latch = %v", err)
		}
		if got := rec.Take(); len(got) != 0 {
			t.Fatalf("events of a Wait on an open latch: %v, want none", got)
		}

		cctx, cancel := context.WithCancel(ctx)
		ch = waitAsync(cctx, e.latch(c, "shut", 2))
		e.WaitFor("the waiter", func() bool { return e.waiters("shut") == 1 })
		cancel()
		if err := receive(t, ch, "Wait"); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Wait() = %v, want context.Canceled", err)
		}
		got = rec.Take()
		if len(got) != 2 || got[0].Kind != fairlock.WaitStarted || got[1].Kind != fairlock.WaitAbandoned ||
			got[1].ID != got[0].ID || !errors.Is(got[1].Err, context.Canceled) {
			t.Fatalf("events of a cancelled Wait: %v, want wait_started and wait_abandoned (context.Canceled) under one ID", got)
		}
	})
}
