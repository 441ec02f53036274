package semaphore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
)

// WithLeaseTTL gives each lease of one handle its TTL, in place of the
// client's, for a Semaphore, a Mutex and an RWMutex, and for the lease a
// condition's Wait takes again: Redis keeps each grant for that TTL, and
// renewals keep it alive for many TTLs. A handle without the option keeps
// the client's TTL.
func TestWithLeaseTTL(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := fltest.Bounded(t)
		// Renewed every 200 ms; lost only if this process cannot run for
		// about 0.4 s (150 ms leases were lost on a loaded machine).
		const ttl = 600 * time.Millisecond
		c := e.Client() // the default lease TTL, 10s
		s, err := semaphore.New(c, "s", 3, semaphore.WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		mu, err := semaphore.NewMutex(c, "mu", semaphore.WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		rw, err := semaphore.NewRWMutex(c, "rw", semaphore.WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		plain, err := semaphore.NewMutex(c, "plain")
		if err != nil {
			t.Fatal(err)
		}
		expiresIn := func(name string) time.Duration {
			t.Helper()
			st, err := c.Status(ctx, name)
			if err != nil || len(st.Holders) != 1 {
				t.Fatalf("Status(%s) = %+v, %v; want one holder", name, st, err)
			}
			return st.Holders[0].ExpiresIn
		}
		var leases []*fairlock.Lease
		for _, lock := range []func(context.Context) (*fairlock.Lease, error){
			func(ctx context.Context) (*fairlock.Lease, error) { return s.Acquire(ctx, 2) },
			mu.Lock, rw.RLock,
		} {
			l, err := lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if in := expiresIn(l.Name()); in > ttl {
				t.Errorf("%s: expires in %v, past WithLeaseTTL(%v)", l.Name(), in, ttl)
			}
			leases = append(leases, l)
		}
		p, err := plain.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in := expiresIn("plain"); in < fairlock.DefaultLeaseTTL-time.Second {
			t.Errorf("plain: expires in %v, want the client's %v", in, fairlock.DefaultLeaseTTL)
		}
		e.Release(p)

		// A condition's Wait takes the mutex again with the handle's TTL.
		cond := semaphore.NewCond(mu)
		woken := fltest.Async(func() (*fairlock.Lease, error) { return cond.Wait(ctx, leases[1]) })
		e.WaitFor("the Wait to release the mutex", func() bool {
			st, err := c.Status(ctx, "mu")
			return err == nil && len(st.Holders) == 0
		})
		for {
			if n, err := cond.Signal(ctx); err != nil {
				t.Fatal(err)
			} else if n == 1 {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		again := e.Granted(woken)
		leases[1] = again
		time.Sleep(2 * time.Second) // several TTLs, renewed on their cadence
		for _, l := range leases {
			if err := l.Err(); err != nil {
				t.Fatalf("%s: Err() after 2s with WithLeaseTTL(%v) = %v", l.Name(), ttl, err)
			}
			if in := expiresIn(l.Name()); in > ttl {
				t.Errorf("%s after 2s: expires in %v, past WithLeaseTTL(%v)", l.Name(), in, ttl)
			}
			e.Release(l)
		}
	})
}

// A lease TTL out of range fails every constructor with
// ErrInvalidArgument naming it.
func TestWithLeaseTTLRefused(t *testing.T) {
	e := fltest.New(t, redistest.Mini(t))
	c := e.Client()
	for _, d := range []time.Duration{-time.Second, time.Millisecond, fairlock.MaxTTL + time.Second} {
		o := semaphore.WithLeaseTTL(d)
		_, err1 := semaphore.New(c, "s", 2, o)
		_, err2 := semaphore.NewMutex(c, "m", o)
		_, err3 := semaphore.NewRWMutex(c, "rw", o)
		for _, err := range []error{err1, err2, err3} {
			fltest.IsErr(t, "a constructor with WithLeaseTTL("+d.String()+")", err, fairlock.ErrInvalidArgument)
			if err != nil && !strings.Contains(err.Error(), "LeaseTTL") {
				t.Errorf("error %q does not name the lease TTL", err)
			}
		}
	}
	if _, err := semaphore.New(c, "s", 2, semaphore.WithLeaseTTL(0)); err != nil {
		t.Fatalf("New(WithLeaseTTL(0)) = %v, want nil (the client's TTL)", err)
	}
}
