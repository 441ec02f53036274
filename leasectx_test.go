package fairlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// LeaseContext of a lease that has ended returns a context already
// cancelled, with the lease's Err as cause; a live lease's context is
// cancelled by the time its Done channel closes and Release returns, with
// a cause matching ErrNotHeld; cancel ends a live lease's context with context.Canceled
// and leaves the lease alone.
func TestLeaseContextEnds(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		c := e.Client()
		req := fairlock.Request{Name: "lctx", Capacity: 1, Permits: 1}

		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// A live lease: cancel ends the context, not the lease.
		lctx, cancel := fairlock.LeaseContext(ctx, l)
		if err := lctx.Err(); err != nil {
			t.Fatalf("the context of a live lease: %v", err)
		}
		cancel()
		if !errors.Is(context.Cause(lctx), context.Canceled) || l.Err() != nil {
			t.Fatalf("after cancel: cause %v, lease %v; want context.Canceled and a live lease", context.Cause(lctx), l.Err())
		}
		// Contexts of a live lease end when it is released, before Release
		// returns.
		const n = 1000
		live := make([]context.Context, n)
		for i := range live {
			var cancel context.CancelFunc
			live[i], cancel = fairlock.LeaseContext(ctx, l)
			defer cancel()
		}
		// Whoever sees Done closed finds the contexts ended.
		liveAtDone := make(chan int, 1)
		go func() {
			<-l.Done()
			n := 0
			for _, lctx := range live {
				if lctx.Err() == nil {
					n++
				}
			}
			liveAtDone <- n
		}()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := <-liveAtDone; n > 0 {
			t.Errorf("%d of %d contexts of a lease still live when its Done channel closed", n, len(live))
		}
		stillLive := 0
		for i, lctx := range live {
			if lctx.Err() == nil {
				stillLive++
			} else if cause := context.Cause(lctx); !errors.Is(cause, fairlock.ErrNotHeld) {
				t.Fatalf("context %d: cause %v, want ErrNotHeld", i, cause)
			}
		}
		if stillLive > 0 {
			t.Errorf("%d of %d contexts of a lease still live when Release returned", stillLive, n)
		}
		// Contexts of a released lease are done at once.
		stillLive = 0
		for i := range n {
			lctx, cancel := fairlock.LeaseContext(ctx, l)
			if lctx.Err() == nil {
				stillLive++
			} else if cause, want := context.Cause(lctx), l.Err(); cause != want || !errors.Is(cause, fairlock.ErrNotHeld) {
				t.Fatalf("context %d: cause %v, want the lease's Err %v (ErrNotHeld)", i, cause, want)
			}
			cancel()
		}
		if stillLive > 0 {
			t.Fatalf("%d of %d contexts of a released lease still live when LeaseContext returned", stillLive, n)
		}

		// A lost lease: its contexts carry its loss.
		lost, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// Dropped as a script drops a lease that ended unreleased: the
		// holder kept in the state hash (a mutex's) goes, and a tombstone
		// takes its ticket's place, which its member was.
		o, err := e.RDB.HGet(ctx, e.Key("lctx", "s"), "o").Result()
		if err != nil {
			t.Fatal(err)
		}
		ticket, _, _ := strings.Cut(o, " ")
		if err := e.RDB.HDel(ctx, e.Key("lctx", "s"), "o", "oe").Err(); err != nil {
			t.Fatal(err)
		}
		if err := e.RDB.HSet(ctx, e.Key("lctx", "s"), ticket, "x").Err(); err != nil {
			t.Fatal(err)
		}
		tomb := redis.Z{Score: float64(time.Now().Add(20 * time.Second).UnixMilli()), Member: ticket}
		if err := e.RDB.ZAdd(ctx, e.Key("lctx", "t"), tomb).Err(); err != nil {
			t.Fatal(err)
		}
		if err := lost.Release(ctx); !errors.Is(err, fairlock.ErrLeaseLost) {
			t.Fatalf("Release of a dropped lease = %v, want ErrLeaseLost", err)
		}
		lctx, cancel = fairlock.LeaseContext(ctx, lost)
		defer cancel()
		if cause := context.Cause(lctx); lctx.Err() == nil || cause != lost.Err() || !errors.Is(cause, fairlock.ErrLeaseLost) {
			t.Fatalf("context of a lost lease: err %v, cause %v; want cancelled with the lease's Err %v", lctx.Err(), cause, lost.Err())
		}

		// The parent's values and cancellation still reach the context.
		type key struct{}
		parent, pcancel := context.WithCancel(context.WithValue(ctx, key{}, "v"))
		l, err = c.Acquire(ctx, fairlock.Request{Name: "lctx2", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		lctx, cancel = fairlock.LeaseContext(parent, l)
		defer cancel()
		if lctx.Value(key{}) != "v" {
			t.Fatal("the parent's value is lost")
		}
		pcancel()
		<-lctx.Done()
		if l.Err() != nil {
			t.Fatalf("the parent's end ended the lease: %v", l.Err())
		}
		e.Release(l)
	})
}

// A nil lease gives a context cancelled at once, with a cause matching
// ErrInvalidArgument, not a panic.
func TestLeaseContextNil(t *testing.T) {
	ctx, cancel := fairlock.LeaseContext(context.Background(), nil)
	defer cancel()
	if ctx.Err() == nil || !errors.Is(context.Cause(ctx), fairlock.ErrInvalidArgument) {
		t.Fatalf("LeaseContext(nil lease): err %v, cause %v; want cancelled with ErrInvalidArgument", ctx.Err(), context.Cause(ctx))
	}
}
