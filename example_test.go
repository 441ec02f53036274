package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

// The engine's own API takes a Request; package semaphore wraps it.
func ExampleClient_Acquire() {
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
	lease, err := c.Acquire(ctx, fairlock.Request{Name: "reports", Capacity: 2, Permits: 2})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(lease.Name(), lease.Permits(), lease.Token() > 0)
	fmt.Println(lease.Release(ctx), lease.Err())
	// Output:
	// reports 2 true
	// <nil> fairlock: lease released
}

// Shutdown is for a process told to stop while work still runs under its
// client's leases: it refuses new work at once, lets the work finish and
// release its leases (renewing them meanwhile), and ends what is still
// held only when its context ends. Close releases every lease at once:
// call it once the work is over, or when it must end now.
func ExampleClient_Shutdown() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	req := fairlock.Request{Name: "nightly-report", Capacity: 1, Permits: 1}
	lease, err := c.Acquire(context.Background(), req)
	if err != nil {
		log.Fatal(err)
	}
	// In a program, a signal (signal.NotifyContext) tells the work to stop.
	stop, tellStop := context.WithCancel(context.Background())
	work := make(chan error, 1)
	go func() {
		<-stop.Done() // the work, until told to stop
		work <- lease.Release(context.Background())
	}()

	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- c.Shutdown(sctx) }()
	tellStop()
	fmt.Println("work released its lease:", <-work)
	fmt.Println("shutdown:", <-shut)
	_, err = c.Acquire(context.Background(), req)
	fmt.Println("acquire after shutdown is refused:", errors.Is(err, fairlock.ErrClosed))
	// Output:
	// work released its lease: <nil>
	// shutdown: <nil>
	// acquire after shutdown is refused: true
}

// countingObserver counts a client's events by kind.
type countingObserver struct {
	mu sync.Mutex
	n  map[fairlock.EventKind]int
}

func (o *countingObserver) Observe(e fairlock.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[e.Kind]++
}

// An Observer sees every wait and lease; fairlockotel turns these events
// into OpenTelemetry metrics and spans.
func ExampleWithObserver() {
	// A program connects to its own Redis; the example runs one in process.
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	obs := &countingObserver{n: map[fairlock.EventKind]int{}}
	c, err := fairlock.New(rdb, fairlock.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		lease, err := c.Acquire(ctx, fairlock.Request{Name: "jobs", Capacity: 1, Permits: 1})
		if err != nil {
			log.Fatal(err)
		}
		_ = lease.Release(ctx)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	fmt.Println(fairlock.Granted, obs.n[fairlock.Granted], fairlock.LeaseReleased, obs.n[fairlock.LeaseReleased])
	// Output:
	// granted 3 lease_released 3
}

// WithLogger reports what return values cannot: here, a lease that Redis
// expired before its holder renewed it.
func ExampleWithLogger() {
	mr, err := miniredis.Run() // a program connects to its own Redis
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	// A handler that prints the level, the message and the semaphores.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			switch a.Key {
			case slog.LevelKey, slog.MessageKey, "semaphores":
				return a
			}
			return slog.Attr{}
		},
	}))
	c, err := fairlock.New(rdb, fairlock.WithLogger(logger), fairlock.WithLeaseTTL(300*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	lease, err := c.Acquire(ctx, fairlock.Request{Name: "nightly", Capacity: 1, Permits: 1})
	if err != nil {
		log.Fatal(err)
	}
	mr.SetTime(time.Now().Add(time.Hour)) // Redis's clock jumps past the lease
	<-lease.Done()
	// Output:
	// level=WARN msg="fairlock: lease lost" semaphores=[nightly]
}

// WithMaxHold caps holding: a holder stuck without releasing loses its
// lease at the cap, and Redis hands the permits to the next waiter then,
// with nobody releasing.
func ExampleWithMaxHold() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	stuck, err := fairlock.New(rdb, fairlock.WithMaxHold(200*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer stuck.Close()
	other, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()

	req := fairlock.Request{Name: "ledger", Capacity: 1, Permits: 1}
	lease, err := stuck.Acquire(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	// The holder never releases; the next waiter gets the lock at the cap.
	next, err := other.Acquire(ctx, req)
	if err != nil {
		log.Fatal(err)
	}
	<-lease.Done()
	fmt.Println(errors.Is(lease.Err(), fairlock.ErrMaxHold), errors.Is(lease.Err(), fairlock.ErrLeaseLost))
	fmt.Println(next.Token() > lease.Token())
	fmt.Println(errors.Is(lease.Release(ctx), fairlock.ErrMaxHold), next.Release(ctx))
	// Output:
	// true true
	// true
	// true <nil>
}

// A request may give its lease a TTL of its own, in place of the client's
// (WithLeaseTTL, 10s by default): a short one bounds how long a holder
// whose process dies keeps the others waiting, at the cost of renewals
// as often (every third of it) while held.
func ExampleRequest_leaseTTL() {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	holder, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	other, err := fairlock.New(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer other.Close()

	quick := fairlock.Request{Name: "cache-refill", Capacity: 1, Permits: 1, LeaseTTL: 500 * time.Millisecond}
	slow := fairlock.Request{Name: "ledger", Capacity: 1, Permits: 1} // the client's TTL
	if _, err := holder.Acquire(ctx, quick); err != nil {
		log.Fatal(err)
	}
	if _, err := holder.Acquire(ctx, slow); err != nil {
		log.Fatal(err)
	}
	_ = holder.Abandon() // as if its process died: nothing renews or releases

	start := time.Now()
	next, err := other.Acquire(ctx, quick) // granted once Redis drops the lease
	fmt.Println(err, time.Since(start) < 2*time.Second)
	released := next.Release(ctx)
	_, err = other.TryAcquire(ctx, slow) // held for the client's 10s
	fmt.Println(errors.Is(err, fairlock.ErrNotAcquired))
	_, err = other.Acquire(ctx, fairlock.Request{Name: "x", Capacity: 1, Permits: 1, LeaseTTL: time.Millisecond})
	fmt.Println(errors.Is(err, fairlock.ErrInvalidArgument))
	fmt.Println(released)
	// Output:
	// <nil> true
	// true
	// true
	// <nil>
}
