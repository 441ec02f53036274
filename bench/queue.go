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
	im, ok := e.own()
	if !ok {
		return nil, nil, nil
	}
	const clients = 4    // processes holding the waiters
	const inFlight = 256 // waiters launched and not yet queued, at most
	const samples = 200  // per size: fewer leave the p50 to the machine's noise
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
	// Two lines of waiters: the measured one, which grows through sizes,
	// and a reference of refSize waiters measured alongside it, sample by
	// sample, so that the machine's drift over the minutes the sizes take
	// does not count as the queue's.
	type line struct {
		name    string
		sems    []*semaphore.Semaphore // one per waiter client; the last is the extra client's
		granted chan *fairlock.Lease
		cur     *fairlock.Lease
		waiting int64 // launched and not yet granted
	}
	const refSize = queueRefSize
	lines := [2]*line{{name: name}, {name: name + "-ref"}}
	for range clients + 1 {
		rdb := redis.NewClient(&redis.Options{Addr: e.addr})
		rdbs = append(rdbs, rdb)
		c, err := fairlock.New(rdb, fairlock.WithPrefix(e.run+im.name+":"), fairlock.WithLeaseTTL(leaseTTL),
			fairlock.WithWaiterTTL(queueWaiterTTL), fairlock.WithObserver(queued))
		if err != nil {
			return nil, nil, err
		}
		cs = append(cs, c)
		for _, ln := range lines {
			s, err := semaphore.New(c, ln.name, 1)
			if err != nil {
				return nil, nil, err
			}
			ln.sems = append(ln.sems, s)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	errc := make(chan error, 1)
	launched := int64(0) // waiters started, on both lines
	spawn := func(ln *line) {
		s := ln.sems[launched%clients]
		launched++
		ln.waiting++
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
			case ln.granted <- l:
			case <-ctx.Done():
				_ = l.Release(context.Background())
			}
		})
	}
	// waitQueued waits until every launched waiter is in its queue.
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
	for _, ln := range lines {
		ln.granted = make(chan *fairlock.Lease, 1)
		var err error
		if ln.cur, err = ln.sems[0].Acquire(ctx, 1); err != nil {
			return nil, nil, err
		}
	}
	for lines[1].waiting < refSize {
		spawn(lines[1])
	}
	// sample measures, on ln, an extra client's TryAcquire (refused) and,
	// once one more waiter has joined at the back, the holder's release to
	// the head, which holds next.
	sample := func(ln *line) (try, rel time.Duration, err error) {
		t0 := time.Now()
		l, err := ln.sems[clients].TryAcquire(ctx, 1)
		try = time.Since(t0)
		if err == nil {
			_ = l.Release(ctx)
			return 0, 0, fmt.Errorf("TryAcquire granted past %d waiters", ln.waiting)
		}
		if !errors.Is(err, fairlock.ErrNotAcquired) {
			return 0, 0, fmt.Errorf("TryAcquire: %w", err)
		}
		spawn(ln)
		if err := waitQueued(launched); err != nil {
			return 0, 0, err
		}
		t0 = time.Now()
		if err := ln.cur.Release(ctx); err != nil {
			return 0, 0, fmt.Errorf("release to the next of %d waiters: %w", ln.waiting, err)
		}
		rel = time.Since(t0)
		select {
		case ln.cur = <-ln.granted:
			ln.waiting--
		case err := <-errc:
			return 0, 0, err
		case <-time.After(limit):
			return 0, 0, fmt.Errorf("no waiter granted %v after a release, %d waiting", limit, ln.waiting)
		}
		return try, rel, nil
	}

	t := &Table{Name: "queue", Title: "7. Queue length: refused TryAcquire and release to the next waiter, as the queue grows",
		Note: fmt.Sprintf("fairlock only: its peers keep no queue. One semaphore of capacity 1, held; waiters are goroutines of %d clients (waiter TTL %v) queued behind the lease. "+
			"Per sample an extra client's TryAcquire is refused (waiters queue), one waiter joins at the back, and the holder releases, granting the head; the woken waiter holds next. "+
			"%d samples per size after %d not counted; the queue grows from one size to the next on the same semaphore. Sizes above -max-queue (%d) are not run. "+
			"Each sample is taken alongside one on a reference semaphore with %d waiters (order alternating), and ÷ ref is p50 over the reference's p50: the machine's drift over the minutes the sizes take does not count as the queue's.",
			clients, queueWaiterTTL, samples, warmup, e.cfg.maxQueue, refSize),
		Columns: []string{"waiters", "TryAcquire refused p50", "p99", "ref p50", "÷ ref", "release to next p50", "p99", "ref p50", "÷ ref", "queued (Status)", "time to queue"}}
	var last [2]float64
	lastSize := 0
	main, ref := lines[0], lines[1]
	for _, size := range sizes {
		t0 := time.Now()
		for main.waiting < int64(size) {
			if launched-queued.n.Load() >= inFlight {
				if err := waitQueued(launched - inFlight/2); err != nil {
					return nil, nil, err
				}
			}
			spawn(main)
		}
		if err := waitQueued(launched); err != nil {
			return nil, nil, err
		}
		fill := time.Since(t0)
		var tries, rels, refTries, refRels []time.Duration
		for k := range warmup + samples {
			order := []*line{main, ref}
			if k%2 == 1 {
				order = []*line{ref, main}
			}
			for _, ln := range order {
				try, rel, err := sample(ln)
				if err != nil {
					return nil, nil, err
				}
				if k < warmup {
					continue
				}
				if ln == main {
					tries, rels = append(tries, try), append(rels, rel)
				} else {
					refTries, refRels = append(refTries, try), append(refRels, rel)
				}
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
		pr := [2]time.Duration{quantile(refTries, 0.5), quantile(refRels, 0.5)}
		r := [2]float64{ratio(p[0], pr[0]), ratio(p[1], pr[1])}
		last, lastSize = r, size
		t.Rows = append(t.Rows, []string{strconv.Itoa(size), us(p[0]), us(quantile(tries, 0.99)), us(pr[0]), f2(r[0]), us(p[1]), us(quantile(rels, 0.99)), us(pr[1]), f2(r[1]),
			strconv.FormatInt(st.Queued, 10), us(fill)})
		t.Data = append(t.Data, map[string]any{"impl": im.name, "waiters": size, "try_p50_us": micros(p[0]), "try_p99_us": micros(quantile(tries, 0.99)),
			"release_p50_us": micros(p[1]), "release_p99_us": micros(quantile(rels, 0.99)), "ref_try_p50_us": micros(pr[0]), "ref_release_p50_us": micros(pr[1]),
			"try_per_ref": r[0], "release_per_ref": r[1], "queued": st.Queued, "queue_seconds": fill.Seconds(), "samples": samples})
	}
	for _, ln := range lines {
		_ = ln.cur.Release(context.Background())
	}
	t.figs = append(t.figs, queueFigure(t, refSize))
	var targets []Target
	if lastSize > sizes[0] {
		what := fmt.Sprintf("p50 at %s waiters ÷ at %d ≤ 1.2 (TryAcquire, release; the %d-waiter reference alongside)", strconv.Itoa(lastSize), refSize, refSize)
		if lastSize < queueSizes[len(queueSizes)-1] {
			what += fmt.Sprintf("; the target is at %d: -max-queue %d", queueSizes[len(queueSizes)-1], queueSizes[len(queueSizes)-1])
		}
		targets = append(targets, timed(Target{"queue", what, f2(last[0]) + " ×, " + f2(last[1]) + " ×", last[0] <= 1.2 && last[1] <= 1.2, false}))
	}
	return []*Table{t}, targets, nil
}

// queueFigure draws table 7's p50s against the queue's length, each beside
// its reference's.
func queueFigure(t *Table, refSize int) *figure {
	fg := &figure{name: "queue", title: "7. Queue length: latency as the queue grows",
		subtitle: fmt.Sprintf("fairlock, one semaphore of capacity 1 with the given number of waiters; p50 of each call, and of the same call on a reference semaphore with %d waiters measured alongside (dashed).", refSize),
		cols:     2, panelW: 460, panelH: 300, legend: []string{"fairlock", queueRefName(refSize)}}
	for _, k := range []struct{ title, key, refKey string }{
		{"TryAcquire, refused (waiters queue)", "try_p50_us", "ref_try_p50_us"},
		{"release that grants the head of the queue", "release_p50_us", "ref_release_p50_us"},
	} {
		own := series{name: "fairlock", dots: true}
		rs := series{name: queueRefName(refSize), dots: true}
		for _, d := range t.Data {
			w := float64(d["waiters"].(int))
			own.pts = append(own.pts, pt{w, d[k.key].(float64)})
			rs.pts = append(rs.pts, pt{w, d[k.refKey].(float64)})
		}
		fg.panels = append(fg.panels, &panel{title: k.title, x: axis{label: "waiters in the queue", log: true},
			y: axis{label: "p50 latency", zero: true, format: durUS}, lines: []series{own, rs}})
	}
	return fg
}
