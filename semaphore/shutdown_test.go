package semaphore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// renewals is an Observer that signals each renewal of a lease.
type renewals chan struct{}

func (r renewals) Observe(e fairlock.Event) {
	if e.Kind == fairlock.LeaseRenewed {
		select {
		case r <- struct{}{}:
		default:
		}
	}
}

// Shutdown waits for the work under the client's leases: a lease held
// inside Do, or by a plain Acquire, stays held and renewed, and nobody
// else is granted it, until its holder lets it go or Shutdown's context
// ends. Meanwhile the client refuses new work and its blocked Acquire
// calls leave their queues at once. A Do whose f returns first releases
// and returns nil, and Shutdown returns nil; at ctx's end Shutdown ends
// the lease (f's context first), says it had to end one, and the next
// waiter is granted only then; f returning after that gets the close's
// error from Do.
func TestShutdownWaitsForTheWork(t *testing.T) {
	rows := []struct {
		name   string
		do     bool // held inside Do, or by a plain Acquire (Lock)
		ctxEnd bool // Shutdown's context ends while the work runs
	}{
		{"Do/f returns first", true, false},
		{"Lock/released first", false, false},
		{"Do/ctx ends first", true, true},
		{"Lock/ctx ends first", false, true},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, row := range rows {
			t.Run(row.name, func(t *testing.T) {
				e := fltest.New(t, b)
				ctx := fltest.Bounded(t)
				renewed := make(renewals, 1)
				// A short lease TTL: renewals come every 200 ms.
				holder := e.Client(fairlock.WithLeaseTTL(600*time.Millisecond), fairlock.WithObserver(renewed))
				other := e.Client() // another process
				work := newSem(t, holder, "work", 1)

				// The work: f (or the code holding a plain lease) runs
				// until told to finish.
				finish := make(chan struct{})
				var fctx context.Context
				var lease *fairlock.Lease
				doErr := make(chan error, 1)
				if row.do {
					inside := make(chan context.Context, 1)
					go func() {
						doErr <- work.Do(ctx, 1, func(fctx context.Context) error {
							inside <- fctx
							<-finish
							return nil
						})
					}()
					select {
					case fctx = <-inside:
					case <-ctx.Done():
						t.Fatal("Do did not run f")
					}
				} else {
					var err error
					if lease, err = work.Acquire(ctx, 1); err != nil {
						t.Fatal(err)
					}
					var cancel context.CancelFunc
					fctx, cancel = fairlock.LeaseContext(ctx, lease)
					defer cancel()
				}
				// Another process waits for the work's semaphore; the
				// closing client waits for one another process holds.
				waiting := acquireAsync(ctx, newSem(t, other, "work", 1), 1)
				e.WaitQueued("work", 1)
				busy, err := newSem(t, other, "busy", 1).Acquire(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				blocked := acquireAsync(ctx, newSem(t, holder, "busy", 1), 1)
				e.WaitQueued("busy", 1)

				sctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				shut := make(chan error, 1)
				go func() { shut <- holder.Shutdown(sctx) }()

				// Refused at once: the blocked Acquire leaves its queue,
				// new calls fail.
				fltest.IsErr(t, "a blocked Acquire during Shutdown", e.Receive(blocked).Err, fairlock.ErrClosed)
				e.WaitQueued("busy", 0)
				_, err = newSem(t, holder, "fresh", 1).TryAcquire(ctx, 1)
				fltest.IsErr(t, "TryAcquire during Shutdown", err, fairlock.ErrClosed)
				e.Release(busy)

				// The work goes on under its lease: renewed twice after
				// Shutdown began (the first signal may be older: renewed
				// holds one), and nobody else granted.
				for range 3 {
					select {
					case <-renewed:
					case <-fctx.Done():
						t.Fatalf("the work's context ended during Shutdown, before its holder let go: %v", context.Cause(fctx))
					case <-ctx.Done():
						t.Fatal("the lease was not renewed during Shutdown")
					}
				}
				if err := context.Cause(fctx); err != nil {
					t.Fatalf("the work's context ended during Shutdown, before its holder let go: %v", err)
				}
				e.NotYet(waiting, "another process's Acquire while the work runs")
				select {
				case err := <-shut:
					t.Fatalf("Shutdown returned %v while the work ran", err)
				default:
				}
				if st, err := other.Status(ctx, "work"); err != nil || st.Held != 1 {
					t.Fatalf("Status while the work runs: held %d (%v), want 1", st.Held, err)
				}

				if !row.ctxEnd {
					// The work ends and lets go of its lease.
					if row.do {
						close(finish)
						if err := <-doErr; err != nil {
							t.Fatalf("Do whose f succeeded during Shutdown = %v, want nil", err)
						}
					} else if err := lease.Release(ctx); err != nil {
						t.Fatalf("Release during Shutdown = %v, want nil", err)
					}
					if err := <-shut; err != nil {
						t.Fatalf("Shutdown after the work let go = %v, want nil", err)
					}
					e.Release(e.Granted(waiting))
					return
				}
				// Shutdown's context ends while the work runs: the lease
				// ends (the work's context first), then it is released.
				cancel()
				err = <-shut
				fltest.IsErr(t, "Shutdown whose context ended", err, context.Canceled)
				if !strings.Contains(err.Error(), "1 lease still held") {
					t.Fatalf("Shutdown whose context ended = %v, want it to say it ended 1 lease", err)
				}
				l := e.Granted(waiting)
				select {
				case <-fctx.Done():
				default:
					t.Fatal("another process was granted before the work's context ended")
				}
				fltest.IsErr(t, "the work's context's cause", context.Cause(fctx), fairlock.ErrClosed)
				if row.do {
					close(finish) // f returns after ctx's end
					fltest.IsErr(t, "Do whose lease Shutdown ended", <-doErr, fairlock.ErrClosed)
				} else {
					fltest.IsErr(t, "Release after Shutdown ended the lease", lease.Release(ctx), fairlock.ErrClosed)
				}
				e.Release(l)
				if err := holder.Close(); err != nil && !errors.Is(err, context.Canceled) {
					t.Fatalf("Close after Shutdown = %v", err)
				}
			})
		}
	})
}

// An idle client (no lease, no waiter, no background work: never used, or
// whose leases were all released) shuts down at once: Shutdown returns
// nil whatever its context, an ended one included.
func TestShutdownIdle(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		for _, used := range []bool{false, true} {
			for i := range 20 {
				c := e.Client()
				if used {
					l, err := newSem(t, c, "idle", 1).Acquire(context.Background(), 1)
					if err != nil {
						t.Fatal(err)
					}
					e.Release(l)
				}
				if err := c.Shutdown(ended); err != nil {
					t.Fatalf("Shutdown of an idle client (used %v, try %d) with an ended context = %v, want nil", used, i, err)
				}
			}
		}
	})
}

// A Close or Abandon during Shutdown's wait ends it at once, as
// http.Server.Close does: the lease still held ends, released as the
// Shutdown decided (Abandon too), the next waiter is granted, and the
// Shutdown returns the close's result.
func TestCloseDuringShutdown(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, how := range []string{"Close", "Abandon"} {
			t.Run(how, func(t *testing.T) {
				e := fltest.New(t, b)
				ctx := fltest.Bounded(t)
				// A lease left to expire would keep the waiter a minute.
				holder, other := e.Client(fairlock.WithLeaseTTL(time.Minute)), e.Client()
				lease, err := newSem(t, holder, "work", 1).Acquire(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				waiting := acquireAsync(ctx, newSem(t, other, "work", 1), 1)
				e.WaitQueued("work", 1)
				shut := make(chan error, 1)
				go func() { shut <- holder.Shutdown(context.Background()) }()
				e.WaitFor("Shutdown to refuse new work", func() bool {
					_, err := newSem(t, holder, "fresh", 1).TryAcquire(ctx, 1)
					return errors.Is(err, fairlock.ErrClosed)
				})
				select {
				case <-lease.Done():
					t.Fatalf("the lease ended during Shutdown's wait: %v", lease.Err())
				default:
				}
				closed := make(chan error, 1)
				go func() {
					if how == "Close" {
						closed <- holder.Close()
					} else {
						closed <- holder.Abandon()
					}
				}()
				select {
				case err = <-closed:
				case <-ctx.Done():
					t.Fatalf("%s during Shutdown's wait for the holder did not return", how)
				}
				if err != nil {
					t.Fatalf("%s during Shutdown = %v, want nil", how, err)
				}
				fltest.IsErr(t, "Err() of the lease "+how+" ended", lease.Err(), fairlock.ErrClosed)
				if err := <-shut; err != nil {
					t.Fatalf("Shutdown ended by %s = %v, want nil", how, err)
				}
				e.Release(e.Granted(waiting)) // released, not left to its TTL
			})
		}
	})
}
