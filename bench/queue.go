package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// queueSizes are the queue lengths the queue scenario measures, those up
// to -max-queue.
var queueSizes = []int{10, 100, 1000, 10000, 100000}

// queueWaiterTTL is the waiter TTL of the queue scenario's clients: long,
// so that refreshing 100,000 waiters (in batches of 128 tickets, every
// third of it) stays a small share of Redis's time and the figures are
// the operations', not the refreshes'.
const queueWaiterTTL = time.Minute

// countQueued is an Observer counting the requests that joined a queue.
type countQueued struct{ n atomic.Int64 }

func (c *countQueued) Observe(ev fairlock.Event) {
	if ev.Kind == fairlock.WaitStarted {
		c.n.Add(1)
	}
}

// 7. Queue length: the cost of a refused TryAcquire and of a release that
// grants the next waiter, as the queue grows. fairlock only.
//
// One semaphore of capacity 1 is held; waiters (goroutines of a few
// clients) queue behind the lease until the queue is 10, 100, ... long.
// Then, per sample: an extra client's TryAcquire, refused because the
// queue is not empty; one more waiter joins at the back, so the length
// stays put; the holder releases, which grants the queue's head; the
// woken waiter's lease becomes the held one. The queue grows from one
// size to the next on the same semaphore.
func queueScaling(e *env) ([]*Table, []Target, error) {
	var im impl
	for _, x := range e.impls {
		if !x.peer {
			im = x
		}
	}
	if im.name == "" {
		return nil, nil, nil
	}
	const clients = 4    // processes holding the waiters
	const inFlight = 256 // waiters launched and not yet queued, at most
	const samples = 40   // per size
	const warmup = 5     // samples per size not counted
	const name = "queue"
	limit := 60 * time.Second // to queue one size's waiters, or for one grant
	var sizes []int
	for _, s := range queueSizes {
		if s <= e.cfg.maxQueue {
			sizes = append(sizes, s)
		}
	}
	queued := &countQueued{}
	var rdbs []*redis.Client
	var cs []*fairlock.Client
	defer func() {
		for _, c := range cs {
			_ = c.Close()
		}
		for _, r := range rdbs {
			_ = r.Close()
		}
	}()
	sems := make([]*semaphore.Semaphore, clients+1) // the last is the extra client's
	for i := range sems {
		rdb := redis.NewClient(&redis.Options{Addr: e.addr})
		rdbs = append(rdbs, rdb)
		c, err := fairlock.New(rdb, fairlock.WithPrefix(e.run+im.name+":"), fairlock.WithLeaseTTL(leaseTTL),
			fairlock.WithWaiterTTL(queueWaiterTTL), fairlock.WithObserver(queued))
		if err != nil {
			return nil, nil, err
		}
		cs = append(cs, c)
		if sems[i], err = semaphore.New(c, name, 1); err != nil {
			return nil, nil, err
		}
	}
	extra := sems[clients]

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	granted := make(chan *fairlock.Lease, 1)
	errc := make(chan error, 1)
	launched := int64(0) // waiters started
	taken := int64(0)    // waiters granted, so no longer queued
	spawn := func() {
		s := sems[launched%clients]
		launched++
		wg.Go(func() {
			l, err := s.Acquire(ctx, 1)
			if err != nil {
				if ctx.Err() == nil {
					select {
					case errc <- err:
					default:
					}
				}
				return
			}
			select {
			case granted <- l:
			case <-ctx.Done():
				_ = l.Release(context.Background())
			}
		})
	}
	// waitQueued waits until every launched waiter is in the queue.
	waitQueued := func(want int64) error {
		deadline := time.Now().Add(limit)
		for queued.n.Load() < want {
			select {
			case err := <-errc:
				return err
			default:
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%d of %d waiters queued after %v", queued.n.Load(), want, limit)
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	}

	cur, err := sems[0].Acquire(ctx, 1)
	if err != nil {
		return nil, nil, err
	}
	t := &Table{Name: "queue", Title: "7. Queue length: refused TryAcquire and release to the next waiter, as the queue grows",
		Note: fmt.Sprintf("fairlock only: its peers keep no queue. One semaphore of capacity 1, held; waiters are goroutines of %d clients (waiter TTL %v) queued behind the lease. "+
			"Per sample an extra client's TryAcquire is refused (waiters queue), one waiter joins at the back, and the holder releases, granting the head; the woken waiter holds next. "+
			"%d samples per size after %d not counted; the queue grows from one size to the next on the same semaphore. Sizes above -max-queue (%d) are not run.", clients, queueWaiterTTL, samples, warmup, e.cfg.maxQueue),
		Columns: []string{"waiters", "TryAcquire refused p50", "p99", "÷ at 10", "release to next p50", "p99", "÷ at 10", "queued (Status)", "time to queue"}}
	var base [2]time.Duration
	var last [2]float64
	lastSize := 0
	for _, size := range sizes {
		t0 := time.Now()
		for launched-taken < int64(size) {
			if launched-queued.n.Load() >= inFlight {
				if err := waitQueued(launched - inFlight/2); err != nil {
					return nil, nil, err
				}
			}
			spawn()
		}
		if err := waitQueued(launched); err != nil {
			return nil, nil, err
		}
		fill := time.Since(t0)
		var tries, rels []time.Duration
		for k := range warmup + samples {
			t0 := time.Now()
			l, err := extra.TryAcquire(ctx, 1)
			if k >= warmup {
				tries = append(tries, time.Since(t0))
			}
			if err == nil {
				_ = l.Release(ctx)
				return nil, nil, fmt.Errorf("TryAcquire granted past %d waiters", size)
			}
			if !errors.Is(err, fairlock.ErrNotAcquired) {
				return nil, nil, fmt.Errorf("TryAcquire: %w", err)
			}
			spawn()
			if err := waitQueued(launched); err != nil {
				return nil, nil, err
			}
			t0 = time.Now()
			if err := cur.Release(ctx); err != nil {
				return nil, nil, fmt.Errorf("release to the next of %d waiters: %w", size, err)
			}
			if k >= warmup {
				rels = append(rels, time.Since(t0))
			}
			select {
			case cur = <-granted:
				taken++
			case err := <-errc:
				return nil, nil, err
			case <-time.After(limit):
				return nil, nil, fmt.Errorf("no waiter granted %v after a release, %d waiting", limit, size)
			}
		}
		// The queue length as fairlock reports it: the scenario measured
		// what it says only if this is size.
		st, err := cs[clients].Status(ctx, name)
		if err != nil {
			return nil, nil, err
		}
		if st.Queued != int64(size) {
			return nil, nil, fmt.Errorf("measured at %d waiters, but Status counts %d queued", size, st.Queued)
		}
		p := [2]time.Duration{quantile(tries, 0.5), quantile(rels, 0.5)}
		if size == sizes[0] {
			base = p
		}
		r := [2]float64{ratio(p[0], base[0]), ratio(p[1], base[1])}
		last, lastSize = r, size
		t.Rows = append(t.Rows, []string{strconv.Itoa(size), us(p[0]), us(quantile(tries, 0.99)), f2(r[0]), us(p[1]), us(quantile(rels, 0.99)), f2(r[1]),
			strconv.FormatInt(st.Queued, 10), us(fill)})
		t.Data = append(t.Data, map[string]any{"impl": im.name, "waiters": size, "try_p50_us": micros(p[0]), "try_p99_us": micros(quantile(tries, 0.99)),
			"release_p50_us": micros(p[1]), "release_p99_us": micros(quantile(rels, 0.99)), "try_per_10": r[0], "release_per_10": r[1],
			"queued": st.Queued, "queue_seconds": fill.Seconds(), "samples": samples})
	}
	_ = cur.Release(context.Background())
	var targets []Target
	if lastSize > sizes[0] {
		what := fmt.Sprintf("p50 at %s waiters ÷ at %d ≤ 1.2 (TryAcquire, release)", strconv.Itoa(lastSize), sizes[0])
		if lastSize < queueSizes[len(queueSizes)-1] {
			what += fmt.Sprintf("; the target is at %d: -max-queue %d", queueSizes[len(queueSizes)-1], queueSizes[len(queueSizes)-1])
		}
		targets = append(targets, Target{"queue", what, f2(last[0]) + " ×, " + f2(last[1]) + " ×", last[0] <= 1.2 && last[1] <= 1.2})
	}
	return []*Table{t}, targets, nil
}
