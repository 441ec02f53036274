package statecheck

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// waitOn writes, in one transaction, a waiter of the condition cond of
// the semaphore at base as the scripts keep it: its member in the
// condition's key, its deadline in :d, its marker and the count nc in the
// state hash; condTTL is the condition key's TTL.
func waitOn(ctx context.Context, rdb redis.Cmdable, base, cond, ticket string, condTTL time.Duration) error {
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	m := ticket + " 1 client lease 1000"
	tx := rdb.TxPipeline()
	at := now.Add(10 * time.Second).UnixMilli()
	tx.HSet(ctx, base+":s", "layout", Layout, "cap", "1", ticket, "c"+cond, LiveField("client"), fmt.Sprintf("%d 1", at))
	tx.HIncrBy(ctx, base+":s", "nc", 1)
	tx.PExpire(ctx, base+":s", time.Minute)
	tx.ZAdd(ctx, base+condMark+cond, redis.Z{Score: 1, Member: m})
	tx.PExpire(ctx, base+condMark+cond, condTTL)
	_, err = tx.Exec(ctx)
	return err
}

// Check reads every condition variable's key of a base, the named ones
// too: it counts their waiters against the state hash's nc and checks
// that each key lives as long as its waiters.
func TestCheckReadsNamedConditions(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, tc := range []struct {
			name    string
			condTTL time.Duration
			want    string // in Check's error; "" for none
		}{
			{"kept", time.Minute, ""},
			{"expiring before its waiter", 5 * time.Second, "before its latest waiter's deadline"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rdb := b.Client(t)
				prefix := redistest.Prefix(t)
				base := prefix + "{x}"
				if err := waitOn(ctx, rdb, base, "", "T1", time.Minute); err != nil {
					t.Fatal(err)
				}
				if err := waitOn(ctx, rdb, base, "ready", "T2", tc.condTTL); err != nil {
					t.Fatal(err)
				}
				err := Check(ctx, rdb, State{Prefix: prefix, Bases: []string{base}})
				t.Logf("Check = %v", err)
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("Check of a named condition kept as the scripts keep it = %v, want nil", err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("Check = %v, want an error saying %q", err, tc.want)
				}
			})
		}
	})
}

// makeCond is a go-redis hook that, before the first transaction its
// client sends, has a waiter join the named condition "late" (a script
// running between Check's listing of the keys and its transaction).
type makeCond struct {
	rdb  redis.Cmdable
	base string
	done atomic.Bool
}

func (h *makeCond) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *makeCond) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h *makeCond) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "multi" && h.done.CompareAndSwap(false, true) {
			if err := waitOn(ctx, h.rdb, h.base, "late", "T9", time.Minute); err != nil {
				return err
			}
		}
		return next(ctx, cmds)
	}
}

// A condition key made between Check's listing of the keys and its
// transaction is read too: the transaction lists the keys again, and
// Check reads again when they differ (else it would count a waiter in nc
// whose key it did not read).
func TestCheckReadsAConditionMadeMeanwhile(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		rdb := b.Client(t)
		prefix := redistest.Prefix(t)
		base := prefix + "{x}"
		if err := waitOn(ctx, rdb, base, "", "T1", time.Minute); err != nil {
			t.Fatal(err)
		}
		hook := &makeCond{rdb: b.Client(t), base: base}
		rdb.AddHook(hook)
		err := Check(ctx, rdb, State{Prefix: prefix, Bases: []string{base}})
		if !hook.done.Load() {
			t.Fatal("the hook made no condition")
		}
		if err != nil {
			t.Fatalf("Check with a condition made meanwhile = %v, want nil", err)
		}
	})
}

// A condition waiter whose condition's key is gone still counts by its
// mark, as the scripts leave one whose key expired until a refresh, a
// leave or a signal drops it; one whose key still exists must be in it.
func TestCheckLostConditionWaiters(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, tc := range []struct {
			name     string
			deadline time.Duration // from now
			keepKey  bool          // the key lives on, with another waiter
			want     string        // in Check's error; "" for none
		}{
			// (A mark does not name its waiter's process, so a live
			// waiter whose key expired is not told from a dead one.)
			{"key expired", -time.Second, false, ""},
			// (Nor from one whose key was made again since.)
			{"its key made again", -time.Second, true, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rdb := b.Client(t)
				prefix := redistest.Prefix(t)
				base := prefix + "{x}"
				if err := waitOn(ctx, rdb, base, "ready", "T1", time.Minute); err != nil {
					t.Fatal(err)
				}
				m := "T1 1 client lease 1000"
				if tc.keepKey {
					if err := waitOn(ctx, rdb, base, "ready", "T2", time.Minute); err != nil {
						t.Fatal(err)
					}
					if err := rdb.ZRem(ctx, base+condMark+"ready", m).Err(); err != nil {
						t.Fatal(err)
					}
				} else if err := rdb.Del(ctx, base+condMark+"ready").Err(); err != nil {
					t.Fatal(err)
				}
				err := Check(ctx, rdb, State{Prefix: prefix, Bases: []string{base}})
				t.Logf("Check = %v", err)
				switch {
				case tc.want == "" && err != nil:
					t.Fatalf("Check of a waiter whose condition's key expired = %v, want nil", err)
				case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
					t.Fatalf("Check = %v, want an error saying %q", err, tc.want)
				}
			})
		}
	})
}

// Check wants every waiter's process to have its liveness field in the
// state hash: a condition waiter kept as the scripts keep it passes, and
// fails once the field is gone.
func TestCheckWantsTheLivenessField(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		rdb := b.Client(t)
		prefix := redistest.Prefix(t)
		base := prefix + "{x}"
		if err := waitOn(ctx, rdb, base, "", "T1", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := Check(ctx, rdb, State{Prefix: prefix, Bases: []string{base}}); err != nil {
			t.Fatalf("Check of a waiter kept as the scripts keep it = %v, want nil", err)
		}
		if err := rdb.HDel(ctx, base+":s", LiveField("client")).Err(); err != nil {
			t.Fatal(err)
		}
		err := Check(ctx, rdb, State{Prefix: prefix, Bases: []string{base}})
		if err == nil || !strings.Contains(err.Error(), "no liveness field") {
			t.Fatalf("Check of a waiter whose process has no liveness field = %v, want an error saying so", err)
		}
		// A waiter before zq may have lost its field (found dead and
		// deleted): it is dead.
		// (waitOn's waiter joined at sequence 1.)
		if err := rdb.HSet(ctx, base+":s", "zq", 2).Err(); err != nil {
			t.Fatal(err)
		}
		if err := Check(ctx, rdb, State{Prefix: prefix, Bases: []string{base}}); err != nil {
			t.Fatalf("Check of a waiter before zq without a field = %v, want nil (a dead waiter)", err)
		}
	})
}
