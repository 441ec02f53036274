package barrier_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// waited checks that evs are one wait on the barrier name, under one ID:
// WaitStarted, then end (WaitEnded or WaitAbandoned). It returns the end.
func waited(t *testing.T, evs []fairlock.Event, name string, end fairlock.EventKind, what string) fairlock.Event {
	t.Helper()
	if len(evs) != 2 || evs[0].Kind != fairlock.WaitStarted || evs[1].Kind != end ||
		evs[0].ID == 0 || evs[1].ID != evs[0].ID || evs[1].Wait <= 0 {
		t.Fatalf("events of %s: %v, want wait_started and %v under one ID", what, evs, end)
	}
	for _, ev := range evs {
		if len(ev.Names) != 1 || ev.Names[0] != name || ev.Permits != nil {
			t.Fatalf("event of %s: %+v, want the barrier %q named, no permits", what, ev, name)
		}
	}
	return evs[1]
}

// A client's observer sees each Await that waited from its start to its
// end under one ID: WaitEnded when its round completed, WaitAbandoned
// with Await's error when the round broke (ErrBrokenBarrier), its context
// ended or its client closed. The round's last party, which returns at
// once, and an Await that fails before it arrives report nothing.
func TestObserverSeesBarrierAwaits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		const parties = 3
		recs := make([]*fltest.Events, parties)
		brs := make([]*barrier.Barrier, parties)
		for i := range recs {
			recs[i] = &fltest.Events{}
			brs[i] = e.barrier(e.Client(fairlock.WithObserver(recs[i])), "obs", parties)
		}

		// A completed round: the parties that waited see it start and
		// end; the last sees nothing.
		var chs []<-chan result
		for i := range parties - 1 {
			chs = append(chs, awaitAsync(ctx, brs[i]))
			e.WaitFor(fmt.Sprintf("arrival %d", i), func() bool { return e.waiters("obs") == int64(i+1) })
		}
		if a, err := brs[parties-1].Await(ctx); err != nil || a.Round != 1 || a.Index != parties-1 {
			t.Fatalf("last party's Await() = %+v, %v; want round 1, index %d", a, err, parties-1)
		}
		ids := map[uint64]bool{}
		for i, ch := range chs {
			if r := receive(t, ch, "Await"); r.err != nil || r.a.Round != 1 {
				t.Fatalf("party %d's Await() = %+v, %v; want round 1", i, r.a, r.err)
			}
			ev := waited(t, recs[i].Take(), "obs", fairlock.WaitEnded, fmt.Sprintf("party %d's Await in a completed round", i))
			if ev.Err != nil || ids[ev.ID] {
				t.Fatalf("party %d's wait_ended: %+v, want no Err and an ID of its own", i, ev)
			}
			ids[ev.ID] = true
		}
		if got := recs[parties-1].Take(); len(got) != 0 {
			t.Fatalf("events of the last party's Await, which did not wait: %v, want none", got)
		}

		// A broken round: the party whose context ends sees its wait
		// abandoned with ctx's error, the other with the break.
		first := awaitAsync(ctx, brs[0])
		e.WaitFor("the first arrival", func() bool { return e.waiters("obs") == 1 })
		cctx, cancel := context.WithCancel(ctx)
		second := awaitAsync(cctx, brs[1])
		e.WaitFor("the second arrival", func() bool { return e.waiters("obs") == 2 })
		cancel()
		if r := receive(t, second, "the cancelled Await"); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled Await() = %+v, %v; want context.Canceled", r.a, r.err)
		}
		r := receive(t, first, "the first party's Await")
		wantBroken(t, r.err, 2, "first party's Await()")
		ev := waited(t, recs[1].Take(), "obs", fairlock.WaitAbandoned, "a cancelled Await")
		if !errors.Is(ev.Err, context.Canceled) {
			t.Fatalf("wait_abandoned of a cancelled Await: Err %v, want context.Canceled", ev.Err)
		}
		ev = waited(t, recs[0].Take(), "obs", fairlock.WaitAbandoned, "an Await whose round broke")
		wantBroken(t, ev.Err, 2, "wait_abandoned's Err of an Await whose round broke")
		if ev.Err != r.err {
			t.Fatalf("wait_abandoned's Err %v is not the error Await returned, %v", ev.Err, r.err)
		}

		// An Await whose client closes while it waits.
		rc := &fltest.Events{}
		c := e.Client(fairlock.WithObserver(rc))
		ch := awaitAsync(ctx, e.barrier(c, "obs", parties))
		e.WaitFor("an arrival", func() bool { return e.waiters("obs") == 1 })
		if err := c.Close(); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		if r := receive(t, ch, "Await"); !errors.Is(r.err, fairlock.ErrClosed) {
			t.Fatalf("Await() when its client closed = %+v, %v; want ErrClosed", r.a, r.err)
		}
		ev = waited(t, rc.Take(), "obs", fairlock.WaitAbandoned, "an Await whose client closed")
		if !errors.Is(ev.Err, fairlock.ErrClosed) {
			t.Fatalf("wait_abandoned of an Await whose client closed: Err %v, want ErrClosed", ev.Err)
		}

		// An Await that fails before it arrives waited for nothing.
		if _, err := brs[0].Await(cctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Await() with a cancelled context = %v, want context.Canceled", err)
		}
		if got := recs[0].Take(); len(got) != 0 {
			t.Fatalf("events of an Await that did not arrive: %v, want none", got)
		}
	})
}
