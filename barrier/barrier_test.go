package barrier_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// env is one test's barriers, seen by several clients (processes).
type env struct {
	*fltest.Env
	t *testing.T
}

func newEnv(t *testing.T, b *redistest.Backend) env { return env{fltest.New(t, b), t} }

func (e env) barrier(c *fairlock.Client, name string, parties int, opts ...barrier.Option) *barrier.Barrier {
	e.t.Helper()
	b, err := barrier.New(c, name, parties, opts...)
	if err != nil {
		e.t.Fatalf("barrier.New(%q, %d): %v", name, parties, err)
	}
	return b
}

// stateKey is the key of barrier name's state; condKey its waiters'.
func (e env) stateKey(name string) string { return e.Prefix + "{" + name + "}\x1fB" }
func (e env) condKey(name string) string  { return e.stateKey(name) + "\x1fc\x1f" }

// barrierKeys are every key a barrier's ops declare.
func (e env) barrierKeys(name string) []string {
	k := e.stateKey(name)
	return []string{k + ":s", k + ":q", k + ":d", k + ":h", k + ":t", e.condKey(name), k}
}

// waiters returns how many parties wait at barrier name in Redis.
func (e env) waiters(name string) int64 {
	e.t.Helper()
	n, err := e.RDB.ZCard(context.Background(), e.condKey(name)).Result()
	if err != nil {
		e.t.Fatalf("ZCARD: %v", err)
	}
	return n
}

func (e env) status(b *barrier.Barrier) barrier.Status {
	e.t.Helper()
	s, err := b.Status(context.Background())
	if err != nil {
		e.t.Fatalf("Status: %v", err)
	}
	return s
}

type result struct {
	a   barrier.Arrival
	err error
}

func awaitAsync(ctx context.Context, b *barrier.Barrier) <-chan result {
	ch := make(chan result, 1)
	go func() {
		a, err := b.Await(ctx)
		ch <- result{a, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10 s", what)
		return result{}
	}
}

func notYet(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s returned (%+v, %v) before its round's last party", what, r.a, r.err)
	case <-time.After(50 * time.Millisecond):
	}
}

// wantBroken checks that err is a broken round's, naming round.
func wantBroken(t *testing.T, err error, round int64, what string) {
	t.Helper()
	var be *barrier.BrokenError
	switch {
	case !errors.Is(err, barrier.ErrBrokenBarrier):
		t.Fatalf("%s = %v, want ErrBrokenBarrier", what, err)
	case !errors.As(err, &be) || be.Round != round:
		t.Fatalf("%s = %v, want round %d named", what, err, round)
	}
}

// Rounds complete only with all their parties, numbered 1, 2, ...; each
// party's index is its place in the round's arrival order (FIFO), which
// Status shows while the round fills.
// Inspect reads a barrier as stored, whatever parties it was made with,
// and changes nothing.
func TestInspect(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		inspect := func() barrier.Status {
			t.Helper()
			st, err := barrier.Inspect(ctx, c, "in")
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			return st
		}
		if st := inspect(); st.Round != 1 || st.Parties != 0 || len(st.Arrived) != 0 || st.Broken {
			t.Fatalf("Inspect of a barrier nobody made = %+v, want round 1, parties 0, nobody", st)
		}
		if keys := e.RDB.Keys(ctx, e.Prefix+"*").Val(); len(keys) != 0 {
			t.Fatalf("Inspect made keys: %q", keys)
		}
		var chs []<-chan result
		for i := range 2 {
			chs = append(chs, awaitAsync(ctx, e.barrier(e.Client(fairlock.WithOwner("p"+strconv.Itoa(i))), "in", 3)))
			e.WaitFor("the arrival", func() bool { return e.waiters("in") == int64(i+1) })
		}
		before := dump(t, e.RDB)
		if st := inspect(); st.Round != 1 || st.Parties != 3 || !slices.Equal(st.Arrived, []string{"p0", "p1"}) || st.Broken {
			t.Fatalf("Inspect of a barrier of 3 with two parties in = %+v, want round 1, parties 3, [p0 p1]", st)
		}
		if after := dump(t, e.RDB); after != before {
			t.Fatalf("Inspect changed Redis:\nbefore %s\nafter  %s", before, after)
		}
		chs = append(chs, awaitAsync(ctx, e.barrier(c, "in", 3)))
		for _, ch := range chs {
			if r := receive(t, ch, "Await"); r.err != nil {
				t.Fatal(r.err)
			}
		}
		if st := inspect(); st.Round != 2 || st.Parties != 3 || len(st.Arrived) != 0 {
			t.Fatalf("Inspect after a round = %+v, want round 2, parties 3, nobody", st)
		}
		if _, err := barrier.Inspect(ctx, nil, "in"); !errors.Is(err, fairlock.ErrInvalidArgument) {
			t.Fatalf("Inspect with a nil client = %v, want ErrInvalidArgument", err)
		}
		if _, err := barrier.Inspect(ctx, c, ""); !errors.Is(err, fairlock.ErrInvalidName) {
			t.Fatalf("Inspect of the name \"\" = %v, want ErrInvalidName", err)
		}
	})
}

func TestRoundsInOrder(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		const parties, rounds = 4, 3
		var bs []*barrier.Barrier
		for i := range parties {
			bs = append(bs, e.barrier(e.Client(fairlock.WithOwner("p"+strconv.Itoa(i))), "order", parties))
		}
		for round := int64(1); round <= rounds; round++ {
			var chs []<-chan result
			for i, br := range bs {
				if s := e.status(br); s.Round != round || len(s.Arrived) != i || s.Broken {
					t.Fatalf("Status() before party %d of round %d = %+v", i, round, s)
				}
				chs = append(chs, awaitAsync(ctx, br))
				if i < parties-1 {
					notYet(t, chs[0], "the first Await")
					e.WaitFor("the arrival", func() bool { return e.waiters("order") == int64(i+1) })
				}
			}
			for i, ch := range chs {
				r := receive(t, ch, "Await")
				if r.err != nil || r.a != (barrier.Arrival{Round: round, Index: i}) {
					t.Fatalf("Await() of party %d in round %d = %+v, %v; want {%d %d}", i, round, r.a, r.err, round, i)
				}
			}
		}
		// Status lists the waiting parties' owners in arrival order.
		var chs []<-chan result
		for i, br := range bs[:parties-1] {
			chs = append(chs, awaitAsync(ctx, br))
			e.WaitFor("the arrival", func() bool { return e.waiters("order") == int64(i+1) })
		}
		if s := e.status(bs[0]); !slices.Equal(s.Arrived, []string{"p0", "p1", "p2"}) {
			t.Fatalf("Status().Arrived = %q, want [p0 p1 p2]", s.Arrived)
		}
		chs = append(chs, awaitAsync(ctx, bs[parties-1]))
		for i, ch := range chs {
			if r := receive(t, ch, "Await"); r.err != nil || r.a != (barrier.Arrival{Round: rounds + 1, Index: i}) {
				t.Fatalf("Await() = %+v, %v; want {%d %d}", r.a, r.err, rounds+1, i)
			}
		}
		st := e.status(bs[0])
		if st.Round != rounds+2 || len(st.Arrived) != 0 || st.Parties != parties {
			t.Fatalf("Status() after %d rounds = %+v", rounds, st)
		}
	})
}

// Many parties across several clients go through many rounds: each
// round's parties all return it, with the indexes 0..parties-1 once each.
func TestManyRounds(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		const clients, parties, rounds = 3, 12, 8
		var bs []*barrier.Barrier
		for range clients {
			bs = append(bs, e.barrier(e.ClientOn(b.Client(t), fairlock.WithWaiterTTL(time.Minute)), "many", parties))
		}
		got := make([][]barrier.Arrival, parties)
		errs := make(chan error, parties)
		var wg sync.WaitGroup
		for p := range parties {
			wg.Go(func() {
				for range rounds {
					a, err := bs[p%clients].Await(ctx)
					if err != nil {
						errs <- err
						return
					}
					got[p] = append(got[p], a)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("Await() = %v", err)
		}
		for r := range rounds {
			var idx []int
			for p := range parties {
				if got[p][r].Round != int64(r+1) {
					t.Fatalf("party %d's round %d came back as round %d", p, r+1, got[p][r].Round)
				}
				idx = append(idx, got[p][r].Index)
			}
			slices.Sort(idx)
			for i, x := range idx {
				if i != x {
					t.Fatalf("round %d's indexes %v, want 0..%d once each", r+1, idx, parties-1)
				}
			}
		}
	})
}

// A party whose context ends breaks its round for every other party
// (ErrBrokenBarrier naming the round); the next round begins clean.
func TestCancelBreaksRound(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		const parties = 4
		// Refreshes a minute apart: the break must be pushed to the
		// parties, not found by their next refresh.
		ttl := fairlock.WithWaiterTTL(time.Minute)
		br := e.barrier(e.Client(ttl), "cancel", parties)
		a := awaitAsync(ctx, br)
		b2 := awaitAsync(ctx, e.barrier(e.Client(ttl), "cancel", parties))
		e.WaitFor("two arrivals", func() bool { return e.waiters("cancel") == 2 })
		cctx, cancel := context.WithCancel(ctx)
		c := awaitAsync(cctx, br)
		e.WaitFor("three arrivals", func() bool { return e.waiters("cancel") == 3 })
		cancel()
		if r := receive(t, c, "the cancelled Await"); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled Await() = %+v, %v; want context.Canceled", r.a, r.err)
		}
		wantBroken(t, receive(t, a, "Await").err, 1, "first party's Await()")
		wantBroken(t, receive(t, b2, "Await").err, 1, "second party's Await()")
		e.WaitFor("the round's end", func() bool { return e.waiters("cancel") == 0 })
		if s := e.status(br); s.Round != 2 || len(s.Arrived) != 0 || s.Broken {
			t.Fatalf("Status() after the break = %+v, want round 2, nobody", s)
		}
		var chs []<-chan result
		for range parties {
			chs = append(chs, awaitAsync(ctx, br))
		}
		for _, ch := range chs {
			if r := receive(t, ch, "Await"); r.err != nil || r.a.Round != 2 {
				t.Fatalf("Await() in the round after the break = %+v, %v; want round 2", r.a, r.err)
			}
		}
	})
}

// A party whose process died (it stops refreshing its waiter) breaks its
// round once its waiter TTL passes: the live party learns it from its
// own refresh, and its re-ask breaks the round; the next is clean.
func TestDeadPartyBreaksRound(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		const ttl = 300 * time.Millisecond
		dc, faults := e.FaultyClient(fairlock.WithWaiterTTL(ttl))
		dead := awaitAsync(ctx, e.barrier(dc, "dead", 3))
		e.WaitFor("the doomed party", func() bool { return e.waiters("dead") == 1 })
		faults.Down.Store(true) // the process dies
		live := e.barrier(e.Client(fairlock.WithWaiterTTL(ttl)), "dead", 3)
		ch := awaitAsync(ctx, live)
		start := time.Now()
		wantBroken(t, receive(t, ch, "the live Await").err, 1, "the live party's Await()")
		t.Logf("broken %v after the live party arrived", time.Since(start))
		if s := e.status(live); s.Round != 2 || len(s.Arrived) != 0 {
			t.Fatalf("Status() after the break = %+v, want round 2, nobody", s)
		}
		faults.Down.Store(false)
		_ = dc.Close()
		<-dead
		var chs []<-chan result
		for range 3 {
			chs = append(chs, awaitAsync(ctx, live))
		}
		for _, ch := range chs {
			if r := receive(t, ch, "Await"); r.err != nil || r.a.Round != 2 {
				t.Fatalf("Await() after the break = %+v, %v; want round 2", r.a, r.err)
			}
		}
	})
}

// A party that arrives after its round lost a party (dead, not yet
// broken) breaks that round and begins the next.
func TestArrivalAfterLossStartsNextRound(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		dc, faults := e.FaultyClient(fairlock.WithWaiterTTL(200 * time.Millisecond))
		dead := awaitAsync(ctx, e.barrier(dc, "late", 2))
		e.WaitFor("the doomed party", func() bool { return e.waiters("late") == 1 })
		faults.Down.Store(true)
		br := e.barrier(e.Client(), "late", 2)
		e.WaitFor("the round to show its loss", func() bool { return e.status(br).Broken })
		first := awaitAsync(ctx, br)
		e.WaitFor("the arrival in round 2", func() bool { s := e.status(br); return s.Round == 2 && len(s.Arrived) == 1 })
		second := awaitAsync(ctx, br)
		for i, ch := range []<-chan result{first, second} {
			if r := receive(t, ch, "Await"); r.err != nil || r.a != (barrier.Arrival{Round: 2, Index: i}) {
				t.Fatalf("Await() = %+v, %v; want {2 %d}", r.a, r.err, i)
			}
		}
		faults.Down.Store(false)
		_ = dc.Close()
		<-dead
	})
}

// doubler runs every call of a barrier op twice and hands the caller the
// second reply: what a resend after a lost reply does.
type doubler struct{ op string }

func (h *doubler) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *doubler) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *doubler) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if redistest.RunsOp(cmd, h.op) {
			_ = next(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}

// An arrival sent twice (as the Redis client resends a command whose
// reply it lost) arrives once: a waiting one, and the one that completes
// its round.
func TestResentAwaitActsOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		rdb := b.Client(t)
		rdb.AddHook(&doubler{op: "barrier_await"})
		twice := e.barrier(e.ClientOn(rdb), "twice", 3)
		for round := int64(1); round <= 2; round++ {
			first := awaitAsync(ctx, twice)
			e.WaitFor("the first arrival", func() bool { return e.waiters("twice") == 1 })
			if s := e.status(twice); len(s.Arrived) != 1 {
				t.Fatalf("Status() after one arrival sent twice = %+v, want one arrival", s)
			}
			second := awaitAsync(ctx, e.barrier(e.Client(), "twice", 3))
			e.WaitFor("the second arrival", func() bool { return e.waiters("twice") == 2 })
			notYet(t, first, "the Await sent twice")
			last := awaitAsync(ctx, twice) // completes the round, sent twice
			for i, ch := range []<-chan result{first, second, last} {
				if r := receive(t, ch, "Await"); r.err != nil || r.a != (barrier.Arrival{Round: round, Index: i}) {
					t.Fatalf("Await() = %+v, %v; want {%d %d}", r.a, r.err, round, i)
				}
			}
			if s := e.status(twice); s.Round != round+1 || len(s.Arrived) != 0 {
				t.Fatalf("Status() after round %d, its last arrival sent twice = %+v, want round %d, nobody", round, s, round+1)
			}
		}
	})
}

// Bad input fails at once; a barrier stored with other parties refuses.
func TestInput(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		for _, tc := range []struct {
			parties int
			opts    []barrier.Option
		}{{0, nil}, {-1, nil}, {barrier.MaxParties + 1, nil}, {2, []barrier.Option{barrier.WithTTL(time.Millisecond)}}, {2, []barrier.Option{barrier.WithTTL(barrier.MaxTTL + 1)}}} {
			if _, err := barrier.New(c, "in", tc.parties, tc.opts...); !errors.Is(err, fairlock.ErrInvalidArgument) {
				t.Errorf("New(%d) = %v, want ErrInvalidArgument", tc.parties, err)
			}
		}
		if _, err := barrier.New(nil, "in", 2); !errors.Is(err, fairlock.ErrInvalidArgument) {
			t.Errorf("New(nil client) = %v, want ErrInvalidArgument", err)
		}
		if _, err := barrier.New(c, "{in}", 2); !errors.Is(err, fairlock.ErrInvalidName) {
			t.Errorf("New(\"{in}\") = %v, want ErrInvalidName", err)
		}
		two := e.barrier(c, "made", 2)
		ch := awaitAsync(ctx, two)
		e.WaitFor("the arrival", func() bool { return e.waiters("made") == 1 })
		three := e.barrier(c, "made", 3)
		if _, err := three.Await(ctx); !errors.Is(err, barrier.ErrPartiesMismatch) {
			t.Errorf("Await() with 3 parties on a barrier of 2 = %v, want ErrPartiesMismatch", err)
		}
		if _, err := three.Status(ctx); !errors.Is(err, barrier.ErrPartiesMismatch) {
			t.Errorf("Status() with 3 parties on a barrier of 2 = %v, want ErrPartiesMismatch", err)
		}
		if _, err := two.Await(ctx); err != nil {
			t.Errorf("Await() = %v", err)
		}
		if r := receive(t, ch, "Await"); r.err != nil {
			t.Errorf("Await() = %v", r.err)
		}
		cc := e.Client()
		closed := e.barrier(cc, "made", 2)
		_ = cc.Close()
		if _, err := closed.Await(ctx); !errors.Is(err, fairlock.ErrClosed) {
			t.Errorf("Await() on a closed client = %v, want ErrClosed", err)
		}
	})
}

// An Await blocked when its client closes returns ErrClosed, and breaks
// its round for the other parties.
func TestAwaitEndsAtClose(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		other := awaitAsync(ctx, e.barrier(e.Client(), "close", 3))
		e.WaitFor("the first arrival", func() bool { return e.waiters("close") == 1 })
		ch := awaitAsync(ctx, e.barrier(c, "close", 3))
		e.WaitFor("the second arrival", func() bool { return e.waiters("close") == 2 })
		if err := c.Close(); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		if r := receive(t, ch, "Await"); !errors.Is(r.err, fairlock.ErrClosed) {
			t.Fatalf("Await() when its client closed = %v, want ErrClosed", r.err)
		}
		wantBroken(t, receive(t, other, "the other Await").err, 1, "the other party's Await()")
	})
}

// Another program's value at a barrier key fails an op that touches it
// with ErrForeignKey naming the key, changing nothing; an op that does
// not touch it leaves it. Keys, by index in barrierKeys: the waiters'
// :s :q :d :h :t, their condition, the state.
func TestForeignKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		for _, tc := range []struct {
			op      string
			waiter  bool // a party waits (parties 2), else nobody (parties 3)
			refuses []int
		}{
			{"status", false, []int{0, 1, 3, 6}},
			{"inspect", false, []int{0, 1, 3, 6}},
			// (Key 2, :d in layouts 1 and 2, is unused.)
			{"await", false, []int{0, 1, 3, 5, 6}},
			{"await", true, []int{0, 1, 3, 4, 5, 6}}, // completes the round (its idle keys deleted)
		} {
			for i, key := range e.barrierKeys("fk") {
				t.Run(fmt.Sprintf("%s, waiter %v, key %d", tc.op, tc.waiter, i), func(t *testing.T) {
					if err := e.RDB.FlushDB(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					parties := 3
					if tc.waiter {
						parties = 2
						wctx, cancel := context.WithCancel(ctx)
						defer cancel()
						awaitAsync(wctx, e.barrier(e.Client(fairlock.WithWaiterTTL(time.Minute)), "fk", parties))
						e.WaitFor("the waiter", func() bool { return e.waiters("fk") == 1 })
					}
					br := e.barrier(c, "fk", parties)
					if err := e.RDB.Set(ctx, key, "foreign", 0).Err(); err != nil {
						t.Fatal(err)
					}
					before := dump(t, e.RDB)
					short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					defer cancel()
					var err error
					switch tc.op {
					case "await":
						_, err = br.Await(short)
					case "status":
						_, err = br.Status(short)
					case "inspect":
						_, err = barrier.Inspect(short, c, "fk")
					}
					refuse := slices.Contains(tc.refuses, i)
					switch {
					case refuse && !errors.Is(err, fairlock.ErrForeignKey):
						t.Fatalf("%s with a string at %q = %v, want ErrForeignKey", tc.op, key, err)
					case refuse && !strings.Contains(err.Error(), strconv.Quote(key)):
						t.Fatalf("%s with a string at %q = %v, which does not name the key", tc.op, key, err)
					case refuse:
						if after := dump(t, e.RDB); after != before {
							t.Fatalf("%s refused, but changed Redis:\nbefore %s\nafter  %s", tc.op, before, after)
						}
					case err != nil && !(tc.op == "await" && errors.Is(err, context.DeadlineExceeded)):
						t.Fatalf("%s with a string at %q (a key it does not touch) = %v, want it done", tc.op, key, err)
					default:
						if typ := e.RDB.Type(ctx, key).Val(); typ != "string" {
							t.Fatalf("%s overwrote the string at %q with a %s", tc.op, key, typ)
						}
					}
				})
			}
		}
	})
}

func dump(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	slices.Sort(keys)
	for _, k := range keys {
		typ, _ := rdb.Type(ctx, k).Result()
		out += fmt.Sprintf("%q:%s ", k, typ)
	}
	return out
}

// A party that does not hear its wake-up (its process's blocking reads
// are held back) learns its round's end from its refresh, which reports
// it gone, and its re-ask, which finds its ticket's record: completed, or
// broken.
func TestLostWakeUpTellsTheOutcome(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		dc, faults := e.FaultyClient(fairlock.WithWaiterTTL(300 * time.Millisecond))
		faults.Deafen(t)
		deaf := e.barrier(dc, "deaf", 2)
		other := e.barrier(e.Client(), "deaf", 2)

		ch := awaitAsync(ctx, deaf)
		e.WaitFor("the deaf party", func() bool { return e.waiters("deaf") == 1 })
		if a, err := other.Await(ctx); err != nil || a != (barrier.Arrival{Round: 1, Index: 1}) {
			t.Fatalf("Await() = %+v, %v; want {1 1}", a, err)
		}
		if r := receive(t, ch, "the deaf Await"); r.err != nil || r.a != (barrier.Arrival{Round: 1, Index: 0}) {
			t.Fatalf("deaf Await() of a completed round = %+v, %v; want {1 0}", r.a, r.err)
		}

		// A round of three, broken by the other party's leave.
		deaf3, other3 := e.barrier(dc, "deaf3", 3), e.barrier(e.Client(), "deaf3", 3)
		ch = awaitAsync(ctx, deaf3)
		e.WaitFor("the deaf party", func() bool { return e.waiters("deaf3") == 1 })
		cctx, cancel := context.WithCancel(ctx)
		oc := awaitAsync(cctx, other3)
		e.WaitFor("the other party", func() bool { return e.waiters("deaf3") == 2 })
		cancel()
		<-oc
		wantBroken(t, receive(t, ch, "the deaf Await").err, 1, "deaf Await() of a broken round")
	})
}
