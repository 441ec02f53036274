package latch_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/latch"
	"github.com/fairlock/fairlock/semaphore"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// env is one test's latches, seen by several clients (processes).
type env struct {
	*fltest.Env
	t *testing.T
}

func newEnv(t *testing.T, b *redistest.Backend) env { return env{fltest.New(t, b), t} }

// latch returns the latch name of client c starting at count, failing the
// test on an error.
func (e env) latch(c *fairlock.Client, name string, count int64, opts ...latch.Option) *latch.Latch {
	e.t.Helper()
	l, err := latch.New(c, name, count, opts...)
	if err != nil {
		e.t.Fatalf("latch.New(%q, %d): %v", name, count, err)
	}
	return l
}

// countKey is the key of latch name's count; condKey its waiters'.
func (e env) countKey(name string) string { return e.Prefix + "{" + name + "}\x1fL" }
func (e env) condKey(name string) string  { return e.countKey(name) + "\x1fc\x1f" }

// latchKeys are every key a latch's ops declare.
func (e env) latchKeys(name string) []string {
	k := e.countKey(name)
	return []string{k + ":s", k + ":q", k + ":d", k + ":h", k + ":t", e.condKey(name), k}
}

// waiters returns how many waiters latch name has in Redis.
func (e env) waiters(name string) int64 {
	e.t.Helper()
	n, err := e.RDB.ZCard(context.Background(), e.condKey(name)).Result()
	if err != nil {
		e.t.Fatalf("ZCARD: %v", err)
	}
	return n
}

// count returns l's count, failing the test on an error.
func (e env) count(l *latch.Latch) int64 {
	e.t.Helper()
	n, err := l.Count(context.Background())
	if err != nil {
		e.t.Fatalf("Count: %v", err)
	}
	return n
}

func (e env) countDown(l *latch.Latch) {
	e.t.Helper()
	if err := l.CountDown(context.Background()); err != nil {
		e.t.Fatalf("CountDown: %v", err)
	}
}

// waitAsync runs l.Wait(ctx) in a goroutine; its error arrives on the
// channel.
func waitAsync(ctx context.Context, l *latch.Latch) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- l.Wait(ctx) }()
	return ch
}

// notYet checks that nothing has arrived on ch for a moment.
func notYet(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (%v) before the latch opened", what, err)
	case <-time.After(50 * time.Millisecond):
	}
}

// receive returns what arrives on ch, failing the test after 10 s.
func receive(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return within 10 s", what)
		return nil
	}
}

// CountDown lowers the count, never below zero; Wait blocks until it is
// zero, then returns, and returns at once on an open latch.
func TestCountDownWaitCount(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		l := e.latch(e.Client(), "start", 3)
		if n := e.count(l); n != 3 {
			t.Fatalf("Count() of a latch nobody made = %d, want 3", n)
		}
		w := e.latch(e.Client(), "start", 3)
		ch := waitAsync(ctx, w)
		e.WaitFor("the waiter", func() bool { return e.waiters("start") == 1 })
		for want := int64(2); want >= 1; want-- {
			e.countDown(l)
			if n := e.count(l); n != want {
				t.Fatalf("Count() after a CountDown = %d, want %d", n, want)
			}
			notYet(t, ch, "Wait")
		}
		e.countDown(l)
		if err := receive(t, ch, "Wait"); err != nil {
			t.Fatalf("Wait() = %v once the count reached 0, want nil", err)
		}
		if n := e.waiters("start"); n != 0 {
			t.Fatalf("%d waiters left on an open latch, want 0", n)
		}
		// Never below zero.
		e.countDown(l)
		e.countDown(w)
		if n := e.count(l); n != 0 {
			t.Fatalf("Count() after CountDowns on an open latch = %d, want 0", n)
		}
		// Open: a Wait returns at once.
		bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := w.Wait(bounded); err != nil {
			t.Fatalf("Wait() on an open latch = %v, want nil", err)
		}
		ttl, err := e.RDB.PTTL(ctx, e.countKey("start")).Result()
		if err != nil || ttl <= 0 || ttl > latch.DefaultTTL {
			t.Fatalf("the count's TTL = %v, %v; want in (0, %v]", ttl, err, latch.DefaultTTL)
		}
	})
}

// Inspect reads a latch as stored, whatever count it was made with, and
// changes nothing: nothing before the first call makes it; then its
// count, initial count and waiters.
func TestInspect(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		inspect := func() latch.Status {
			t.Helper()
			st, err := latch.Inspect(ctx, c, "in")
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			return st
		}
		if st := inspect(); st != (latch.Status{}) {
			t.Fatalf("Inspect of a latch nobody made = %+v, want the zero Status", st)
		}
		if keys := e.RDB.Keys(ctx, e.Prefix+"*").Val(); len(keys) != 0 {
			t.Fatalf("Inspect made keys: %q", keys)
		}
		l := e.latch(c, "in", 3)
		e.countDown(l)
		if st, want := inspect(), (latch.Status{Exists: true, Count: 2, Initial: 3}); st != want {
			t.Fatalf("Inspect after a CountDown of 3 = %+v, want %+v", st, want)
		}
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := waitAsync(wctx, e.latch(e.Client(), "in", 3))
		e.WaitFor("the waiter", func() bool { return e.waiters("in") == 1 })
		before := dump(t, e.RDB)
		if st, want := inspect(), (latch.Status{Exists: true, Count: 2, Initial: 3, Waiting: 1}); st != want {
			t.Fatalf("Inspect with a waiter = %+v, want %+v", st, want)
		}
		if after := dump(t, e.RDB); after != before {
			t.Fatalf("Inspect changed Redis:\nbefore %s\nafter  %s", before, after)
		}
		e.countDown(l)
		e.countDown(l)
		if err := receive(t, ch, "Wait"); err != nil {
			t.Fatal(err)
		}
		if st, want := inspect(), (latch.Status{Exists: true, Count: 0, Initial: 3}); st != want {
			t.Fatalf("Inspect of an open latch = %+v, want %+v", st, want)
		}
		if _, err := latch.Inspect(ctx, nil, "in"); !errors.Is(err, fairlock.ErrInvalidArgument) {
			t.Fatalf("Inspect with a nil client = %v, want ErrInvalidArgument", err)
		}
		if _, err := latch.Inspect(ctx, c, ""); !errors.Is(err, fairlock.ErrInvalidName) {
			t.Fatalf("Inspect of the name \"\" = %v, want ErrInvalidName", err)
		}
	})
}

// callCounter is a go-redis hook that counts the calls of a latch op.
type callCounter struct {
	op string
	n  atomic.Int64
}

func (h *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		// (A script refused, as a function miniredis does not know, or
		// one Redis has not seen, is sent again another way: one call.)
		if redistest.RunsOp(cmd, h.op) && err == nil {
			h.n.Add(1)
		}
		return err
	}
}

// Many waiters across several processes are all woken by the CountDown
// that opens the latch, each once: each asked Redis once (none was
// dropped and asked again, as a waiter whose wake-up was lost is, when
// its refresh finds it gone), and none is left on the latch. Their
// waiter TTL is long, so a wake-up that did not come would hold its Wait
// past the test's bound.
func TestManyWaitersWokenOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		const clients = 4
		perClient := 250
		if !b.Real() || redistest.Race {
			perClient = 50 // miniredis interprets Lua, slowly
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		asks := &callCounter{op: "latch_wait"}
		var ls []*latch.Latch
		for range clients {
			rdb := b.Client(t, func(o *redis.Options) { o.PoolSize = 64 })
			rdb.AddHook(asks)
			c := e.ClientOn(rdb, fairlock.WithWaiterTTL(time.Minute))
			ls = append(ls, e.latch(c, "many", 1))
		}
		total := clients * perClient
		var wg sync.WaitGroup
		errs := make(chan error, total)
		for i := range total {
			wg.Go(func() { errs <- ls[i%clients].Wait(ctx) })
		}
		e.WaitFor("every waiter", func() bool { return e.waiters("many") == int64(total) })
		start := time.Now()
		e.countDown(e.latch(e.Client(), "many", 1))
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("Wait() = %v, want nil", err)
			}
		}
		t.Logf("%d waiters in %d processes woken in %v", total, clients, time.Since(start))
		if n := asks.n.Load(); n != int64(total) {
			t.Fatalf("%d latch_wait calls for %d waiters, want one each: some were dropped and asked again", n, total)
		}
		if n := e.waiters("many"); n != 0 {
			t.Fatalf("%d waiters left on the open latch, want 0", n)
		}
	})
}

// doubler is a go-redis hook that runs every call of a latch op twice,
// and hands the caller the second reply: what a resend after a lost reply
// does.
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

// A CountDown sent twice (as the Redis client resends a command whose
// reply it lost) counts once, and the one that opens the latch wakes its
// waiter once.
func TestResentCountDownActsOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		rdb := b.Client(t)
		rdb.AddHook(&doubler{op: "latch_down"})
		l := e.latch(e.ClientOn(rdb), "twice", 3)
		ch := waitAsync(ctx, e.latch(e.Client(), "twice", 3))
		e.WaitFor("the waiter", func() bool { return e.waiters("twice") == 1 })
		for want := int64(2); want >= 0; want-- {
			e.countDown(l)
			if n := e.count(l); n != want {
				t.Fatalf("Count() after a CountDown sent twice = %d, want %d", n, want)
			}
			if want > 0 {
				notYet(t, ch, "Wait")
			}
		}
		if err := receive(t, ch, "Wait"); err != nil {
			t.Fatalf("Wait() = %v, want nil", err)
		}
	})
}

// loseReplies is a go-redis hook that lets the first n calls of a latch op
// run in Redis and then loses their replies, as a connection dropped
// after the command was sent does.
type loseReplies struct {
	op string
	n  atomic.Int64
}

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && redistest.RunsOp(cmd, h.op) && h.n.Add(-1) >= 0 {
			cmd.SetErr(io.ErrUnexpectedEOF)
			return io.ErrUnexpectedEOF
		}
		return err
	}
}

// A CountDown whose reply was lost after Redis ran it is sent again by
// CountDown itself, under the same id: it counts once, and returns nil.
func TestCountDownSentAgainActsOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		rdb := b.Client(t)
		hook := &loseReplies{op: "latch_down"}
		rdb.AddHook(hook)
		l := e.latch(e.ClientOn(rdb), "lost", 5)
		hook.n.Store(2)
		e.countDown(l)
		if n := hook.n.Load(); n > -1 {
			t.Fatalf("%d replies left to lose: CountDown was not sent again", n+1)
		}
		if n := e.count(l); n != 4 {
			t.Fatalf("Count() after a CountDown whose first two replies were lost = %d, want 4", n)
		}
	})
}

// failAfter is a go-redis hook that refuses, before they reach Redis,
// the calls of a latch op once one has been answered.
type failAfter struct {
	op       string
	answered atomic.Bool
}

func (h *failAfter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *failAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *failAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !redistest.RunsOp(cmd, h.op) {
			return next(ctx, cmd)
		}
		if h.answered.Load() {
			err := errors.New("ERR refused by the test")
			cmd.SetErr(err)
			return err
		}
		err := next(ctx, cmd)
		h.answered.Store(err == nil)
		return err
	}
}

// holdOp is a go-redis hook that, while holding is set, keeps every call
// of a script op from Redis until open is closed (or the call's context
// ends).
type holdOp struct {
	op      string
	holding atomic.Bool
	open    chan struct{}
}

func (h *holdOp) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdOp) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdOp) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.holding.Load() && redistest.RunsOp(cmd, h.op) {
			select {
			case <-h.open:
			case <-ctx.Done():
				cmd.SetErr(ctx.Err())
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}

// lateCopies is a go-redis hook that lets the first call of a latch op
// run in Redis and loses its reply, then fails every call of the op
// before it reaches Redis (a connection that does not come back) until
// open is set.
type lateCopies struct {
	op        string
	ran, open atomic.Bool
}

func (h *lateCopies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateCopies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *lateCopies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !redistest.RunsOp(cmd, h.op) || h.open.Load() {
			return next(ctx, cmd)
		}
		if h.ran.Load() {
			cmd.SetErr(io.ErrUnexpectedEOF)
			return io.ErrUnexpectedEOF
		}
		if err := next(ctx, cmd); err != nil {
			return err
		}
		h.ran.Store(true)
		cmd.SetErr(io.ErrUnexpectedEOF)
		return io.ErrUnexpectedEOF
	}
}

// CountDown sends a count down again under its id only while the record
// of its first run lasts (at least 10 s from the run), whatever the
// client's waiter TTL: a copy later than that finds the record trimmed
// and counts again. Here the first run's reply is lost, every send after
// it fails for 9.5 s, and meanwhile (by Redis's clock, moved 25 s on)
// another count down trims the first's record: CountDown must have
// given up, with the error, rather than count twice.
func TestCountDownSendsAgainOnlyWhileItsRecordLasts(t *testing.T) {
	redistest.Long(t) // 9.5 s of real time
	b := redistest.Mini(t)
	e := newEnv(t, b)
	rdb := b.Client(t)
	hook := &lateCopies{op: "latch_down"}
	rdb.AddHook(hook)
	l := e.latch(e.ClientOn(rdb, fairlock.WithWaiterTTL(30*time.Second)), "late", 5)
	other := e.latch(e.Client(), "late", 5)
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- l.CountDown(context.Background()) }()
	e.WaitFor("the first run", hook.ran.Load)
	b.Mini.SetTime(start.Add(25 * time.Second))
	e.countDown(other)
	time.Sleep(time.Until(start.Add(9500 * time.Millisecond)))
	hook.open.Store(true)
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("CountDown did not return")
	}
	if n := e.count(other); n != 3 {
		t.Fatalf("Count() after a CountDown that ran once (its copies failing for 9.5 s) and another = %d, want 3 (CountDown returned %v)", n, err)
	}
	if !errors.Is(err, fairlock.ErrRedis) {
		t.Fatalf("CountDown() = %v, want the error of its last send (matching ErrRedis)", err)
	}
}

// A CountDown that opens the latch but fails before it has woken every
// waiter (more than one script's 400) leaves none waiting for long: each
// waiter's refresh finds the latch open, and it returns.
func TestWaitersOfAnOpenLatchNotLeft(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		const n = 450
		// The default waiter TTL: refreshed every second, the waiters stay
		// alive through their own registration on a slow server (miniredis
		// under -race on a busy machine), and those left learn of the open
		// latch within that second.
		// The waiters' refresh rounds, which find the latch open and report
		// those left gone, are held while the test counts those left: a
		// round queued behind the first script (miniredis runs one at a
		// time) would otherwise empty the key before the count.
		held := &holdOp{op: "refresh", open: make(chan struct{})}
		wrdb := b.Client(t)
		wrdb.AddHook(held)
		w := e.latch(e.ClientOn(wrdb), "left", 1)
		errs := make(chan error, n)
		for range n {
			go func() { errs <- w.Wait(ctx) }()
		}
		e.WaitFor("the waiters", func() bool { return e.waiters("left") == n })
		rdb := b.Client(t)
		rdb.AddHook(&failAfter{op: "latch_down"})
		held.holding.Store(true)
		if err := e.latch(e.ClientOn(rdb), "left", 1).CountDown(ctx); err == nil {
			t.Fatal("CountDown() = nil, want the refused second script's error")
		}
		left := e.waiters("left")
		close(held.open)
		if left == 0 || left == n {
			t.Fatalf("%d waiters left after the first script, want some", left)
		}
		start := time.Now()
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("Wait() = %v, want nil", err)
			}
		}
		t.Logf("the waiters the count down left returned within %v", time.Since(start))
		if left := e.waiters("left"); left != 0 {
			t.Fatalf("%d waiters left, want 0", left)
		}
	})
}

// A Wait whose context ends returns its context's error, and its waiter
// leaves Redis; the latch goes on as before.
func TestWaitCancelled(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		c := e.Client()
		l := e.latch(c, "cancel", 2)
		ctx, cancel := context.WithCancel(context.Background())
		ch := waitAsync(ctx, l)
		e.WaitFor("the waiter", func() bool { return e.waiters("cancel") == 1 })
		cancel()
		if err := receive(t, ch, "Wait"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait() after its context was cancelled = %v, want context.Canceled", err)
		}
		e.WaitFor("the waiter to leave", func() bool { return e.waiters("cancel") == 0 })
		// Its mark in the waiters' state (under its ticket: upper case) is
		// gone too: the ticket's field holds its tombstone ("x"), which
		// a late copy of its Wait finds.
		fields, err := e.RDB.HGetAll(context.Background(), e.countKey("cancel")+":s").Result()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range fields {
			// (A process's liveness field, "l", U+001F and its client,
			// stays until the state goes.)
			if f != strings.ToLower(f) && !strings.HasPrefix(f, "l\x1f") && v != "x" {
				t.Fatalf("the waiters' state holds %q = %q once the waiter left: %v", f, v, fields)
			}
		}
		e.countDown(l)
		if n := e.count(l); n != 1 {
			t.Fatalf("Count() = %d, want 1", n)
		}

		// A deadline, too.
		short, stop := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer stop()
		if err := l.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait() past its deadline = %v, want context.DeadlineExceeded", err)
		}
		e.WaitFor("the waiter to leave", func() bool { return e.waiters("cancel") == 0 })
	})
}

// A Wait blocked when its client closes returns ErrClosed, its waiter
// withdrawn by the close.
func TestWaitEndsAtClose(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		c := e.Client()
		ch := waitAsync(context.Background(), e.latch(c, "close", 1))
		e.WaitFor("the waiter", func() bool { return e.waiters("close") == 1 })
		if err := c.Close(); err != nil {
			t.Fatalf("Close() = %v", err)
		}
		if err := receive(t, ch, "Wait"); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("Wait() when its client closed = %v, want ErrClosed", err)
		}
		if n := e.waiters("close"); n != 0 {
			t.Fatalf("%d waiters left after the close, want 0", n)
		}
	})
}

// A waiter whose process died (cut off from Redis, never withdrawn) is
// dead once its waiter TTL passes: the CountDown that opens the latch
// drops it and wakes the live ones only. (Dead condition waiters have no
// index by deadline in key layout 3: they leave when a script reaches
// them, not before.)
func TestDeadWaiterDropped(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		dc, faults := e.FaultyClient(fairlock.WithWaiterTTL(ttl))
		dead := waitAsync(ctx, e.latch(dc, "dead", 1))
		e.WaitFor("the doomed waiter", func() bool { return e.waiters("dead") == 1 })
		faults.Down.Store(true) // the process dies
		live := waitAsync(ctx, e.latch(e.Client(), "dead", 1))
		e.WaitFor("the live waiter", func() bool { return e.waiters("dead") == 2 })
		time.Sleep(2 * ttl) // the dead one's deadline passes
		e.countDown(e.latch(e.Client(), "dead", 1))
		if err := receive(t, live, "the live Wait"); err != nil {
			t.Fatalf("Wait() = %v, want nil", err)
		}
		if n := e.waiters("dead"); n != 0 {
			t.Fatalf("%d waiters left, want 0", n)
		}
		faults.Down.Store(false)
		_ = dc.Close()
		<-dead // whatever it returns: its process was cut off
	})
}

// Bad input fails at once, matching the documented errors.
func TestInput(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		for _, tc := range []struct {
			name  string
			count int64
			opts  []latch.Option
			want  error
		}{
			{"zero", 0, nil, fairlock.ErrInvalidArgument},
			{"negative", -1, nil, fairlock.ErrInvalidArgument},
			{"huge", latch.MaxCount + 1, nil, fairlock.ErrInvalidArgument},
			{"a}b", 1, nil, fairlock.ErrInvalidName},
			{"", 1, nil, fairlock.ErrInvalidName},
			{"ttl", 1, []latch.Option{latch.WithTTL(time.Millisecond)}, fairlock.ErrInvalidArgument},
			{"ttl", 1, []latch.Option{latch.WithTTL(latch.MaxTTL + 1)}, fairlock.ErrInvalidArgument},
		} {
			if _, err := latch.New(c, tc.name, tc.count, tc.opts...); !errors.Is(err, tc.want) {
				t.Errorf("latch.New(%q, %d) = %v, want %v", tc.name, tc.count, err, tc.want)
			}
		}
		if _, err := latch.New(nil, "x", 1); !errors.Is(err, fairlock.ErrInvalidArgument) {
			t.Errorf("latch.New(nil, ...) = %v, want ErrInvalidArgument", err)
		}
		if _, err := latch.New(c, "max", latch.MaxCount); err != nil {
			t.Errorf("latch.New(%d) = %v, want nil", int64(latch.MaxCount), err)
		}

		// Another count than the stored one: every op refuses, changing
		// nothing.
		three := e.latch(c, "made", 3)
		e.countDown(three)
		four := e.latch(e.Client(), "made", 4)
		if err := four.CountDown(ctx); !errors.Is(err, latch.ErrCountMismatch) {
			t.Errorf("CountDown() with another count = %v, want ErrCountMismatch", err)
		}
		if err := four.Wait(ctx); !errors.Is(err, latch.ErrCountMismatch) {
			t.Errorf("Wait() with another count = %v, want ErrCountMismatch", err)
		}
		if _, err := four.Count(ctx); !errors.Is(err, latch.ErrCountMismatch) {
			t.Errorf("Count() with another count = %v, want ErrCountMismatch", err)
		}
		if n := e.count(three); n != 2 {
			t.Errorf("Count() = %d after refused calls, want 2", n)
		}

		// A closed client.
		cc := e.Client()
		closed := e.latch(cc, "closed", 1)
		_ = cc.Close()
		if err := closed.CountDown(ctx); !errors.Is(err, fairlock.ErrClosed) {
			t.Errorf("CountDown() on a closed client = %v, want ErrClosed", err)
		}
		if err := closed.Wait(ctx); !errors.Is(err, fairlock.ErrClosed) {
			t.Errorf("Wait() on a closed client = %v, want ErrClosed", err)
		}
	})
}

// Another program's value at any of a latch's keys fails every op that
// reads or writes that key with ErrForeignKey, naming the key and
// changing nothing; an op that does not touch it does its work and leaves
// it as it is. Keys, by index in latchKeys: the waiters' :s :q :d :h :t,
// their condition, the count.
func TestForeignKeys(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		for _, tc := range []struct {
			op      string
			waiter  bool  // a waiter waits on the latch (count 1), else nobody (count 2)
			refuses []int // the keys the op must refuse
		}{
			// Every op reads the waiters' state (:s, whose layout it
			// checks), and their :q and :h when :s is missing
			// (lua/resource.lua's rebuild).
			{"count", false, []int{0, 1, 3, 6}},
			{"inspect", false, []int{0, 1, 3, 6}},
			{"count down", false, []int{0, 1, 3, 4, 6}},
			// (Key 2, :d in layouts 1 and 2, is unused.)
			{"wait", false, []int{0, 1, 3, 5, 6}},
			{"count down", true, []int{0, 1, 3, 4, 5, 6}}, // opens the latch
		} {
			for i, key := range e.latchKeys("fk") {
				t.Run(fmt.Sprintf("%s, waiter %v, key %d", tc.op, tc.waiter, i), func(t *testing.T) {
					if err := e.RDB.FlushDB(ctx).Err(); err != nil {
						t.Fatal(err)
					}
					count := int64(2)
					if tc.waiter {
						count = 1
						wctx, cancel := context.WithCancel(ctx)
						wc := e.Client(fairlock.WithWaiterTTL(time.Minute))
						// The waiter withdraws in the background once
						// cancelled, and its withdrawal leaves a
						// tombstone: its client's Close waits for it
						// before the next case flushes Redis.
						defer func() {
							cancel()
							_ = wc.Close()
						}()
						w := e.latch(wc, "fk", count)
						waitAsync(wctx, w)
						e.WaitFor("the waiter", func() bool { return e.waiters("fk") == 1 })
					}
					l := e.latch(c, "fk", count)
					if err := e.RDB.Set(ctx, key, "foreign", 0).Err(); err != nil {
						t.Fatal(err)
					}
					before := dump(t, e.RDB)
					short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					defer cancel()
					var err error
					switch tc.op {
					case "count down":
						err = l.CountDown(short)
					case "wait":
						err = l.Wait(short)
					case "count":
						_, err = l.Count(short)
					case "inspect":
						_, err = latch.Inspect(short, c, "fk")
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
					case err != nil && !(tc.op == "wait" && errors.Is(err, context.DeadlineExceeded)):
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

// dump renders every key of rdb's database with its type and TTL being
// set or not (a test's keys only: each test has its own prefix).
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

// A latch and a semaphore of the same name are two objects: neither
// touches the other's keys.
func TestLatchBesideSemaphore(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		s, err := semaphore.New(c, "both", 1)
		if err != nil {
			t.Fatal(err)
		}
		lease, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		l := e.latch(c, "both", 1)
		ch := waitAsync(ctx, l)
		e.WaitFor("the waiter", func() bool { return e.waiters("both") == 1 })
		e.countDown(l)
		if err := receive(t, ch, "Wait"); err != nil {
			t.Fatalf("Wait() = %v, want nil", err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release() of the semaphore's lease beside the latch = %v, want nil", err)
		}
		if n := e.count(l); n != 0 {
			t.Fatalf("Count() = %d, want 0", n)
		}
	})
}
