// Command fairlock-demo shows fairlock's promises on a live Redis: grants
// in arrival order, handoff to the next waiter when a holder crashes,
// fencing tokens that expose a holder paused past its lease, and a thousand
// waiters draining through one blocking connection.
//
// By default it runs on an embedded Redis (miniredis) and needs no set-up:
//
//	go run ./cmd/fairlock-demo
//
// With -redis ADDR it uses a real server instead; its figures then mean
// something about speed. Keys go under the prefix "fairlock-demo:".
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("redis", "", "address of a Redis server to use (default: an embedded miniredis)")
	waiters := flag.Int("waiters", 1000, "goroutines in the drain demo")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: fairlock-demo [-redis host:port] [-waiters N]\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	log.SetFlags(0)

	backend := "embedded miniredis (figures show behaviour, not speed)"
	if *addr == "" {
		mr, err := miniredis.Run()
		if err != nil {
			log.Fatal(err)
		}
		defer mr.Close()
		*addr = mr.Addr()
	} else {
		backend = "redis at " + *addr
	}
	d := &demo{addr: *addr}
	fmt.Printf("fairlock demo on %s\n\n", backend)
	for _, step := range []func() error{d.fifo, d.crash, d.fencing, func() error { return d.drain(*waiters) }} {
		if err := step(); err != nil {
			log.Fatal(err)
		}
		fmt.Println()
	}
}

type demo struct {
	addr string
	n    int
}

// process returns a client standing for one process of its own.
func (d *demo) process(opts ...fairlock.Option) (*fairlock.Client, *redis.Client, func()) {
	rdb := redis.NewClient(&redis.Options{Addr: d.addr})
	d.n++
	c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(fmt.Sprintf("fairlock-demo:%d:", time.Now().UnixNano()))}, opts...)...)
	if err != nil {
		log.Fatal(err)
	}
	return c, rdb, func() { c.Close(); rdb.Close() }
}

// fifo: six processes queue for two permits and are served in arrival
// order, each with a larger fencing token.
func (d *demo) fifo() error {
	fmt.Println("1. Processes 1 to 6 queue, in that order, for a semaphore of capacity 2.")
	prefix := fairlock.WithPrefix("fairlock-demo:fifo:")
	ctx := context.Background()
	var stops []func()
	defer func() {
		for _, s := range stops {
			s()
		}
	}()
	sem := func() *semaphore.Semaphore {
		c, _, stop := d.process(prefix)
		stops = append(stops, stop)
		s, err := semaphore.New(c, "encoders", 2)
		if err != nil {
			log.Fatal(err)
		}
		return s
	}
	holder := sem()
	held, err := holder.Acquire(ctx, 2)
	if err != nil {
		return err
	}
	type grant struct {
		who   int
		token int64
	}
	grants := make(chan grant, 6)
	for i := 1; i <= 6; i++ {
		s := sem()
		go func() {
			l, err := s.Acquire(ctx, 1)
			if err != nil {
				log.Fatal(err)
			}
			grants <- grant{i, l.Token()}
			time.Sleep(5 * time.Millisecond) // work
			l.Release(ctx)
		}()
		time.Sleep(20 * time.Millisecond) // arrive one after another
	}
	held.Release(ctx)
	var all []grant
	for range 6 {
		all = append(all, <-grants)
	}
	slices.SortFunc(all, func(a, b grant) int { return cmp.Compare(a.token, b.token) })
	for _, g := range all {
		fmt.Printf("   token %d: process %d\n", g.token, g.who)
	}
	return nil
}

// crash: a holder dies without releasing; the waiter is granted when the
// lease expires by Redis's clock, with nobody polling.
func (d *demo) crash() error {
	const ttl = 500 * time.Millisecond
	fmt.Printf("2. A holder with a %v lease crashes; the next waiter is granted when it expires.\n", ttl)
	r, err := d.crashed(ttl)
	if err != nil {
		return err
	}
	fmt.Printf("   waiter granted %v after the crash (lease TTL %v; the lease was held until at least %v after it); token %d > %d\n",
		r.after.Round(time.Millisecond), ttl, r.heldFor.Round(time.Millisecond), r.next, r.crashed)
	return nil
}

// crashResult is what the crash step saw.
type crashResult struct {
	heldFor       time.Duration // from the crash to the lease's Expiry read just before it
	after         time.Duration // from the crash to the waiter's grant
	crashed, next int64         // the tokens
}

// crashed runs the crash step: the holder's client is abandoned (as a
// process that dies: it stops renewing and releases nothing), and the
// waiter must not be granted before the lease's TTL has run out in Redis.
// It fails if the waiter was granted before the lease's Expiry, the
// earliest time Redis may have expired it: the crash would have released
// the lease instead of leaving it to expire.
func (d *demo) crashed(ttl time.Duration) (crashResult, error) {
	ctx := context.Background()
	prefix := fairlock.WithPrefix("fairlock-demo:crash:")
	hc, _, hstop := d.process(prefix, fairlock.WithLeaseTTL(ttl))
	defer hstop()
	wc, _, wstop := d.process(prefix)
	defer wstop()
	hs, _ := semaphore.NewMutex(hc, "ledger")
	ws, _ := semaphore.NewMutex(wc, "ledger")
	l, err := hs.Lock(ctx)
	if err != nil {
		return crashResult{}, err
	}
	expiry := l.Expiry()
	crashed := time.Now()
	// A crash, as far as Redis knows: renewal stops, nothing is released.
	if err := hc.Abandon(); err != nil {
		return crashResult{}, err
	}
	got, err := ws.Lock(ctx)
	if err != nil {
		return crashResult{}, err
	}
	granted := time.Now()
	r := crashResult{heldFor: expiry.Sub(crashed), after: granted.Sub(crashed), crashed: l.Token(), next: got.Token()}
	if err := got.Release(ctx); err != nil {
		return r, err
	}
	if granted.Before(expiry) {
		return r, fmt.Errorf("the waiter was granted %v after the crash, before the crashed holder's lease could have expired (%v after it): the crash released the lease",
			r.after.Round(time.Millisecond), r.heldFor.Round(time.Millisecond))
	}
	return r, nil
}

// fencing: a holder paused past its lease learns it lost the lease, and
// its token is lower than the next holder's.
func (d *demo) fencing() error {
	const ttl = 300 * time.Millisecond
	fmt.Println("3. A holder stalls past its lease: it learns so, and its token is stale.")
	ctx := context.Background()
	prefix := fairlock.WithPrefix("fairlock-demo:fence:")
	pc, prdb, pstop := d.process(prefix, fairlock.WithLeaseTTL(ttl))
	defer pstop()
	oc, _, ostop := d.process(prefix)
	defer ostop()
	pm, _ := semaphore.NewMutex(pc, "ledger")
	om, _ := semaphore.NewMutex(oc, "ledger")
	paused, err := pm.Lock(ctx)
	if err != nil {
		return err
	}
	// A stall: the process cannot reach Redis for a while.
	stall := &stall{}
	stall.on.Store(true)
	prdb.AddHook(stall)
	next, err := om.Lock(ctx)
	if err != nil {
		return err
	}
	stall.on.Store(false)
	<-paused.Done()
	fmt.Printf("   stalled holder: Done closed, Err() = %v\n", paused.Err())
	fmt.Printf("   tokens: stalled %d < next holder %d: %v\n", paused.Token(), next.Token(), paused.Token() < next.Token())
	fmt.Printf("   stalled holder's Release: %v\n", paused.Release(ctx))
	return next.Release(ctx)
}

type stall struct{ on atomic.Bool }

func (s *stall) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *stall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (s *stall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if s.on.Load() {
			err := errors.New("stalled")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// drain: many goroutines of one process wait on one semaphore, sharing one
// blocking connection, and drain through it.
func (d *demo) drain(n int) error {
	fmt.Printf("4. %d goroutines of one process queue on a mutex, then each acquires once and releases.\n", n)
	ctx := context.Background()
	prefix := fairlock.WithPrefix("fairlock-demo:drain:")
	hc, _, hstop := d.process(prefix)
	defer hstop()
	// fairlock's BLPOPs run on a go-redis client of its own, built from
	// rdb's options on the first wait; count them there too.
	cnt := &counter{}
	c, rdb, stop := d.process(prefix, testhook.BlockingHooks[fairlock.Option](cnt))
	defer stop()
	rdb.AddHook(cnt)
	hm, _ := semaphore.NewMutex(hc, "jobs")
	m, _ := semaphore.NewMutex(c, "jobs")
	held, err := hm.Lock(ctx)
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	var queued atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			queued.Add(1)
			if err := m.Do(ctx, func(context.Context) error { return nil }); err != nil {
				log.Fatal(err)
			}
		}()
	}
	for queued.Load() < int64(n) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // let every waiter reach the queue
	start := time.Now()
	if err := held.Release(ctx); err != nil {
		return err
	}
	wg.Wait()
	fmt.Printf("   drained in %v; %.2f Redis commands per acquisition; at most %d blocking connection(s)\n",
		time.Since(start).Round(time.Millisecond), float64(cnt.total.Load())/float64(n), cnt.peak.Load())
	return nil
}

type counter struct {
	total, blocking, peak atomic.Int64
}

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.total.Add(1)
		if cmd.Name() != "blpop" && cmd.Name() != "blmpop" {
			return next(ctx, cmd)
		}
		if b := c.blocking.Add(1); b > c.peak.Load() {
			c.peak.Store(b)
		}
		defer c.blocking.Add(-1)
		return next(ctx, cmd)
	}
}
