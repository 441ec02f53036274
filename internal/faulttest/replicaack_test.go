package faulttest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/latch"
	"github.com/fairlock/fairlock/multilock"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// fakeAcks answers every WAIT of its client's pipelines with one replica
// while on is set: on a master with no replica, the calls made then are
// acknowledged, and the calls made with it unset are not.
type fakeAcks struct{ on atomic.Bool }

func (*fakeAcks) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*fakeAcks) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f *fakeAcks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if !f.on.Load() {
			return err
		}
		for _, c := range cmds {
			if w, ok := c.(*redis.IntCmd); ok && c.Name() == "wait" {
				w.SetVal(1)
				w.SetErr(nil)
			}
		}
		return err
	}
}

// With WithReplicaAck, a call that changes Redis's state and whose change
// the replicas do not acknowledge must say so (ErrNotReplicated), whichever
// path it takes through its script (a grant, a wait, a release, a wait on
// a condition, a signal that wakes a waiter, a count down that opens the
// latch, an arrival that waits and one that completes its round, a term
// recorded and one resigned), rather than report a success a failover
// could undo. The server has no replica: each row's setup runs with the
// acknowledgements faked, the call under test without.
func TestEveryChangeAwaitsReplicas(t *testing.T) {
	b := redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	prefix := redistest.Prefix(t)
	rdb := redis.NewClient(&redis.Options{Addr: b.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	acks := &fakeAcks{}
	rdb.AddHook(acks)
	c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithReplicaAck(1, 50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// plain waits on conditions for the signal rows.
	prdb := redis.NewClient(&redis.Options{Addr: b.Addr})
	t.Cleanup(func() { _ = prdb.Close() })
	plain, err := fairlock.New(prdb, fairlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })

	mutex := func(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }
	lease := func(l *fairlock.Lease, err error) error {
		if l != nil {
			_ = l.Release(context.Background())
		}
		return err
	}
	// condOf returns client cl's mutex name and its condition "c".
	condOf := func(t *testing.T, cl *fairlock.Client, name string) (*semaphore.Mutex, *semaphore.Cond) {
		m, err := semaphore.NewMutex(cl, name)
		if err != nil {
			t.Fatal(err)
		}
		cv, err := semaphore.NewNamedCond(m, "c")
		if err != nil {
			t.Fatal(err)
		}
		return m, cv
	}
	// condWaiter makes a plain client's waiter wait on mutex name's
	// condition, and returns when it waits.
	condWaiter := func(t *testing.T, ctx context.Context, name string) {
		m, cv := condOf(t, plain, name)
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = lease(cv.Wait(ctx, l)) }()
		for {
			st, err := plain.Status(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if st.Held == 0 { // released by the wait: it waits
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	for _, tc := range []struct {
		what string
		// setup runs with the acknowledgements faked, and returns the call
		// under test.
		setup func(t *testing.T, ctx context.Context) func() error
	}{
		{"Acquire", func(t *testing.T, ctx context.Context) func() error {
			return func() error { return lease(c.Acquire(ctx, mutex("acq"))) }
		}},
		{"TryAcquire", func(t *testing.T, ctx context.Context) func() error {
			return func() error { return lease(c.TryAcquire(ctx, mutex("try"))) }
		}},
		{"multilock.Lock", func(t *testing.T, ctx context.Context) func() error {
			return func() error { return lease(multilock.Lock(ctx, c, "ml.a", "ml.b")) }
		}},
		{"RWMutex.RLock", func(t *testing.T, ctx context.Context) func() error {
			rw, err := semaphore.NewRWMutex(c, "rw")
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return lease(rw.RLock(ctx)) }
		}},
		{"Release", func(t *testing.T, ctx context.Context) func() error {
			l, err := c.Acquire(ctx, mutex("rel"))
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return l.Release(ctx) }
		}},
		{"Cond.Wait", func(t *testing.T, ctx context.Context) func() error {
			m, cv := condOf(t, c, "cw")
			l, err := m.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return func() error {
				wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				return lease(cv.Wait(wctx, l))
			}
		}},
		{"Cond.Signal that wakes a waiter", func(t *testing.T, ctx context.Context) func() error {
			condWaiter(t, ctx, "cs")
			_, cv := condOf(t, c, "cs")
			return func() error { _, err := cv.Signal(ctx); return err }
		}},
		{"Cond.Broadcast that wakes a waiter", func(t *testing.T, ctx context.Context) func() error {
			condWaiter(t, ctx, "cb")
			_, cv := condOf(t, c, "cb")
			return func() error { _, err := cv.Broadcast(ctx); return err }
		}},
		{"latch CountDown, the count stays above 0", func(t *testing.T, ctx context.Context) func() error {
			l, err := latch.New(c, "down2", 2)
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return l.CountDown(ctx) }
		}},
		{"latch CountDown that opens the latch", func(t *testing.T, ctx context.Context) func() error {
			l, err := latch.New(c, "down1", 1)
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return l.CountDown(ctx) }
		}},
		{"latch Wait that waits", func(t *testing.T, ctx context.Context) func() error {
			l, err := latch.New(c, "wait", 1)
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return l.Wait(ctx) }
		}},
		{"barrier Await that waits", func(t *testing.T, ctx context.Context) func() error {
			br, err := barrier.New(c, "wait", 2)
			if err != nil {
				t.Fatal(err)
			}
			return func() error { _, err := br.Await(ctx); return err }
		}},
		{"barrier Await that completes its round", func(t *testing.T, ctx context.Context) func() error {
			br, err := barrier.New(c, "last", 1)
			if err != nil {
				t.Fatal(err)
			}
			return func() error { _, err := br.Await(ctx); return err }
		}},
		{"election Campaign", func(t *testing.T, ctx context.Context) func() error {
			el, err := election.New(c, "el")
			if err != nil {
				t.Fatal(err)
			}
			return func() error {
				l, err := el.Campaign(ctx, "v")
				if l != nil {
					_ = l.Resign(context.Background())
				}
				return err
			}
		}},
		{"election Resign", func(t *testing.T, ctx context.Context) func() error {
			el, err := election.New(c, "resign")
			if err != nil {
				t.Fatal(err)
			}
			l, err := el.Campaign(ctx, "v")
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return l.Resign(ctx) }
		}},
		{"Client.Close releasing a lease", func(t *testing.T, ctx context.Context) func() error {
			cl, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithReplicaAck(1, 50*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cl.Acquire(ctx, mutex("close")); err != nil {
				t.Fatal(err)
			}
			return func() error { return cl.Close() }
		}},
		{"barrier Await whose re-ask breaks its round", func(t *testing.T, ctx context.Context) func() error {
			// A party of a plain client whose process dies (cut off): the
			// waiting party's refresh reports it gone, and its re-ask
			// breaks the round.
			drdb := redis.NewClient(&redis.Options{Addr: b.Addr})
			t.Cleanup(func() { _ = drdb.Close() })
			faults := &redistest.Faults{}
			dc, err := fairlock.New(drdb, fairlock.WithPrefix(prefix), fairlock.WithWaiterTTL(300*time.Millisecond),
				redistest.AddHook[fairlock.Option](drdb, faults))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { faults.Down.Store(false); _ = dc.Close() })
			dead, err := barrier.New(dc, "reask", 3)
			if err != nil {
				t.Fatal(err)
			}
			go func() { _, _ = dead.Await(ctx) }()
			started := make(chan struct{}, 1)
			oc, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithReplicaAck(1, 50*time.Millisecond),
				fairlock.WithObserver(observerFunc(func(e fairlock.Event) {
					if e.Kind == fairlock.WaitStarted {
						started <- struct{}{}
					}
				})))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = oc.Close() })
			br, err := barrier.New(oc, "reask", 3)
			if err != nil {
				t.Fatal(err)
			}
			waitArrived := func(n int) {
				for {
					st, err := br.Status(ctx)
					if err != nil {
						t.Fatal(err)
					}
					if len(st.Arrived) == n {
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			waitArrived(1)
			res := make(chan error, 1)
			go func() { _, err := br.Await(ctx); res <- err }()
			<-started // its arrival acknowledged, it waits
			return func() error {
				faults.Down.Store(true) // the other party's process dies
				err := <-res
				t.Logf("Await: %v", err)
				return err
			}
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			acks.on.Store(true)
			call := tc.setup(t, ctx)
			acks.on.Store(false)
			defer acks.on.Store(true)
			if err := call(); !errors.Is(err, fairlock.ErrNotReplicated) {
				t.Errorf("%s with no replica to acknowledge = %v, want ErrNotReplicated", tc.what, err)
			}
		})
	}
}

type observerFunc func(fairlock.Event)

func (f observerFunc) Observe(e fairlock.Event) { f(e) }
