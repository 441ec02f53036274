package statecheck

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The lost condition waiter rule (a dead waiter whose condition's key
// expired counts in nc by its deadline in :d) is meant for a key that is
// gone. Here the key of the condition its mark names ("ready") lives, with
// another waiter in it; the dead waiter's member is missing from it while
// its mark, its deadline in :d and its count in nc stay: a waiter taken
// out of its condition without cond_unlink (a ZREM that forgot the count
// and the mark), which the engine never leaves. Check must refuse it: a
// condition's key leaves its waiters only by cond_unlink, and a key that
// lives is no key that expired. It accepts it.
func TestAdvLostWaiterRuleHidesDriftWhenKeyLives(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		rdb := b.Client(t)
		prefix := redistest.Prefix(t)
		base := prefix + "{x}"
		for _, ticket := range []string{"T1", "T2"} {
			if err := waitOn(ctx, rdb, base, "ready", ticket, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		m := "T1 1 client lease 1000"
		// T1 dead (its deadline passed, not yet dropped), and out of its
		// condition's key, which lives on with T2.
		if err := rdb.ZAdd(ctx, base+":d", redis.Z{Score: float64(now.Add(-time.Second).UnixMilli()), Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZRem(ctx, base+condMark+"ready", m).Err(); err != nil {
			t.Fatal(err)
		}
		err = Check(ctx, rdb, State{Prefix: prefix, Bases: []string{base}})
		t.Logf("Check = %v", err)
		if err == nil {
			t.Fatalf("Check accepts a dead condition waiter missing from its condition's key while that key lives (nc 2, 1 in the key)")
		}
	})
}
