package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAnotherLayoutRefused: a semaphore whose state hash another release
// of fairlock wrote in a key layout of its own (a fleet halfway through an
// upgrade) is refused by every call with ErrIncompatible, naming the key
// and both layouts, and none of its keys changes; a waiter queued and a
// lease held when the layout changes end with that error too, once their
// refreshes and renewals have been refused for their TTL; a semaphore
// beside it works as before. foreign_test.go checks every script op
// against such a hash; this checks what callers see.
func TestAnotherLayoutRefused(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		// The layouts before this one: the first (its state hash names
		// none) and the second.
		for _, prev := range []string{"1", "2"} {
			t.Run("layout "+prev, func(t *testing.T) { anotherLayoutRefused(t, b, prev) })
		}
	})
}

// anotherLayoutRefused is TestAnotherLayoutRefused for a state hash in
// layout prev.
func anotherLayoutRefused(t *testing.T, b *redistest.Backend, prev string) {
	ctx := context.Background()
	rdb := b.Client(t)
	prefix := redistest.Prefix(t)
	c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(5*time.Second), fairlock.WithWaiterTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	mutex := fairlock.Request{Name: "m", Capacity: 1, Permits: 1}
	other := fairlock.Request{Name: "other", Capacity: 1, Permits: 1}
	state := prefix + "{m}:s"

	// A lease held, and a waiter queued behind it, when the layout
	// changes (an operator's restore, say).
	held, err := c.Acquire(ctx, mutex)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		l, err := c.Acquire(wctx, mutex)
		if err == nil {
			_ = l.Release(ctx)
		}
		waited <- err
	}()
	for {
		st, err := c.Status(ctx, "m")
		if err != nil {
			t.Fatal(err)
		}
		if st.Queued == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	var marked error
	if prev == "1" {
		marked = rdb.HDel(ctx, state, "layout").Err() // the first layout names none
	} else {
		marked = rdb.HSet(ctx, state, "layout", prev).Err()
	}
	if marked != nil {
		t.Fatal(marked)
	}
	before := dumpKeys(t, rdb, prefix+"{m}")

	refused := func(what string, err error) {
		t.Helper()
		fltest.IsErr(t, what, err, fairlock.ErrIncompatible)
		fltest.IsErr(t, what, err, fairlock.ErrRedis)
		for _, want := range []string{state, "layout 3", "layout " + prev} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", what, err, want)
			}
		}
	}
	_, err = c.TryAcquire(ctx, mutex)
	refused("TryAcquire", err)
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = c.Acquire(actx, mutex)
	cancel()
	refused("Acquire", err)
	_, err = c.AcquireAll(ctx, other, mutex)
	refused("AcquireAll with the other layout's semaphore second", err)
	_, err = c.Status(ctx, "m")
	refused("Status", err)

	select {
	case err := <-waited:
		refused("the queued waiter's Acquire", err)
	case <-time.After(15 * time.Second):
		t.Fatal("the queued waiter did not return")
	}
	select {
	case <-held.Done():
		fltest.IsErr(t, "the held lease's Err", held.Err(), fairlock.ErrLeaseLost)
		refused("the held lease's Err", held.Err())
	case <-time.After(15 * time.Second):
		t.Fatal("the held lease did not end")
	}
	if err := held.Release(ctx); !errors.Is(err, fairlock.ErrNotHeld) && !errors.Is(err, fairlock.ErrIncompatible) {
		t.Errorf("Release of the ended lease = %v", err)
	}

	// The keys of m are as the other release left them, but for
	// their TTLs, which run down.
	if after := dumpKeys(t, rdb, prefix+"{m}"); !maps.Equal(before, after) {
		t.Errorf("the semaphore's keys changed:\nbefore %v\nafter  %v", before, after)
	}
	l, err := c.Acquire(ctx, other)
	if err != nil {
		t.Fatalf("a semaphore in this release's layout: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// dumpKeys returns each key under base (its type and contents, not its TTL).
func dumpKeys(t *testing.T, rdb *redis.Client, base string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	keys, err := rdb.Keys(ctx, base+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		typ := rdb.Type(ctx, k).Val()
		var v any
		switch typ {
		case "hash":
			v = rdb.HGetAll(ctx, k).Val()
		case "zset":
			v = rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "list":
			v = rdb.LRange(ctx, k, 0, -1).Val()
		default:
			v = rdb.Dump(ctx, k).Val()
		}
		out[k] = typ + " " + fmt.Sprint(v)
	}
	return out
}
