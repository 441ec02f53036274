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

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// Many goroutines of one client, batching, over a few names: every
// acquisition holds its name alone, and calls went in batches (under the
// package's half-run check, which fails a call that fails after a write).
// Without the test transform, on a server with functions, the batches
// run as functions of the library.
func TestBatchedCallsHoldAlone(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		batchedCycles(t, b, false)
	})
	t.Run("functions", func(t *testing.T) {
		noTransform(t)
		b := redistest.RealBackend(t)
		if !serverHasFunctions(t, b) {
			t.Skip("the server has no functions (before Redis 7.0): batches run by EVAL, as every script there")
		}
		batchedCycles(t, b, true)
	})
}

// serverHasFunctions reports whether b's server has Redis functions
// (FUNCTION, FCALL: Redis 7.0 and later, Valkey).
func serverHasFunctions(t *testing.T, b *redistest.Backend) bool {
	err := b.Client(t).Do(context.Background(), "FUNCTION", "LIST").Err()
	return err == nil
}

// batchedCycles runs concurrent acquire and release cycles of one
// batching client on b; with functions, it checks that every script went
// by FCALL.
func batchedCycles(t *testing.T, b *redistest.Backend, functions bool) {
	rdb := b.Client(t)
	sent, counted := countSent(rdb)
	c, err := New(rdb, WithPrefix(redistest.Prefix(t)), WithBatching(16), counted)
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
	bt := c.calls.Batch
	batches, inBatches := bt.Sent()
	t.Logf("%d batches, %d calls in them", batches, inBatches)
	if batches == 0 {
		t.Fatal("no batch was sent")
	}
	if functions {
		if n := sent.get("eval") + sent.get("evalsha"); n > 0 || sent.get("fcall") == 0 {
			t.Fatalf("%d scripts sent by EVAL or EVALSHA, %d by FCALL; want FCALL only", n, sent.get("fcall"))
		}
	}
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
			if !real && redistest.OffRace(t) {
				// miniredis's Lua is Go code the detector slows fivefold;
				// the batches' Go side runs under it on the real server.
				return
			}
			if real && !serverHasFunctions(t, redistest.RealBackend(t)) {
				// The replays' dump reads each key's expiry by PEXPIRETIME
				// (Redis 7.0), as the fast-path differential's does.
				t.Skip("the server is older than Redis 7.0")
			}
			// (rapid runs a fifth of them with -short: 20 machines,
			// which batch a few dozen times; the guard in diffBatches
			// fails a run that batched nothing.)
			setFlag(t, "rapid.checks", "100")
			diffBatches(t, t, real, nil)
		})
	}
}

// The batch differential catches a batch form that breaks its rule (each
// call runs, and is answered, as it would be alone).
func TestBatchDifferentialCatchesBrokenBatches(t *testing.T) {
	redistest.Long(t)
	if redistest.RealOnly() {
		t.Skip("FAIRLOCK_REAL_ONLY: the catalogue runs on miniredis")
	}
	if redistest.OffRace(t) {
		return
	}
	for _, tc := range []struct{ name, old, new string }{
		{"a batch runs every call on the first call's keys", "ck[j] = K[ki]", "ck[j] = K[j]"},
		{"a batch answers every call with its last call's reply", "  return out\nend", "  for c = 1, n do out[c] = out[n] end\n  return out\nend"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(script.Source("lua/batch.lua"), tc.old) {
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
	set := script.NewSet(transform, nil)
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
	first := script.OpNamed(history[i].Op())
	j := i + 1
	if first != nil && script.Entries[first.EntryIndex].Batch {
		for j < len(history) && j-i < most {
			o := script.OpNamed(history[j].Op())
			if o == nil || o.EntryIndex != first.EntryIndex || history[j].NowMs() != history[i].NowMs() ||
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
func stepBatch(ctx context.Context, set *script.Set, alone, together *replayer, group []call, step int) error {
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
		o := script.OpNamed(group[0].Op())
		var keys, args []string
		args = append(args, strconv.Itoa(len(group)))
		for _, c := range group {
			keys = append(keys, c.Keys...)
			args = append(args, strconv.Itoa(len(c.Keys)), strconv.Itoa(len(c.Args)))
		}
		for _, c := range group {
			args = append(args, c.Args...)
		}
		r := set.ForOp(o).Batch.Eval.Run(evalSender(ctx, together.RDB), keys, args)
		for i := range group {
			one := callpath.BatchResult(r, i, len(group))
			got = append(got, renderBatched(one.Val, one.Err))
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
func evalSender(ctx context.Context, rdb *redis.Client) func(backend.Script) script.Result {
	return func(sc backend.Script) script.Result {
		cmd := "EVALSHA"
		if sc.Command == backend.Eval {
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
		return script.Result{Val: v, Err: fromClient(err)}
	}
}

// gateBackend is a Backend whose first script call of an acquire waits
// until open is closed (or its context ends, when deadlines is set, as a
// client that returns by its context's end does), and that records the
// op and first key of every script call it sends.
type gateBackend struct {
	backend.Backend
	deadlines bool
	open      chan struct{}
	held      atomic.Bool
	mu        sync.Mutex
	sent      []string // "op key"
}

func (g *gateBackend) Info() backend.Info {
	info := g.Backend.Info()
	info.Deadlines = g.deadlines
	return info
}

func (g *gateBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	op := ""
	if n := len(s.Args); n > 0 {
		op = s.Args[0]
	}
	if n := mustAtoi(op); n > 0 {
		// A batch (its first argument counts its calls): record each.
		ki, ai := 0, 1+2*n
		for c := range n {
			nk, na := mustAtoi(s.Args[1+2*c]), mustAtoi(s.Args[2+2*c])
			g.record(s.Args[ai] + " " + s.Keys[ki])
			ki, ai = ki+nk, ai+na
		}
	} else if len(s.Keys) > 0 {
		g.record(op + " " + s.Keys[0])
	}
	if op == "acquire" && g.held.CompareAndSwap(false, true) {
		if g.deadlines {
			select {
			case <-g.open:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		} else {
			<-g.open
		}
	}
	return g.Backend.Script(ctx, s)
}

func (g *gateBackend) record(s string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sent = append(g.sent, s)
}

func (g *gateBackend) sentFor(op, key string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for _, s := range g.sent {
		if s == op+" "+key {
			n++
		}
	}
	return n
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// A call queued behind another that does not return is not sent once its
// context ends, and its caller returns by then: through a client that
// returns by its context's end, and through one that does not (the call
// then runs on a goroutine of the client's).
func TestBatchedCallQueuedPastItsContextIsNotSent(t *testing.T) {
	for _, deadlines := range []bool{true, false} {
		t.Run(fmt.Sprintf("deadlines=%v", deadlines), func(t *testing.T) {
			b := redistest.Mini(t)
			g := &gateBackend{Backend: newGoRedis(b.Client(t)), deadlines: deadlines, open: make(chan struct{})}
			c, err := NewWithBackend(g, WithPrefix("bq:"), WithBatching(8))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			first := make(chan error, 1)
			// (A context that can end: under context.Background() a
			// call through a client that returns by its context's end
			// is sent alone, and holds no group.)
			actx, acancel := context.WithCancel(context.Background())
			defer acancel()
			go func() {
				l, err := c.Acquire(actx, Request{Name: "a", Capacity: 1, Permits: 1})
				if err == nil {
					err = l.Release(context.Background())
				}
				first <- err
			}()
			for !g.held.Load() {
				time.Sleep(time.Millisecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			second := make(chan error, 1)
			go func() {
				_, err := c.Acquire(ctx, Request{Name: "b", Capacity: 1, Permits: 1})
				second <- err
			}()
			select {
			case err := <-second:
				took := time.Since(start)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("the queued Acquire returned %v, want the deadline's error", err)
				}
				// (Slack for a busy machine: the call it queued behind
				// returns only when the test opens it, 2 s or more.)
				if took > 100*time.Millisecond+2*callpath.Grace+500*time.Millisecond {
					t.Errorf("the queued Acquire returned after %v; its deadline was 100ms", took)
				}
			case <-time.After(2 * time.Second):
				t.Errorf("the queued Acquire has not returned 2s after it began; its deadline was 100ms")
			}
			close(g.open)
			if err := <-first; err != nil {
				t.Fatalf("the first Acquire: %v", err)
			}
			keys, _ := c.keys("b")
			// Whatever clean-up runs in the background, the acquisition of
			// b was never sent.
			time.Sleep(50 * time.Millisecond)
			if n := g.sentFor("acquire", keys.All[0]); n > 0 {
				t.Fatalf("the queued acquisition of b was sent %d times after its context ended (%q)", n, g.sent)
			}
		})
	}
}
