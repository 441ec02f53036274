package fairlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// Many goroutines of one client, batching, over a few names: every
// acquisition holds its name alone, and calls went in batches.
func TestBatchedCallsHoldAlone(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rdb := b.Client(t)
		c, err := New(rdb, WithPrefix(redistest.Prefix(t)), WithBatching(16))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const names, workers, rounds = 8, 32, 40
		var held [names]atomic.Int32
		var overlaps atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Go(func() {
				for r := range rounds {
					k := (w + r) % names
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					l, err := c.Acquire(ctx, Request{Name: fmt.Sprint("n", k), Capacity: 1, Permits: 1})
					if err != nil {
						cancel()
						errs <- err
						return
					}
					if held[k].Add(1) != 1 {
						overlaps.Add(1)
					}
					held[k].Add(-1)
					err = l.Release(ctx)
					cancel()
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if n := overlaps.Load(); n > 0 {
			t.Fatalf("%d acquisitions overlapped another holder", n)
		}
		bt := c.calls.batch
		t.Logf("%d batches, %d calls in them", bt.sent.Load(), bt.sentCalls.Load())
		if bt.sent.Load() == 0 {
			t.Fatal("no batch was sent")
		}
	})
}

// The batch differential: call-machine histories (acquisitions, releases,
// renewals, withdrawals, their resends, condition waits and the rest, on
// a clock that moves) are replayed twice from an empty database: each
// call alone, and with consecutive calls of one batched entry at one
// clock sent as one batch (cut at random places), some batches sent
// twice (and their calls, alone, twice too). Every call's reply and the
// database after every batch must be equal.
func TestBatchesMatchCallsOneByOne(t *testing.T) {
	for _, real := range []bool{false, true} {
		name := "miniredis"
		if real {
			name = "redis"
		}
		t.Run(name, func(t *testing.T) {
			if !real && redistest.RealOnly() {
				t.Skip("FAIRLOCK_REAL_ONLY")
			}
			setFlag(t, "rapid.checks", "100")
			if testing.Short() {
				setFlag(t, "rapid.checks", "25")
			}
			diffBatches(t, t, real, nil)
		})
	}
}

// The batch differential catches a batch form that breaks its rule (each
// call runs, and is answered, as it would be alone).
func TestBatchDifferentialCatchesBrokenBatches(t *testing.T) {
	redistest.Long(t)
	for _, tc := range []struct{ name, old, new string }{
		{"a batch runs every call on the first call's keys", "ck[j] = K[ki]", "ck[j] = K[j]"},
		{"a batch answers every call with its last call's reply", "  return out\nend", "  for c = 1, n do out[c] = out[n] end\n  return out\nend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(source("lua/batch.lua"), tc.old) {
				t.Fatalf("lua/batch.lua no longer contains %q", tc.old)
			}
			setFlag(t, "rapid.checks", "200")
			setFlag(t, "rapid.nofailfile", "true")
			setFlag(t, "rapid.shrinktime", "4s")
			rec := &recorder{name: t.Name()}
			diffBatches(t, rec, false, mutate("lua/batch.lua", tc.old, tc.new))
			if !rec.failed {
				t.Fatalf("the batch differential did not catch %s", tc.name)
			}
			t.Logf("caught %s; shrunk counterexample:\n%s", tc.name, rec.report())
		})
	}
}

// diffBatches runs the batch differential (see TestBatchesMatchCallsOneByOne)
// on miniredis or the real server, every script passed through inner (a
// mutation, or nil), reporting failures to tb.
func diffBatches(t *testing.T, tb rapid.TB, real bool, inner func(string) string) {
	ctx := context.Background()
	p := newReplayPair(t, real, nil) // the machine's own sides, which draw the history
	addr := p.Fast.RDB.Options().Addr
	transform := differential.Replayed(inner)
	alone := newReplayer(t, "each call alone", addr, 12, transform)
	together := newReplayer(t, "batched", addr, 13, transform)
	alone.Debug, together.Debug = p.Fast.Debug, p.Fast.Debug
	set := newScripts(transform)
	var calls, batched, batches, resent int
	rapid.Check(tb, func(rt *rapid.T) {
		var m *callMachine
		runCallMachine(rt, p, func(cm *callMachine) { m = cm })
		for _, r := range []*replayer{alone, together} {
			if err := r.RDB.FlushDB(ctx).Err(); err != nil {
				rt.Fatal(err)
			}
		}
		history := m.sent
		calls += len(history)
		for i := 0; i < len(history); {
			group := batchGroupAt(history, i, rapid.IntRange(1, 8).Draw(rt, "batch size"))
			if len(group) > 1 {
				batched += len(group)
				batches++
			}
			if err := stepBatch(ctx, set, alone, together, group, i); err != nil {
				rt.Fatal(err)
			}
			// A batch sent again, as a client resends a call whose reply
			// it lost, acts as its calls sent again one by one.
			if len(group) > 1 && rapid.IntRange(0, 5).Draw(rt, "resend") == 0 {
				resent++
				if err := stepBatch(ctx, set, alone, together, group, i); err != nil {
					rt.Fatal(fmt.Errorf("the batch sent again: %w", err))
				}
			}
			i += len(group)
		}
	})
	t.Logf("%d calls, %d of them in %d batches, %d batches sent again", calls, batched, batches, resent)
	if calls > 0 && batches == 0 {
		t.Fatal("no history had two calls to batch")
	}
}

// batchGroupAt returns the calls from history[i] that go as one batch: up
// to most consecutive calls of one batched entry at one clock (one call
// when history[i]'s entry is not batched).
func batchGroupAt(history []call, i, most int) []call {
	first := opNamed(history[i].Op())
	j := i + 1
	if first != nil && entries[first.entry].batch {
		for j < len(history) && j-i < most {
			o := opNamed(history[j].Op())
			if o == nil || o.entry != first.entry || history[j].NowMs() != history[i].NowMs() ||
				history[j].Time[1] != history[i].Time[1] || history[j].Time[0] != history[i].Time[0] {
				break
			}
			j++
		}
	}
	return history[i:j]
}

// stepBatch runs group (calls from the step'th of a history on) on alone,
// call by call, and on together as one batch (if it has more than one
// call), and compares their replies and databases.
func stepBatch(ctx context.Context, set *scripts, alone, together *replayer, group []call, step int) error {
	replies := make([]string, len(group))
	for i, c := range group {
		if err := alone.Prepare(ctx, c); err != nil {
			return err
		}
		out, err := alone.Run(ctx, c)
		replies[i] = renderBatched(out, err)
	}
	if err := together.Prepare(ctx, group[0]); err != nil {
		return err
	}
	var got []string
	if len(group) == 1 {
		out, err := together.Run(ctx, group[0])
		got = []string{renderBatched(out, err)}
	} else {
		o := opNamed(group[0].Op())
		var keys, args []string
		args = append(args, strconv.Itoa(len(group)))
		for _, c := range group {
			keys = append(keys, c.Keys...)
			args = append(args, strconv.Itoa(len(c.Keys)), strconv.Itoa(len(c.Args)))
		}
		for _, c := range group {
			args = append(args, c.Args...)
		}
		r := set.forOp(o).batch.eval.run(evalSender(ctx, together.RDB), keys, args)
		for i := range group {
			one := batchResult(r, i, len(group))
			got = append(got, renderBatched(one.val, one.err))
		}
	}
	before, _ := alone.Dump(ctx, "")
	for i, c := range group {
		if got[i] != replies[i] {
			return fmt.Errorf("step %d: %s\nreplies differ:\n  alone:   %s\n  batched: %s\nbefore the batch of %d:\n%s", step+i+1, c, replies[i], got[i], len(group), before)
		}
	}
	a, err := alone.Dump(ctx, "digest")
	if err != nil {
		return err
	}
	b, err := together.Dump(ctx, "digest")
	if err != nil {
		return err
	}
	if a != b {
		da, _ := alone.Dump(ctx, "")
		db, _ := together.Dump(ctx, "")
		return fmt.Errorf("steps %d to %d (%s ...): the databases differ (alone -, batched +):\n%s", step+1, step+len(group), group[0], lineDiff(da, db))
	}
	return nil
}

// renderBatched renders a reply for the batch differential: an error by
// the engine's words only (from FAIRLOCK_ on, without what Redis adds to
// an error a script raised).
func renderBatched(out any, err error) string {
	if err == nil {
		return fmt.Sprintf("%#v", out)
	}
	msg := err.Error()
	if i := strings.Index(msg, "FAIRLOCK_"); i >= 0 {
		msg = msg[i:]
	}
	msg, _, _ = strings.Cut(msg, " script:")
	return fmt.Sprintf("%#v (error %s)", out, msg)
}

// evalSender returns a send function (script.run's) that sends a script
// command through go-redis's Do on rdb.
func evalSender(ctx context.Context, rdb *redis.Client) func(Script) result {
	return func(sc Script) result {
		cmd := "EVALSHA"
		if sc.Command == Eval {
			cmd = "EVAL"
		}
		args := []any{cmd, sc.Name, len(sc.Keys)}
		for _, k := range sc.Keys {
			args = append(args, k)
		}
		for _, a := range sc.Args {
			args = append(args, a)
		}
		v, err := rdb.Do(ctx, args...).Result()
		if errors.Is(err, redis.Nil) {
			v, err = nil, nil
		}
		return result{v, fromClient(err)}
	}
}
