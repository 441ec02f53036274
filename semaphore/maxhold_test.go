package semaphore_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
)

// WithMaxHold caps the leases of one handle, replacing the
// client's cap, for a Mutex and an RWMutex as for a Semaphore.
func TestWithMaxHold(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const d = 200 * time.Millisecond
		c := e.Client(fairlock.WithMaxHold(time.Hour))
		mu, err := semaphore.NewMutex(c, "mu", semaphore.WithMaxHold(d))
		if err != nil {
			t.Fatal(err)
		}
		rw, err := semaphore.NewRWMutex(c, "rw", semaphore.WithMaxHold(d))
		if err != nil {
			t.Fatal(err)
		}
		for _, lock := range []func(context.Context) (*fairlock.Lease, error){mu.Lock, rw.RLock} {
			start := time.Now()
			l, err := lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-l.Done():
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: Done not closed within 10s of the cap %v", l.Name(), d)
			}
			if held := time.Since(start); held < d {
				t.Fatalf("%s: Done closed after %v, before the cap %v", l.Name(), held, d)
			}
			fltest.IsErr(t, l.Name()+": Err() at the cap", l.Err(), fairlock.ErrMaxHold)
			fltest.IsErr(t, l.Name()+": Release after the cap", l.Release(ctx), fairlock.ErrMaxHold)
		}
	})
}

// A negative cap fails every constructor.
func TestWithMaxHoldNegative(t *testing.T) {
	e := fltest.New(t, redistest.Mini(t))
	c := e.Client()
	neg := semaphore.WithMaxHold(-time.Second)
	_, err := semaphore.New(c, "s", 2, neg)
	fltest.IsErr(t, "New(WithMaxHold(-1s))", err, fairlock.ErrInvalidArgument)
	_, err = semaphore.NewMutex(c, "m", neg)
	fltest.IsErr(t, "NewMutex(WithMaxHold(-1s))", err, fairlock.ErrInvalidArgument)
	_, err = semaphore.NewRWMutex(c, "rw", neg)
	fltest.IsErr(t, "NewRWMutex(WithMaxHold(-1s))", err, fairlock.ErrInvalidArgument)
	if _, err := semaphore.New(c, "s", 2, nil, semaphore.WithMaxHold(0)); err != nil {
		t.Fatalf("New(nil, WithMaxHold(0)) = %v, want nil", err)
	}
}
