package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
)

func TestMutex(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		m1, err := semaphore.NewMutex(e.Client(), "mu")
		if err != nil {
			t.Fatal(err)
		}
		m2, err := semaphore.NewMutex(e.Client(), "mu")
		if err != nil {
			t.Fatal(err)
		}
		l, err := m1.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = m2.TryLock(ctx)
		fltest.IsErr(t, "TryLock of a locked mutex", err, fairlock.ErrNotAcquired)
		e.Release(l)
		ran := false
		if err := m2.Do(ctx, func(context.Context) error { ran = true; return nil }); err != nil || !ran {
			t.Fatalf("Do = %v, ran %v", err, ran)
		}
		l, err = m1.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after Do released: %v", err)
		}
		e.Release(l)
	})
}

// Readers share; a waiting writer holds back later readers; readers
// queued behind a writer enter together.
func TestRWMutexFair(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		rw := func() *semaphore.RWMutex {
			m, err := semaphore.NewRWMutex(e.Client(), "rw")
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		r1, err := rw().RLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := rw().TryRLock(ctx)
		if err != nil {
			t.Fatalf("second reader: %v", err)
		}
		if _, err := rw().TryLock(ctx); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryLock with readers = %v, want ErrNotAcquired", err)
		}
		w := rw()
		wch := make(chan fltest.Result, 1)
		go func() { l, err := w.Lock(ctx); wch <- fltest.Result{Lease: l, Err: err} }()
		e.WaitQueued("rw", 1)
		if _, err := rw().TryRLock(ctx); !errors.Is(err, fairlock.ErrNotAcquired) {
			t.Fatalf("TryRLock behind a waiting writer = %v, want ErrNotAcquired", err)
		}
		late := make(chan fltest.Result, 2)
		for i := range 2 {
			m := rw()
			go func() { l, err := m.RLock(ctx); late <- fltest.Result{Lease: l, Err: err} }()
			e.WaitQueued("rw", int64(i+2))
		}
		e.Release(r1)
		e.NotYet(wch, "the writer, with a reader inside")
		e.Release(r2)
		wr := e.Receive(wch)
		if wr.Err != nil {
			t.Fatal(wr.Err)
		}
		e.NotYet(late, "a reader, with the writer inside")
		e.Release(wr.Lease)
		for range 2 {
			r := e.Receive(late)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			defer e.Release(r.Lease)
		}
	})
}

// Do cancels its function's context when the lease is lost, and reports
// the loss.
func TestDoCancelsOnLeaseLoss(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	const ttl = 300 * time.Millisecond
	s := newSem(t, e.Client(fairlock.WithLeaseTTL(ttl)), "do", 1)
	started := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- s.Do(context.Background(), 1, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		})
	}()
	<-started
	b.Advance(t, ttl)
	select {
	case err := <-errc:
		fltest.IsErr(t, "Do with a lost lease", err, fairlock.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not return after its lease was lost")
	}
}

// RWMutex.Do holds the write lock while f runs, and RDo a read lock: a
// reader fits beside RDo's f but not beside Do's; both unlock afterwards.
func TestRWMutexDo(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		rw, err := semaphore.NewRWMutex(e.Client(), "rwdo")
		if err != nil {
			t.Fatal(err)
		}
		other, err := semaphore.NewRWMutex(e.Client(), "rwdo")
		if err != nil {
			t.Fatal(err)
		}
		boom := errors.New("boom")
		err = rw.Do(ctx, func(context.Context) error {
			_, err := other.TryRLock(ctx)
			fltest.IsErr(t, "TryRLock inside Do", err, fairlock.ErrNotAcquired)
			return boom
		})
		fltest.IsErr(t, "Do", err, boom)
		err = rw.RDo(ctx, func(context.Context) error {
			l, err := other.TryRLock(ctx)
			if err != nil {
				return fmt.Errorf("TryRLock inside RDo: %w", err)
			}
			e.Release(l)
			_, err = other.TryLock(ctx)
			fltest.IsErr(t, "TryLock inside RDo", err, fairlock.ErrNotAcquired)
			return nil
		})
		if err != nil {
			t.Fatalf("RDo: %v", err)
		}
		// Both unlocked: the write lock is free.
		l, err := other.TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after Do and RDo: %v", err)
		}
		e.Release(l)
	})
}
