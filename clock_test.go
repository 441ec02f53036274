package fairlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
)

// On a real server on this machine (its TIME and the local wall clock are
// one clock), every deadline a lease keeps comes before Redis's expiry of
// it, to the microsecond: a grant's reply, a renewal's, and a grant
// announced to a waiter. Each is off by a random part of Redis's
// millisecond, so a deadline that forgets the rounding shows within a few
// of the many tries.
func TestLeaseDeadlineBeforeRedisExpiry(t *testing.T) {
	b := redistest.RealBackend(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	rdb := b.Client(t)
	newClient := func() *Client {
		c, err := New(b.Client(t), WithPrefix(prefix), WithLeaseTTL(time.Minute), WithWaiterTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	a, w := newClient(), newClient()
	req := Request{Name: "tick", Capacity: 1, Permits: 1}
	k, err := a.keys(req.Name)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, l *Lease) {
		t.Helper()
		zs, err := statecheck.Holders(ctx, rdb, k.Base)
		if err != nil || len(zs) != 1 {
			t.Fatalf("%s: holders %v (%v), want one", what, zs, err)
		}
		expiry := int64(zs[0].Score) * 1000 // µs, Redis's clock
		if got := l.expiresBy().UnixMicro(); got >= expiry {
			t.Fatalf("%s: the lease's deadline is %dµs after Redis's expiry of it", what, got-expiry)
		}
	}
	for range 100 {
		held, err := a.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		check("a grant", held)
		held.renew()
		check("a renewal", held)
		got := make(chan *Lease, 1)
		go func() {
			l, err := w.Acquire(ctx, req)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitFor(t, func() bool {
			st, err := a.Status(ctx, req.Name)
			return err == nil && st.Queued == 1
		})
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if l == nil {
			return
		}
		check("an announced grant", l)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Leases age by Redis's clock (docs/reliability.md): when it steps forward
// past a grant's expiry, the holder's Release reports the lease lost,
// though its own deadline has not come, and the next caller is granted.
func TestRedisClockStepEndsLeasesEarly(t *testing.T) {
	m := miniredis.RunT(t)
	ctx := context.Background()
	newClient := func() *Client {
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		c, err := New(rdb, WithLeaseTTL(time.Minute), WithWaiterTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	a, b, late := newClient(), newClient(), newClient()
	req := Request{Name: "step", Capacity: 1, Permits: 1}
	first, err := a.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lease, 1)
	go func() {
		l, err := b.Acquire(ctx, req)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitQueued(t, a, req.Name, 1)
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var l *Lease // announced: it lasts the waiter TTL until confirmed
	select {
	case l = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not granted")
	}
	if l == nil {
		t.FailNow()
	}
	m.SetTime(time.Now().Add(15 * time.Second))
	if err := l.Err(); err != nil {
		t.Fatalf("by this process's clock the lease lives: Err = %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Release after Redis's clock stepped past the grant: %v, want ErrLeaseLost", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if l2, err := late.Acquire(tctx, req); err != nil {
		t.Errorf("the next caller: %v", err)
	} else {
		_ = l2.Release(ctx)
	}
}
