package semaphore_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// condEnv is one test's mutex "mu" and its default condition, as seen by
// several clients (processes).
type condEnv struct {
	*fltest.Env
	t *testing.T
}

func (e condEnv) mutex(c *fairlock.Client) *semaphore.Mutex {
	e.t.Helper()
	m, err := semaphore.NewMutex(c, "mu")
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

// lock locks m, failing the test on an error.
func (e condEnv) lock(m *semaphore.Mutex) *fairlock.Lease {
	e.t.Helper()
	l, err := m.Lock(context.Background())
	if err != nil {
		e.t.Fatalf("Lock: %v", err)
	}
	return l
}

// waiters returns how many tickets wait on the default condition of "mu".
func (e condEnv) waiters() int64 {
	n, err := e.RDB.ZCard(context.Background(), e.CondKey("mu", "")).Result()
	if err != nil {
		e.t.Fatalf("ZCARD: %v", err)
	}
	return n
}

// deadlineOfOnlyWaiter returns the liveness deadline (ms, by Redis's
// clock) of the one waiter "mu" has, read from its :d.
func (e condEnv) deadlineOfOnlyWaiter() int64 {
	e.t.Helper()
	// Its process's liveness field (statecheck.WaiterDeadline).
	base := strings.TrimSuffix(e.Key("mu", "s"), ":s")
	zs, err := e.RDB.ZRangeWithScores(context.Background(), base+"\x1fc\x1f", 0, -1).Result()
	if err != nil || len(zs) != 1 {
		e.t.Fatalf("waiters of mu's condition: %v, %v; want one", zs, err)
	}
	st, err := e.RDB.HGetAll(context.Background(), e.Key("mu", "s")).Result()
	if err != nil {
		e.t.Fatal(err)
	}
	at, ok := statecheck.WaiterDeadline(st, zs[0].Member.(string), int64(zs[0].Score))
	if !ok {
		e.t.Fatalf("the waiter %q has no liveness field: %v", zs[0].Member, st)
	}
	return at
}

// pastRedisTime waits until Redis's clock is past at (ms).
func (e condEnv) pastRedisTime(at int64) {
	e.t.Helper()
	e.WaitFor("Redis's clock to pass a deadline", func() bool {
		now, err := e.RDB.Time(context.Background()).Result()
		return err == nil && now.UnixMilli() > at+1
	})
}

// startWait locks a fresh client's mutex and waits on its default
// condition in a goroutine, once the condition has want-1 waiters; it
// returns when the waiter is on the condition.
func (e condEnv) startWait(ctx context.Context, want int64, opts ...fairlock.Option) <-chan fltest.Result {
	e.t.Helper()
	m := e.mutex(e.Client(opts...))
	l := e.lock(m)
	cond := semaphore.NewCond(m)
	ch := fltest.Async(func() (*fairlock.Lease, error) { return cond.Wait(ctx, l) })
	e.WaitFor("a waiter on the condition", func() bool { return e.waiters() == want })
	return ch
}

func newCondEnv(t *testing.T, b *redistest.Backend) condEnv {
	return condEnv{fltest.New(t, b), t}
}

// signal signals the default condition of "mu" from a client of its own
// and checks how many it woke.
func (e condEnv) signal(all bool, want int) {
	e.t.Helper()
	cond := semaphore.NewCond(e.mutex(e.Client()))
	var n int
	var err error
	if all {
		n, err = cond.Broadcast(context.Background())
	} else {
		n, err = cond.Signal(context.Background())
	}
	if err != nil || n != want {
		e.t.Fatalf("Signal/Broadcast (all %v) = %d, %v, want %d", all, n, err, want)
	}
}

// Signal wakes waiters one at a time, longest first; each returns holding
// the mutex; a Signal with nobody waiting wakes nobody.
func TestCondSignalOrder(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		var chs []<-chan fltest.Result
		for i := range 3 {
			chs = append(chs, e.startWait(ctx, int64(i+1)))
		}
		for i, ch := range chs {
			e.signal(false, 1)
			l := e.Granted(ch)
			for _, later := range chs[i+1:] {
				e.NotYet(later, "a waiter signalled later")
			}
			e.Release(l)
		}
		e.signal(false, 0)
	})
}

// Broadcast wakes every waiter; they take the mutex in the order they
// began to wait.
func TestCondBroadcast(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		var chs []<-chan fltest.Result
		for i := range 4 {
			chs = append(chs, e.startWait(ctx, int64(i+1)))
		}
		e.signal(true, 4)
		for i, ch := range chs {
			l := e.Granted(ch)
			for _, later := range chs[i+1:] {
				e.NotYet(later, "a waiter that began to wait later")
			}
			e.Release(l)
		}
		e.signal(true, 0)
	})
}

// A signalled waiter queues behind those already queued for the mutex.
func TestCondWokenQueuesBehind(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		waiter := e.startWait(ctx, 1)
		holder := e.lock(e.mutex(e.Client()))
		queued := fltest.Async(func() (*fairlock.Lease, error) { return e.mutex(e.Client()).Lock(ctx) })
		e.WaitQueued("mu", 1)
		e.signal(false, 1)
		e.WaitQueued("mu", 2)
		e.Release(holder)
		l := e.Granted(queued)
		e.NotYet(waiter, "the signalled waiter, queued after a locker")
		e.Release(l)
		e.Release(e.Granted(waiter))
	})
}

// Wait releases and waits in one step: the locker it hands the mutex to
// finds it waiting, so a Signal sent at once is not lost.
func TestCondSignalAfterReleaseNotLost(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		for range 5 {
			m := e.mutex(e.Client())
			l := e.lock(m)
			other := e.mutex(e.Client())
			next := fltest.Async(func() (*fairlock.Lease, error) { return other.Lock(ctx) })
			e.WaitQueued("mu", 1)
			waited := fltest.Async(func() (*fairlock.Lease, error) { return semaphore.NewCond(m).Wait(ctx, l) })
			// The Wait handed the mutex to other: it signals at once.
			ol := e.Granted(next)
			n, err := semaphore.NewCond(other).Signal(ctx)
			if err != nil || n != 1 {
				t.Fatalf("Signal by the next holder = %d, %v, want 1: the waiter was not waiting yet", n, err)
			}
			e.Release(ol)
			e.Release(e.Granted(waited))
		}
	})
}

// A waiter whose context ends leaves the condition at once: nothing of it
// stays, and a Signal finds nobody.
func TestCondWaitCancelled(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		ch := e.startWait(ctx, 1)
		cancel()
		r := e.Receive(ch)
		fltest.IsErr(t, "Wait after cancel", r.Err, context.Canceled)
		if r.Lease != nil {
			t.Fatal("a cancelled Wait returned a lease")
		}
		e.WaitFor("the cancelled waiter to leave", func() bool { return e.waiters() == 0 })
		e.signal(false, 0)
		st, err := e.RDB.HGetAll(context.Background(), e.Key("mu", "s")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if nc, ok := st["nc"]; ok {
			t.Fatalf("state after the waiter left: nc = %q, want none (0) (%v)", nc, st)
		}
		for f, v := range st {
			if len(v) > 0 && v[0] == 'c' {
				t.Fatalf("marker %s = %q left behind", f, v)
			}
		}
		// The mutex is free.
		e.Release(e.lock(e.mutex(e.Client())))
	})
}

// A waiter whose process died is dropped after the waiter TTL; a Signal
// skips it and wakes the next live one.
func TestCondSignalSkipsDead(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		dc, faults := e.FaultyClient(fairlock.WithWaiterTTL(ttl))
		dm := e.mutex(dc)
		dl := e.lock(dm)
		dead := fltest.Async(func() (*fairlock.Lease, error) { return semaphore.NewCond(dm).Wait(ctx, dl) })
		e.WaitFor("the doomed waiter", func() bool { return e.waiters() == 1 })
		faults.Down.Store(true) // the process dies
		deadline := e.deadlineOfOnlyWaiter()
		live := e.startWait(ctx, 2)
		e.pastRedisTime(deadline)
		e.signal(false, 1)
		e.Release(e.Granted(live))
		if e.waiters() != 0 {
			t.Fatalf("%d waiters left, want 0: the dead one was not dropped", e.waiters())
		}
		faults.Down.Store(false)
		_ = dc.Close()
		if r := e.Receive(dead); r.Err == nil {
			t.Fatal("the dead process's Wait succeeded")
		}
	})
}

// Bad input fails clearly.
func TestCondInput(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		m := e.mutex(e.Client())
		if _, err := semaphore.NewNamedCond(m, "a\tb"); err == nil {
			t.Fatal("NewNamedCond with a tab succeeded")
		}
		if _, err := semaphore.NewNamedCond(nil, "x"); err == nil {
			t.Fatal("NewNamedCond(nil) succeeded")
		}
		_, err := semaphore.NewCond(nil).Signal(ctx)
		fltest.IsErr(t, "Signal on a nil mutex", err, fairlock.ErrInvalidArgument)
		other, err := semaphore.NewMutex(e.Client(), "other")
		if err != nil {
			t.Fatal(err)
		}
		l := e.lock(other)
		_, err = semaphore.NewCond(m).Wait(ctx, l)
		fltest.IsErr(t, "Wait with another mutex's lease", err, fairlock.ErrInvalidArgument)
		_, err = semaphore.NewCond(m).Wait(ctx, nil)
		fltest.IsErr(t, "Wait with a nil lease", err, fairlock.ErrInvalidArgument)
		e.Release(l)
		l = e.lock(m)
		e.Release(l)
		_, err = semaphore.NewCond(m).Wait(ctx, l)
		fltest.IsErr(t, "Wait with a released lease", err, fairlock.ErrNotHeld)
	})
}

// A Broadcast to more waiters than one script may wake (its budget, 400)
// wakes them all, over several scripts, and they take the mutex in the
// order they began to wait.
func TestCondBroadcastMany(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		const n = 450
		m := e.mutex(e.Client()) // one process with many waiters
		cond := semaphore.NewCond(m)
		order := make(chan int, n)
		errs := make(chan error, n)
		for i := range n {
			l := e.lock(m)
			go func() {
				l, err := cond.Wait(ctx, l)
				if err == nil {
					order <- i
					err = l.Release(ctx)
				}
				errs <- err
			}()
			e.WaitFor("the waiter on the condition", func() bool { return e.waiters() == int64(i+1) })
		}
		e.signal(true, n)
		for range n {
			if err := <-errs; err != nil {
				t.Fatalf("Wait: %v", err)
			}
		}
		close(order)
		want := 0
		for i := range order {
			if i != want {
				t.Fatalf("waiter %d took the mutex when waiter %d was due", i, want)
			}
			want++
		}
	})
}

// A condition waiter is a user of its mutex: while it waits, the mutex is
// in use, and a caller giving another capacity is refused, as it is while
// the mutex is held or waited for. (Were it not, the caller would take
// the mutex over with its capacity, and the waiter, once signalled, would
// be granted beside it: a mutex held by two live leases.)
func TestCondWaiterKeepsTheCapacity(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		waiting := e.startWait(ctx, 1)
		other := e.Client()
		_, err := other.TryAcquire(ctx, fairlock.Request{Name: "mu", Capacity: 2, Permits: 1})
		fltest.IsErr(t, "TryAcquire with capacity 2 while a waiter waits on the mutex's condition", err, fairlock.ErrCapacityMismatch)
		_, err = other.Acquire(ctx, fairlock.Request{Name: "mu", Capacity: 2, Permits: 1})
		fltest.IsErr(t, "Acquire with capacity 2 while a waiter waits on the mutex's condition", err, fairlock.ErrCapacityMismatch)
		e.signal(false, 1)
		l := e.Granted(waiting)
		st, err := other.Status(ctx, "mu")
		if err != nil {
			t.Fatal(err)
		}
		if st.Held != 1 || st.InUse != 1 || st.Capacity != 1 {
			t.Fatalf("after the signal: %d holders, %d in use, capacity %d; want 1, 1, 1", st.Held, st.InUse, st.Capacity)
		}
		e.Release(l)
	})
}

// A condition waiter whose process died (its waiter TTL passed unrefreshed)
// no longer holds the mutex in use: a caller with another capacity may
// then take it.
func TestCondDeadWaiterFreesTheCapacity(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		dc, faults := e.FaultyClient(fairlock.WithWaiterTTL(ttl))
		dm := e.mutex(dc)
		dl := e.lock(dm)
		dead := fltest.Async(func() (*fairlock.Lease, error) { return semaphore.NewCond(dm).Wait(ctx, dl) })
		e.WaitFor("the doomed waiter", func() bool { return e.waiters() == 1 })
		faults.Down.Store(true) // the process dies
		e.pastRedisTime(e.deadlineOfOnlyWaiter())
		l2, err := e.Client().Acquire(ctx, fairlock.Request{Name: "mu", Capacity: 2, Permits: 2})
		if err != nil {
			t.Fatalf("Acquire with capacity 2 once the only condition waiter is dead: %v", err)
		}
		e.Release(l2)
		faults.Down.Store(false)
		_ = dc.Close()
		<-dead
	})
}

// resendSignals is a go-redis hook that runs every signal script twice,
// as go-redis does when the first reply is lost: the caller gets the
// second run's reply.
type resendSignals struct{}

func (resendSignals) DialHook(next redis.DialHook) redis.DialHook { return next }
func (resendSignals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (resendSignals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if slices.Contains(cmd.Args(), any("signal")) {
			if err := next(ctx, cmd); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// A Signal or Broadcast whose reply is lost is sent again by go-redis; the
// second run finds the first's reply: a Signal wakes one waiter, and a
// Broadcast says how many it woke.
func TestCondResentSignalWakesOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newCondEnv(t, b)
		ctx := context.Background()
		first := e.startWait(ctx, 1)
		second := e.startWait(ctx, 2)
		rdb := b.Client(t)
		resent := redistest.AddHook[fairlock.Option](rdb, resendSignals{})
		cond := semaphore.NewCond(e.mutex(e.ClientOn(rdb, resent)))
		n, err := cond.Signal(ctx)
		if err != nil || n != 1 {
			t.Fatalf("Signal, sent twice = %d, %v; want 1", n, err)
		}
		l := e.Granted(first)
		e.NotYet(second, "the second waiter, after one Signal")
		if got := e.waiters(); got != 1 {
			t.Fatalf("%d waiters left on the condition after one Signal, want 1", got)
		}
		e.Release(l)
		n, err = cond.Broadcast(ctx)
		if err != nil || n != 1 {
			t.Fatalf("Broadcast, sent twice = %d, %v; want 1 (it woke the last waiter)", n, err)
		}
		e.Release(e.Granted(second))
	})
}
