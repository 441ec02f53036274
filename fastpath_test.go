package fairlock

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A release whose queue's head has died (its deadline passed, and no
// script has dropped it yet: no refresh ran) hands the permits to the live
// waiter behind it, in the same script: the fast path leaves such a
// release to the general one, which drops dead waiters first. It can tell
// only if the queue's deadline bound was lowered when the short-lived
// waiter joined behind a long-lived one.
func TestReleaseSkipsDeadHead(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		c, rdb, p := scriptClient(t, b, "dh")
		k := p.first().k
		acquire := func(ticket, client string, waitMs int64) []any {
			t.Helper()
			res, err := runTest(ctx, c.calls.Scripts.Named("acquire"), rdb, p.keys, "acquire", ticket, client, 10000, waitMs, "", 1, 1).Slice()
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		held := acquire("HOLDER", "cli", 10000)
		if held[0] != int64(ops.AcqGranted) {
			t.Fatalf("holder: %v", held)
		}
		// Behind a long-lived first waiter (so the queue's deadline bound
		// is set by it), the short-lived one must lower the bound.
		if res := acquire("FIRST", "first", 60000); res[0] != int64(ops.AcqQueued) {
			t.Fatalf("first waiter: %v", res)
		}
		if res := acquire("DEAD", "dead", 100); res[0] != int64(ops.AcqQueued) {
			t.Fatalf("dead waiter: %v", res)
		}
		if res := acquire("LIVE", "live", 60000); res[0] != int64(ops.AcqQueued) {
			t.Fatalf("live waiter: %v", res)
		}
		// The first waiter leaves, so the dying one heads the queue.
		res, err := runTest(ctx, c.calls.Scripts.Named("release"), rdb, p.keys, "leave", "FIRST", "first", 10000, 60000, "", "1", 1, 0).Slice()
		if err != nil || res[0] != int64(1) {
			t.Fatalf("leave: %v, %v", res, err)
		}
		time.Sleep(300 * time.Millisecond) // the first waiter's deadline passes
		res, err = runTest(ctx, c.calls.Scripts.Named("release"), rdb, p.keys, "release", "HOLDER", "cli", 10000, 10000, "", "0", 1, held[3]).Slice()
		if err != nil || res[0] != int64(1) {
			t.Fatalf("release: %v, %v", res, err)
		}
		dead, err := rdb.LRange(ctx, k.Wake("dead"), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		live, err := rdb.LRange(ctx, k.Wake("live"), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(dead) != 0 || len(live) != 1 {
			t.Fatalf("after the release, the dead waiter's wake list holds %q and the live one's %q: want the grant on the live one's", dead, live)
		}
	})
}

// A waiter whose deadline has passed is dead, whether or not a script has
// dropped it yet: its own refresh, arriving late, reports it gone and
// drops it, rather than bringing it back.
func TestRefreshDoesNotReviveDeadWaiter(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		c, rdb, p := scriptClient(t, b, "rv")
		k := p.first().k
		for _, w := range []struct {
			ticket string
			waitMs int64
			code   int64
		}{{"HOLDER", 10000, ops.AcqGranted}, {"LATE", 100, ops.AcqQueued}} {
			res, err := runTest(ctx, c.calls.Scripts.Named("acquire"), rdb, p.keys, "acquire", w.ticket, "cli", 10000, w.waitMs, "", 1, 1).Slice()
			if err != nil || res[0] != w.code {
				t.Fatalf("acquire %s: %v, %v", w.ticket, res, err)
			}
		}
		time.Sleep(300 * time.Millisecond) // the waiter's deadline passes; no script runs
		res, err := runTest(ctx, c.calls.Scripts.Named("refresh"), rdb, p.keys, "refresh", "cli", 10000, 100, "LATE", 1, "").Slice()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := res[1].([]any); len(got) != 2 || got[0] != "LATE" || got[1] != "0" {
			t.Fatalf("refresh of a dead waiter reported %v, want it gone (LATE 0)", res[1])
		}
		if n, err := rdb.ZCard(ctx, k.List()[1]).Result(); err != nil || n != 0 {
			t.Fatalf("queue holds %d after the refresh (%v), want the dead waiter dropped", n, err)
		}
	})
}

// scriptClient returns a client whose scripts a test calls directly, its
// Redis, and the plan of a mutex name.
func scriptClient(t *testing.T, b *redistest.Backend, name string) (*Client, *redis.Client, plan) {
	t.Helper()
	rdb := b.Client(t)
	c, err := New(rdb, WithPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	p, err := c.plan([]Request{{Name: name, Capacity: 1, Permits: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return c, rdb, p
}
