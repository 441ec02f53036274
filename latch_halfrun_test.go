package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/halfrun"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/latch"
	"github.com/redis/go-redis/v9"
)

// A latch's scripts never fail after a write (THE RULE in queue.lua),
// checked by halfrun's transform on every script the test's clients run:
// a latch opened on more waiters than one script's budget, a cancelled
// Wait, a waiter whose process died, and every op with another program's
// value (of a type fairlock does not keep there) at each of its keys.
func TestLatchScriptsNeverHalfRun(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		if !fairlock.HasTestTransform() {
			t.Cleanup(fairlock.SetTestTransform(halfrun.Transform))
		}
		ctx := context.Background()
		rdb := b.Client(t)
		prefix := redistest.Prefix(t)
		halfrun.Check(t, rdb, prefix+"*")
		client := func(opts ...fairlock.Option) *fairlock.Client {
			c, err := fairlock.New(b.Client(t), append([]fairlock.Option{fairlock.WithPrefix(prefix)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		newLatch := func(c *fairlock.Client, name string, n int64) *latch.Latch {
			l, err := latch.New(c, name, n)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		waiters := func(name string) int64 {
			return rdb.ZCard(ctx, prefix+"{"+name+"}\x1fL\x1fc\x1f").Val()
		}
		var doomed []string
		waitFor := func(what string, cond func() bool) {
			t.Helper()
			// (450 waiters registering on miniredis under -race take
			// seconds on a busy machine.)
			for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					all := rdb.ZRangeWithScores(ctx, prefix+"{wide}\x1fL\x1fc\x1f", 0, -1).Val()
					var odd []string
					for _, z := range all {
						if !strings.Contains(z.Member.(string), " 3000") {
							odd = append(odd, fmt.Sprint(z))
						}
					}
					st := rdb.HGetAll(ctx, prefix+"{wide}\x1fL:s").Val()
					var lf []string
					for k, v := range st {
						if strings.HasPrefix(k, "l\x1f") || k == "lmin" {
							lf = append(lf, k+"="+v)
						}
					}
					t.Fatalf("waited 60 s for %s (%d in the key; the doomed one %q; the others not of the live client %v; liveness fields %v)", what, len(all), doomed, odd, lf)
				}
			}
		}

		// More waiters than one script wakes (400), a dead one among them.
		const n = 450
		dead, cancelDead := context.WithCancel(ctx)
		dc := client(fairlock.WithWaiterTTL(100 * time.Millisecond))
		deadDone := make(chan error, 1)
		go func() { deadDone <- newLatch(dc, "wide", 2).Wait(dead) }()
		waitFor("the doomed waiter", func() bool { return waiters("wide") == 1 })
		// (Its 100 ms TTL may pass on a busy machine before the others
		// are in, its refresh then finds it gone and it asks again under
		// a new ticket: they are counted without its process's.)
		doomed = rdb.ZRange(ctx, prefix+"{wide}\x1fL\x1fc\x1f", 0, 0).Val()
		doomedClient := "-"
		if f := strings.Fields(strings.Join(doomed, "")); len(f) == 5 {
			doomedClient = f[2]
		}
		c := client()
		errs := make(chan error, n)
		for range n {
			go func() { errs <- newLatch(c, "wide", 2).Wait(ctx) }()
		}
		waitFor("the waiters", func() bool {
			ms := rdb.ZRange(ctx, prefix+"{wide}\x1fL\x1fc\x1f", 0, -1).Val()
			others := len(ms)
			for _, m := range ms {
				if f := strings.Fields(m); len(f) == 5 && f[2] == doomedClient {
					others--
				}
			}
			return others == n
		})
		_ = dc.Close() // withdraws its waiter: cancelled at the close
		cancelDead()
		<-deadDone
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		if err := newLatch(c, "wide", 2).Wait(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait() past its deadline = %v", err)
		}
		cancel()
		l := newLatch(c, "wide", 2)
		for range 2 {
			if err := l.CountDown(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("Wait() = %v", err)
			}
		}

		// Another program's value at each key of every op.
		base := prefix + "{fk}\x1fL"
		keys := map[string]string{base + ":s": "hash", base + ":q": "zset", base + ":d": "zset", base + ":h": "zset",
			base + ":t": "zset", base + "\x1fc\x1f": "zset", base: "hash"}
		for key, kept := range keys {
			for _, typ := range []string{"string", "list", "hash", "zset"} {
				if typ == kept {
					continue
				}
				for _, withWaiter := range []bool{false, true} {
					rdb.Del(ctx, base+":s", base+":q", base+":d", base+":h", base+":t", base+"\x1fc\x1f", base)
					wctx, wcancel := context.WithCancel(ctx)
					wdone := make(chan error, 1)
					if withWaiter {
						go func() { wdone <- newLatch(c, "fk", 1).Wait(wctx) }()
						waitFor("the waiter", func() bool { return waiters("fk") == 1 })
					} else {
						wdone <- nil
					}
					rdb.Del(ctx, key)
					switch typ {
					case "string":
						rdb.Set(ctx, key, "x", 0)
					case "list":
						rdb.RPush(ctx, key, "x")
					case "hash":
						rdb.HSet(ctx, key, "x", "y")
					case "zset":
						rdb.ZAdd(ctx, key, redisZ("x"))
					}
					fl := newLatch(c, "fk", 1)
					_, _ = fl.Count(ctx)
					_ = fl.CountDown(ctx)
					short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
					_ = fl.Wait(short)
					cancel()
					wcancel()
					<-wdone
				}
			}
		}
	})
}

// redisZ is a sorted set member of score 1.
func redisZ(m string) redis.Z { return redis.Z{Score: 1, Member: m} }
