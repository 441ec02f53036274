package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/semaphore"
)

func Example() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	c, err := fairlock.New(rdb, fairlock.WithPrefix("myapp:"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sem, err := semaphore.New(c, "encoders", 4)
	if err != nil {
		log.Fatal(err)
	}
	lease, err := sem.Acquire(ctx, 1) // waits its turn, first-in first-out
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	fmt.Println("holding", lease.Permits(), "of", sem.Capacity(), "permits of", lease.Name())
	// Output: holding 1 of 4 permits of encoders
}

// Eight jobs across a pool of workers, at most three encoding at once.
func ExampleNew_workerPool() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	sem, err := semaphore.New(c, "encoders", 3)
	if err != nil {
		log.Fatal(err)
	}

	var running, most atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := sem.Do(ctx, 1, func(ctx context.Context) error {
				n := running.Add(1)
				defer running.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				return nil // encode here; ctx ends if the lease is lost
			})
			if err != nil {
				log.Print(err)
			}
		}()
	}
	wg.Wait()
	fmt.Println("at most three at once:", most.Load() <= 3)
	// Output: at most three at once: true
}

func ExampleSemaphore_TryAcquire() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	sem, err := semaphore.New(c, "gpu", 2)
	if err != nil {
		log.Fatal(err)
	}

	both, err := sem.TryAcquire(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	_, err = sem.TryAcquire(ctx, 1)
	fmt.Println("busy:", errors.Is(err, fairlock.ErrNotAcquired))
	both.Release(ctx)
	one, err := sem.TryAcquire(ctx, 1)
	fmt.Println("after release:", err)
	one.Release(ctx)
	// Output:
	// busy: true
	// after release: <nil>
}

// A fencing token lets the protected resource refuse a holder whose lease
// ended (say, it was paused past its TTL) once a later holder has written.
func ExampleMutex() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	mu, err := semaphore.NewMutex(c, "ledger")
	if err != nil {
		log.Fatal(err)
	}

	var highest int64 // kept by the resource, e.g. in its own database
	write := func(lease *fairlock.Lease) error {
		if lease.Token() <= highest {
			return errors.New("stale token")
		}
		highest = lease.Token()
		return nil
	}
	first, err := mu.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	first.Release(ctx)
	second, err := mu.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer second.Release(ctx)

	fmt.Println("second holder writes:", write(second))
	fmt.Println("first holder, late:", write(first))
	// Output:
	// second holder writes: <nil>
	// first holder, late: stale token
}

func ExampleRWMutex() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	rw, err := semaphore.NewRWMutex(c, "config")
	if err != nil {
		log.Fatal(err)
	}

	r1, _ := rw.RLock(ctx)
	r2, err := rw.TryRLock(ctx)
	fmt.Println("two readers:", err == nil)
	_, err = rw.TryLock(ctx)
	fmt.Println("writer while reading:", errors.Is(err, fairlock.ErrNotAcquired))
	r1.Release(ctx)
	r2.Release(ctx)
	w, err := rw.Lock(ctx)
	fmt.Println("writer alone:", err == nil)
	w.Release(ctx)
	// Output:
	// two readers: true
	// writer while reading: true
	// writer alone: true
}

// Do and RDo run a function under the write or a read lock and unlock
// afterwards, whatever the function returns.
func ExampleRWMutex_Do() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	rw, err := semaphore.NewRWMutex(c, "config")
	if err != nil {
		log.Fatal(err)
	}

	config := map[string]string{}
	err = rw.Do(ctx, func(ctx context.Context) error {
		config["mode"] = "fast" // stands for a write to a shared store
		return nil
	})
	fmt.Println("write:", err)
	err = rw.RDo(ctx, func(ctx context.Context) error {
		fmt.Println("read:", config["mode"])
		return nil
	})
	fmt.Println("read done:", err)
	// Output:
	// write: <nil>
	// read: fast
	// read done: <nil>
}

// A read lock cannot be upgraded in place: Lock under the context of a
// read lock would wait for that reader, its own caller, so it fails at
// once with ErrDeadlock. Leave the read lock, take the write lock, and
// read again under it.
func ExampleRWMutex_RDo_upgrade() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	rw, err := semaphore.NewRWMutex(c, "config")
	if err != nil {
		log.Fatal(err)
	}

	err = rw.RDo(ctx, func(ctx context.Context) error {
		// ... a read shows the config needs a change ...
		return rw.Do(ctx, func(ctx context.Context) error { return nil })
	})
	fmt.Println("upgrade refused:", errors.Is(err, fairlock.ErrDeadlock))
	err = rw.Do(ctx, func(ctx context.Context) error {
		// ... read again, and change it if it still needs it ...
		return nil
	})
	fmt.Println("write:", err)
	// Output:
	// upgrade refused: true
	// write: <nil>
}

// WithMaxHold caps how long a job may hold its permits: the context Do
// gives the job ends at the cap, and Do reports it.
func ExampleWithMaxHold() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	sem, err := semaphore.New(c, "exports", 2, semaphore.WithMaxHold(100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	err = sem.Do(ctx, 1, func(ctx context.Context) error {
		select { // a job that would overrun; it stops when told
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(time.Minute):
			return errors.New("overran the cap")
		}
	})
	fmt.Println(errors.Is(err, fairlock.ErrMaxHold), errors.Is(err, fairlock.ErrLeaseLost))
	// Output: true true
}

// WithLeaseTTL gives one handle's leases a TTL of their own: a mutex
// whose holder must not keep others waiting long should its process die,
// on a client whose other leases keep the default 10s.
func ExampleWithLeaseTTL() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	mu, err := semaphore.NewMutex(c, "cache-refill", semaphore.WithLeaseTTL(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	lease, err := mu.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(time.Until(lease.Expiry()) <= time.Second)
	fmt.Println(lease.Release(ctx))

	_, err = semaphore.NewMutex(c, "cache-refill", semaphore.WithLeaseTTL(-time.Second))
	fmt.Println(errors.Is(err, fairlock.ErrInvalidArgument))
	// Output:
	// true
	// <nil>
	// true
}

// A consumer waits on a condition variable until a producer, in another
// process, has put an item in a shared queue.
func ExampleCond() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()
	consumer, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	producer, err := fairlock.New(rdb) // as if in another process
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()

	items := "jobs" // a Redis list guarded by the mutex "jobs-mu"
	waiting := make(chan struct{})
	done := make(chan string)
	go func() {
		mu, _ := semaphore.NewMutex(consumer, "jobs-mu")
		cond := semaphore.NewCond(mu)
		lease, err := mu.Lock(ctx)
		var once sync.Once
		for err == nil && rdb.LLen(ctx, items).Val() == 0 {
			// The producer cannot lock before Wait has unlocked, and Wait
			// unlocks and waits in one step: its Signal is not missed.
			once.Do(func() { close(waiting) })
			lease, err = cond.Wait(ctx, lease) // unlocks, waits, locks again
		}
		if err != nil {
			log.Fatal(err)
		}
		item := rdb.LPop(ctx, items).Val()
		_ = lease.Release(ctx)
		done <- item
	}()

	<-waiting
	mu, _ := semaphore.NewMutex(producer, "jobs-mu")
	err = mu.Do(ctx, func(context.Context) error { return rdb.RPush(ctx, items, "job 1").Err() })
	if err != nil {
		log.Fatal(err)
	}
	woken, err := semaphore.NewCond(mu).Signal(ctx) // needs no lease
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("woke", woken)
	fmt.Println("consumed", <-done)
	// Output:
	// woke 1
	// consumed job 1
}
