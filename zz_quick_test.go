package fairlock

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestZZQuickBulk(t *testing.T) {
	b := redistest.RealBackend(t)
	rdb := b.Client(t, func(o *redis.Options) { o.PoolSize = 200 })
	ctx := context.Background()
	rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0")
	rdb.ConfigSet(ctx, "slowlog-max-len", "100000")
	rdb.SlowLogReset(ctx)
	c, err := New(rdb, WithPrefix(redistest.Prefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const capacity = 1 << 30
	w, err := c.Acquire(ctx, Request{Name: "rw", Capacity: capacity, Permits: capacity})
	if err != nil {
		t.Fatal(err)
	}
	const n = 6000
	var wg sync.WaitGroup
	leases := make(chan *Lease, n)
	for range n {
		wg.Go(func() {
			l, err := c.Acquire(ctx, Request{Name: "rw", Capacity: capacity, Permits: 1})
			if err != nil {
				t.Error(err)
				return
			}
			leases <- l
		})
	}
	for {
		st, _ := c.Status(ctx, "rw")
		if st.Queued >= n {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	start := time.Now()
	if err := w.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	t.Logf("%d readers granted in %v", n, time.Since(start))
	close(leases)
	for l := range leases {
		_ = l.Release(ctx)
	}
	w2, err := c.Acquire(ctx, Request{Name: "rw", Capacity: capacity, Permits: capacity})
	if err != nil {
		t.Fatal(err)
	}
	w2.Release(ctx)
	logs, _ := rdb.SlowLogGet(ctx, 100000).Result()
	var worst time.Duration
	for _, l := range logs {
		if l.Duration > worst {
			worst = l.Duration
		}
	}
	t.Logf("slowlog entries %d, worst %v", len(logs), worst)
}
