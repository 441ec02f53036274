package semaphore_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
)

// These benchmarks check the speed targets against a real redis-server on
// loopback. Each reports its figures as ratios to a PING measured in the
// same loop, so that machine speed cancels out.

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func p99(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)*99/100]
}

func benchClient(b *testing.B, rdb fairlock.RedisClient, prefix string, opts ...fairlock.Option) *fairlock.Client {
	c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(prefix)}, opts...)...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

func benchSem(b *testing.B, c *fairlock.Client, name string, capacity int64) *semaphore.Semaphore {
	s, err := semaphore.New(c, name, capacity)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// Uncontended Acquire is one round trip: compare its p50 with PING's.
func BenchmarkUncontended(b *testing.B) {
	be := redistest.RealBackend(b)
	rdb := be.Client(b)
	s := benchSem(b, benchClient(b, rdb, redistest.Prefix(b)), "u", 1)
	ctx := context.Background()
	var ping, acq []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		l, err := s.Acquire(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		ping, acq = append(ping, t1.Sub(t0)), append(acq, t2.Sub(t1))
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(p50(ping).Microseconds()), "ping-p50-µs")
	b.ReportMetric(float64(p50(acq).Microseconds()), "acquire-p50-µs")
	b.ReportMetric(float64(p50(acq))/float64(p50(ping)), "acquire/ping-p50")
	b.ReportMetric(float64(p99(acq))/float64(p99(ping)), "acquire/ping-p99")
}

// Handoff: from Release by the holder to Acquire returning in the blocked
// waiter (another process), against a PING after a similar idle pause.
func BenchmarkHandoff(b *testing.B) {
	be := redistest.RealBackend(b)
	prefix := redistest.Prefix(b)
	rdb := be.Client(b)
	holder := benchSem(b, benchClient(b, be.Client(b), prefix), "h", 1)
	waiter := benchSem(b, benchClient(b, be.Client(b), prefix), "h", 1)
	ctx := context.Background()
	const idle = 2 * time.Millisecond
	var hand, ping []time.Duration
	type got struct {
		l   *fairlock.Lease
		at  time.Time
		err error
	}
	ch := make(chan got, 1)
	for b.Loop() {
		l, err := holder.Acquire(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			wl, err := waiter.Acquire(ctx, 1)
			ch <- got{wl, time.Now(), err}
		}()
		for {
			time.Sleep(idle)
			if n, _ := rdb.ZCard(ctx, prefix+"{h}:q").Result(); n == 1 {
				break
			}
		}
		time.Sleep(idle)
		t0 := time.Now()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		g := <-ch
		if g.err != nil {
			b.Fatal(g.err)
		}
		hand = append(hand, g.at.Sub(t0))
		if err := g.l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		time.Sleep(idle)
		t1 := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		ping = append(ping, time.Since(t1))
	}
	b.ReportMetric(float64(p50(ping).Microseconds()), "idle-ping-p50-µs")
	b.ReportMetric(float64(p50(hand).Microseconds()), "handoff-p50-µs")
	b.ReportMetric(float64(p50(hand))/float64(p50(ping)), "handoff/ping-p50")
	b.ReportMetric(float64(p99(hand))/float64(p99(ping)), "handoff/ping-p99")
}

// 1,000 goroutines of one process queue on one semaphore, then drain:
// each acquires once and releases. Reports the drain time and the Redis
// commands per acquisition over the whole episode.
func BenchmarkDrain1000(b *testing.B) {
	be := redistest.RealBackend(b)
	prefix := redistest.Prefix(b)
	cnt := fltest.NewCounter()
	rdb := be.Client(b)
	counted := redistest.AddHook[fairlock.Option](rdb, cnt)
	inspect := be.Client(b)
	hold := benchSem(b, benchClient(b, be.Client(b), prefix), "d", 1)
	s := benchSem(b, benchClient(b, rdb, prefix, counted), "d", 1)
	ctx := context.Background()
	const n = 1000
	var drain []time.Duration
	var cmds []float64
	for b.Loop() {
		l, err := hold.Acquire(ctx, 1)
		if err != nil {
			b.Fatal(err)
		}
		before := cnt.Total()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				wl, err := s.Acquire(ctx, 1)
				if err == nil {
					err = wl.Release(ctx)
				}
				if err != nil {
					errs <- err
				}
			}()
		}
		for {
			nq, _ := inspect.ZCard(ctx, prefix+"{d}:q").Result()
			if nq == n {
				break
			}
			time.Sleep(time.Millisecond)
		}
		t0 := time.Now()
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
		wg.Wait()
		drain = append(drain, time.Since(t0))
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		cmds = append(cmds, float64(cnt.Total()-before)/n)
	}
	b.ReportMetric(float64(p50(drain).Milliseconds()), "drain-ms")
	b.ReportMetric(slices.Max(cmds), "cmds/acquire")
}

// Signal to wake: from CondSignal by one process (holding nothing, the
// mutex free) to CondWait returning, with the mutex, in the waiter (another
// process).
func BenchmarkCondSignalWake(b *testing.B) {
	be := redistest.RealBackend(b)
	prefix := redistest.Prefix(b)
	ctx := context.Background()
	waiter, err := semaphore.NewMutex(benchClient(b, be.Client(b), prefix), "cv")
	if err != nil {
		b.Fatal(err)
	}
	signaller, err := semaphore.NewMutex(benchClient(b, be.Client(b), prefix), "cv")
	if err != nil {
		b.Fatal(err)
	}
	rdb := be.Client(b)
	key := prefix + "{cv}\x1fc\x1f" // the default condition's waiters (keyspace.Keys.Derived)
	cond, scond := semaphore.NewCond(waiter), semaphore.NewCond(signaller)
	var ping, wake []time.Duration
	for b.Loop() {
		l, err := waiter.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			l, err := cond.Wait(ctx, l)
			got <- time.Now()
			if err == nil {
				err = l.Release(ctx)
			}
			if err != nil {
				b.Error(err)
			}
		}()
		for rdb.ZCard(ctx, key).Val() == 0 {
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(time.Millisecond)
		t0 := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if n, err := scond.Signal(ctx); err != nil || n != 1 {
			b.Fatalf("Signal = %d, %v", n, err)
		}
		ping, wake = append(ping, t1.Sub(t0)), append(wake, (<-got).Sub(t1))
	}
	b.ReportMetric(float64(p50(ping).Microseconds()), "ping-p50-µs")
	b.ReportMetric(float64(p50(wake).Microseconds()), "wake-p50-µs")
	b.ReportMetric(float64(p99(wake).Microseconds()), "wake-p99-µs")
	b.ReportMetric(float64(p50(wake))/float64(p50(ping)), "wake/ping-p50")
}

// Contended: 64 goroutines, each with a client (and go-redis pool) of its
// own, take turns at one mutex, holding nothing, each Acquire under a
// context with a deadline. Reports this process's CPU time (user and
// system: the clients' own work, Redis runs elsewhere) per acquisition.
// For a profile of the client path: -bench Contended64 -cpuprofile.
func BenchmarkContended64(b *testing.B) {
	be := redistest.RealBackend(b)
	prefix := redistest.Prefix(b)
	const procs = 64
	sems := make([]*semaphore.Semaphore, procs)
	for i := range sems {
		sems[i] = benchSem(b, benchClient(b, be.Client(b), prefix), "c", 1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	var next atomic.Int64
	cpu0 := cpuTime()
	b.ResetTimer()
	var wg sync.WaitGroup
	for _, s := range sems {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				l, err := s.Acquire(ctx, 1)
				if err != nil {
					b.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "client-cpu-µs/acq")
}

// cpuTime returns the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
