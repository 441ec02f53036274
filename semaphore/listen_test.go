package semaphore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Semantics 3 (issue 12, item 5): waiting never delays renewals or
// releases. One process waits on 1,000 semaphores through a go-redis pool
// of 10 connections while it holds a few leases with a 300 ms TTL: every
// lease must stay alive for several TTLs, and every waiter must be granted
// once the other process lets go. A blocking read per semaphore on the
// caller's pool would take all ten connections and starve the renewals.
func TestWaitingDoesNotStarveRenewals(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const (
			waiting  = 1000
			held     = 3
			leaseTTL = 300 * time.Millisecond
		)
		e := newEnv(t, b)
		ctx := context.Background()
		name := func(i int) string { return fmt.Sprintf("busy%d", i) }

		// The other process holds all 1,000 semaphores.
		other := e.Client()
		blockers := make([]*fairlock.Lease, waiting)
		for i := range blockers {
			l, err := e.sem(other, name(i), 1).Acquire(ctx, 1)
			if err != nil {
				t.Fatalf("other process, %s: %v", name(i), err)
			}
			blockers[i] = l
		}

		rdb := b.Client(t, func(o *redis.Options) { o.PoolSize = 10 })
		c := e.ClientOn(rdb, fairlock.WithLeaseTTL(leaseTTL))
		leases := make([]*fairlock.Lease, held)
		for i := range leases {
			l, err := e.sem(c, fmt.Sprintf("mine%d", i), 1).Acquire(ctx, 1)
			if err != nil {
				t.Fatalf("held lease %d: %v", i, err)
			}
			leases[i] = l
		}
		alive := func(when string) {
			t.Helper()
			for i, l := range leases {
				select {
				case <-l.Done():
					t.Fatalf("%s: held lease %d ended: %v", when, i, l.Err())
				default:
				}
			}
		}

		start := time.Now()
		wctx, cancel := context.WithCancel(ctx)
		results := make(chan result, waiting)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }() // on failure, end the waits
		for i := range waiting {
			s := e.sem(c, name(i), 1)
			wg.Go(func() {
				l, err := s.Acquire(wctx, 1)
				results <- result{l, err}
			})
		}
		e.WaitFor("1,000 waiters queued", func() bool {
			pipe := e.rdb.Pipeline()
			cmds := make([]*redis.IntCmd, waiting)
			for i := range cmds {
				cmds[i] = pipe.ZCard(ctx, e.key(name(i), "q"))
			}
			_, _ = pipe.Exec(ctx)
			for _, cmd := range cmds {
				if n, err := cmd.Result(); err != nil || n != 1 {
					return false
				}
			}
			return true
		})
		t.Logf("%s: %d waiters queued in %v", b.Name, waiting, time.Since(start))
		alive("once all waiters queued")

		// Several lease TTLs with every waiter blocked.
		for range 5 {
			time.Sleep(leaseTTL)
			alive("while 1,000 waiters wait")
		}

		start = time.Now()
		for i, l := range blockers {
			if err := l.Release(ctx); err != nil {
				t.Fatalf("other process, release %s: %v", name(i), err)
			}
		}
		granted := make([]*fairlock.Lease, 0, waiting)
		timeout := time.After(30 * time.Second)
		for len(granted) < waiting {
			select {
			case r := <-results:
				if r.err != nil {
					t.Fatalf("waiter %d: %v", len(granted), r.err)
				}
				granted = append(granted, r.lease)
			case <-timeout:
				t.Fatalf("%d of %d waiters granted within 30s of the release", len(granted), waiting)
			}
		}
		t.Logf("%s: %d waiters granted in %v after the other process released", b.Name, waiting, time.Since(start))
		alive("once every waiter is granted")
		for _, l := range granted {
			e.Release(l)
		}
		for _, l := range leases {
			e.Release(l)
		}
	})
}
