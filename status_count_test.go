package fairlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Status counts every live lease and its permits, far past the StatusMax
// it lists, and none of the leases that have expired but that no script
// has dropped yet.
func TestStatusCountsEveryLease(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.EachOffRace(t, func(t *testing.T, b *redistest.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		const name, capacity, live, dead = "many", 10000, 4100, 150
		prefix := redistest.Prefix(t)
		client := func(opts ...fairlock.Option) *fairlock.Client {
			rdb := b.Client(t, func(o *redis.Options) { o.PoolSize = 32 })
			c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(prefix)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		take := func(c *fairlock.Client, n, permits int) {
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := g; i < n; i += 16 {
						if _, err := c.TryAcquire(ctx, fairlock.Request{Name: name, Capacity: capacity, Permits: int64(permits)}); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("TryAcquire: %v", err)
			}
		}
		// Leases of a process that dies (Abandon: its leases stay in Redis
		// until they expire, as a crash leaves them): they expire, and
		// nothing drops them (Status changes nothing).
		doomed := client(fairlock.WithLeaseTTL(300 * time.Millisecond))
		take(doomed, dead, 2)
		_ = doomed.Abandon()
		c := client()
		take(c, live, 1)
		time.Sleep(600 * time.Millisecond)
		st, err := c.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.InUse != live || st.Held != live {
			t.Fatalf("Status: in use %d, held %d (listed %d); want %d and %d", st.InUse, st.Held, len(st.Holders), live, live)
		}
		if len(st.Holders) != fairlock.StatusMax {
			t.Fatalf("Status listed %d holders, want %d", len(st.Holders), fairlock.StatusMax)
		}
	})
}
