package multilock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/multilock"
	"github.com/fairlock/fairlock/semaphore"
)

// The dining philosophers: five philosophers around a table, a fork
// between each two, each eating with both its forks. Every philosopher is
// a separate client (its own connections, its own waiters and renewals).

const philosophers = 5

func fork(i int) string { return fmt.Sprintf("{table}:fork%d", i%philosophers) }

// A strategy takes philosopher i's two forks and returns how to put them
// down.
type strategy func(ctx context.Context, c *fairlock.Client, i int) (release func() error, err error)

// multiLock takes both forks at once.
func multiLock(ctx context.Context, c *fairlock.Client, i int) (func() error, error) {
	l, err := multilock.Lock(ctx, c, fork(i), fork(i+1))
	if err != nil {
		return nil, err
	}
	return func() error { return l.Release(context.Background()) }, nil
}

// naive takes the left fork, then the right one: the textbook deadlock
// once everybody holds a left fork. At the first meal each philosopher,
// holding its left fork, waits (a second at most) until all five hold
// theirs, so the deadlock comes at once rather than by chance; FIFO
// forks otherwise make it rare.
func naive() strategy {
	var seated atomic.Int32
	allSeated := make(chan struct{})
	return func(ctx context.Context, c *fairlock.Client, i int) (func() error, error) {
		left, _ := semaphore.NewMutex(c, fork(i))
		right, _ := semaphore.NewMutex(c, fork(i+1))
		l1, err := left.Lock(ctx)
		if err != nil {
			return nil, err
		}
		if seated.Add(1) == philosophers {
			close(allSeated)
		}
		select {
		case <-allSeated:
		case <-time.After(time.Second):
		}
		l2, err := right.Lock(ctx)
		if err != nil {
			_ = l1.Release(context.Background())
			return nil, err
		}
		return func() error {
			return errors.Join(l2.Release(context.Background()), l1.Release(context.Background()))
		}, nil
	}
}

type diningResult struct {
	meals      [philosophers]int64
	total      int64
	elapsed    time.Duration
	overlaps   int64 // a fork used by two philosophers at once
	deadlocked bool  // no meal for stall while all were hungry
	err        error
}

// dine runs the table until rounds meals were eaten, no meal was eaten for
// stall (a deadlock), or limit passed.
func dine(t *testing.T, e *env, eat strategy, rounds int64, stall, limit time.Duration) diningResult {
	var res diningResult
	var inUse [philosophers]atomic.Int32 // the occupancy check, independent of fairlock
	var meals [philosophers]atomic.Int64
	var total, overlaps atomic.Int64
	var errOnce sync.Once
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	clients := make([]*fairlock.Client, philosophers)
	for i := range clients {
		clients[i] = e.Client()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i := range philosophers {
		wg.Go(func() {
			for ctx.Err() == nil && total.Load() < rounds {
				release, err := eat(ctx, clients[i], i)
				if err != nil {
					if ctx.Err() == nil {
						errOnce.Do(func() { res.err = err })
						cancel()
					}
					return
				}
				for _, f := range []int{i, (i + 1) % philosophers} {
					if inUse[f].Add(1) != 1 {
						overlaps.Add(1)
					}
				}
				meals[i].Add(1)
				total.Add(1)
				for _, f := range []int{i, (i + 1) % philosophers} {
					inUse[f].Add(-1)
				}
				if err := release(); err != nil {
					errOnce.Do(func() { res.err = err })
					cancel()
					return
				}
			}
		})
	}
	// The stall detector: meals must keep coming.
	done := make(chan struct{})
	go func() {
		defer close(done)
		last, since := int64(-1), time.Now()
		for ctx.Err() == nil && total.Load() < rounds {
			time.Sleep(10 * time.Millisecond)
			if n := total.Load(); n != last {
				last, since = n, time.Now()
			} else if time.Since(since) > stall {
				res.deadlocked = true
				cancel()
			}
		}
	}()
	wg.Wait()
	cancel()
	<-done
	res.elapsed = time.Since(start)
	for i := range meals {
		res.meals[i] = meals[i].Load()
	}
	res.total, res.overlaps = total.Load(), overlaps.Load()
	return res
}

// share returns the smallest and largest philosopher's meals as fractions
// of a fair share.
func (r diningResult) share() (lo, hi float64) {
	lo, hi = 1e9, 0
	fair := float64(r.total) / philosophers
	for _, m := range r.meals {
		lo, hi = min(lo, float64(m)/fair), max(hi, float64(m)/fair)
	}
	return lo, hi
}

func TestDiningPhilosophers(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		rounds := int64(5000)
		if !b.Real() {
			rounds = 1000
		}
		r := dine(t, e, multiLock, rounds, 5*time.Second, 2*time.Minute)
		lo, hi := r.share()
		t.Logf("%s: %d rounds in %v (%.0f rounds/s), meals %v, share of fair min %.2f max %.2f",
			b.Name, r.total, r.elapsed.Round(time.Millisecond), float64(r.total)/r.elapsed.Seconds(), r.meals, lo, hi)
		switch {
		case r.err != nil:
			t.Fatalf("a philosopher failed: %v", r.err)
		case r.deadlocked:
			t.Fatalf("multi-lock philosophers deadlocked after %d rounds: %v", r.total, r.meals)
		case r.overlaps > 0:
			t.Fatalf("%d times a fork was held by two philosophers", r.overlaps)
		case r.total < rounds:
			t.Fatalf("only %d of %d rounds before the time limit", r.total, rounds)
		case lo < 0.8 || hi > 1.2:
			t.Fatalf("unfair: meals %v, min %.2f and max %.2f of a fair share (bound 0.8 to 1.2)", r.meals, lo, hi)
		}
	})
}

// The same table, locking one fork after the other in the wrong order,
// deadlocks: the harness above can tell.
func TestDiningPhilosophersNaiveDeadlocks(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		r := dine(t, e, naive(), 1_000_000, time.Second, time.Minute)
		t.Logf("%s: naive table stopped after %d rounds: meals %v, deadlocked %v", b.Name, r.total, r.meals, r.deadlocked)
		if r.err != nil {
			t.Fatalf("a philosopher failed: %v", r.err)
		}
		if !r.deadlocked {
			t.Fatalf("the naive table did not deadlock in %v (%d rounds)", r.elapsed, r.total)
		}
	})
}
