package fairlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// A process stopped past its lease's TTL (SIGSTOP, a long GC pause, a
// suspended VM) resumes with its timers not yet run: Err must already say
// the lease is lost, or the holder acts on a resource another holder now
// has. The scheduler is held up here as a stopped process's would be.
func TestErrSeesLeaseLapsedBeforeItsTimers(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Acquire(ctx, Request{Name: "lapse", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Err(); err != nil {
			t.Fatalf("Err() of a lease just granted = %v", err)
		}
		c.sched.mu.Lock() // no renewal runs
		time.Sleep(ttl + ttl/2)
		err = l.Err()
		lapsed := errors.Is(err, ErrLeaseLost)
		c.sched.mu.Unlock()
		if !lapsed {
			t.Fatalf("Err() %v past the lease's deadline, its renewal held up, = %v; want ErrLeaseLost", ttl/2, err)
		}
		select {
		case <-l.Done():
		default:
			t.Fatal("Done not closed once Err reported the lease lost")
		}
		if err := l.Release(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Release of the lapsed lease = %v", err)
		}
	})
}

// A renewal that comes after the lease's deadline because this process did
// not run in time (the scheduler held up, as a stopped process's is) ends
// the lease blaming the process, not Redis; nothing is sent.
func TestStalledRenewalBlamesTheProcess(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Acquire(ctx, Request{Name: "stall", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		c.sched.mu.Lock() // no renewal runs: the process is stopped
		time.Sleep(ttl + ttl/2)
		c.sched.mu.Unlock()
		<-l.Done()
		err = l.Err()
		if !errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "this process") {
			t.Fatalf("Err() of a lease whose process stalled past its deadline = %v; want ErrLeaseLost blaming the process, not ErrRedis", err)
		}
	})
}

// renewalFailure blames the process for a renewal sent too late to land,
// and Redis for one it did not answer in time, or failed.
func TestRenewalFailureSaysWhose(t *testing.T) {
	const ttl = time.Second
	deadline := time.Now()
	for _, tc := range []struct {
		err      error
		left     time.Duration
		redis    bool
		contains string
	}{
		{context.DeadlineExceeded, 5 * time.Millisecond, false, "this process ran late"},
		{context.DeadlineExceeded, 600 * time.Millisecond, true, "Redis did not answer"},
		{errors.New("LOADING Redis is loading"), 600 * time.Millisecond, true, "LOADING"},
	} {
		got := renewalFailure(tc.err, deadline.Add(-tc.left), deadline, ttl)
		if errors.Is(got, ErrRedis) != tc.redis || !strings.Contains(got.Error(), tc.contains) {
			t.Errorf("renewalFailure(%v, sent %v before the deadline) = %v; want ErrRedis %v, saying %q", tc.err, tc.left, got, tc.redis, tc.contains)
		}
	}
}
