package faulttest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Sentinel: a master, a replica and three sentinels. The cost of
// WithReplicaAck, then the master killed while waiters queue: nobody
// hangs, tokens keep increasing, the semaphore works on the promoted
// replica, and a client that asks for a replica's acknowledgement, which
// no replica is left to give, gets ErrNotReplicated and holds nothing.
func TestSentinelFailover(t *testing.T) {
	redistest.Long(t)
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	set, err := redisserver.StartSentinel(500 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Stop()
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	newClient := func(opts ...fairlock.Option) *fairlock.Client {
		rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redisserver.MasterName, SentinelAddrs: set.SentinelAddrs()})
		c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(prefix)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); rdb.Close() })
		return c
	}
	mutex := func(name string) fairlock.Request { return fairlock.Request{Name: name, Capacity: 1, Permits: 1} }

	// The cost of waiting for the replica, interleaved with the plain way.
	plain, acked := newClient(), newClient(fairlock.WithReplicaAck(1, time.Second))
	var tp, ta []time.Duration
	for i := range 400 {
		for _, c := range []*fairlock.Client{plain, acked} {
			t0 := time.Now()
			l, err := c.Acquire(ctx, mutex("cost"))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if i > 0 {
				if c == plain {
					tp = append(tp, time.Since(t0))
				} else {
					ta = append(ta, time.Since(t0))
				}
			}
		}
	}
	p50 := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }
	t.Logf("acquire+release p50: %v plain, %v with WithReplicaAck(1, 1s): %.2f ×",
		p50(tp), p50(ta), float64(p50(ta))/float64(p50(tp)))

	// The master dies while a lease is held and three waiters queue.
	holder := newClient(fairlock.WithLeaseTTL(3 * time.Second))
	held, err := holder.Acquire(ctx, mutex("fo"))
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *fairlock.Lease
		err error
	}
	results := make(chan result, 3)
	for i := range 3 {
		w := newClient()
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			l, err := w.Acquire(wctx, mutex("fo"))
			results <- result{l, err}
		}()
		waitWaiters(t, holder, spec{name: "fo"}, i+1)
	}
	sc := redis.NewSentinelClient(&redis.Options{Addr: set.Sentinels[0].Addr})
	defer sc.Close()
	killed := time.Now()
	set.Master.Kill()
	for {
		addr, err := sc.GetMasterAddrByName(ctx, redisserver.MasterName).Result()
		if err == nil && len(addr) == 2 && addr[1] == set.Replica.Addr[len("127.0.0.1:"):] {
			break
		}
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("no failover within 30s: %v %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	promoted := time.Since(killed)
	heldErr := held.Err()
	relErr := held.Release(ctx)
	t.Logf("replica promoted %v after the master was killed; the holder's lease: Err %v, Release %v", promoted.Round(time.Millisecond), heldErr, relErr)
	// The lease may be lost with the master, or the release may reach the
	// new master; a client that still dials the old one (its Sentinel has
	// not yet told it) reports Redis unreachable, and the release is sent
	// again in the background. Anything else is wrong.
	if relErr != nil && !errors.Is(relErr, fairlock.ErrLeaseLost) && !errors.Is(relErr, fairlock.ErrRedis) {
		t.Errorf("holder's Release after the failover: %v", relErr)
	}
	last := held.Token()
	for range 3 {
		select {
		case r := <-results:
			if r.err != nil {
				// Allowed (the failover may cut a waiter off), but it
				// must be an error, not a hang.
				t.Logf("waiter: %v", r.err)
				continue
			}
			if r.l.Token() <= last {
				t.Errorf("token %d after %d across the failover", r.l.Token(), last)
			}
			last = r.l.Token()
			if err := r.l.Release(ctx); err != nil {
				t.Errorf("waiter's release: %v", err)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("a waiter neither got the lease nor an error")
		}
	}
	t.Logf("all three waiters answered %v after the kill", time.Since(killed).Round(time.Millisecond))
	l, err := plain.TryAcquire(ctx, mutex("fo"))
	if err != nil {
		t.Fatalf("TryAcquire on the promoted replica: %v", err)
	}
	_ = l.Release(ctx)

	// No replica is left to acknowledge.
	ackCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = newClient(fairlock.WithReplicaAck(1, 100*time.Millisecond)).Acquire(ackCtx, mutex("fo"))
	if !errors.Is(err, fairlock.ErrNotReplicated) {
		t.Fatalf("Acquire needing a replica's ack with no replica: %v, want ErrNotReplicated", err)
	}
	l, err = plain.TryAcquire(ctx, mutex("fo"))
	if err != nil {
		t.Fatalf("the unacknowledged grant was not given back: %v", err)
	}
	_ = l.Release(ctx)
}
