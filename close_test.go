package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// closeBy closes c with how: Close, Shutdown or Abandon. The leases the
// tests hold are never released by their holders, so Shutdown gets a
// context that has ended: it ends them at once, as Close does, and says
// how many (a Close after it returns the close's result).
func closeBy(t *testing.T, c *fairlock.Client, how string) error {
	t.Helper()
	switch how {
	case "Close":
		return c.Close()
	case "Shutdown":
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return c.Close()
	case "Abandon":
		return c.Abandon()
	}
	t.Fatalf("no way to close named %q", how)
	return nil
}

// A holder whose process closes its client hands its lease on at once: the
// next waiter, in another process, is granted within a few round trips,
// not when the lease's TTL (10 s) runs out. So it goes for a lease granted
// at once, one granted through the queue and not yet confirmed by a
// renewal (announced), and one over several semaphores.
func TestCloseHandsOn(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, how := range []string{"Close", "Shutdown"} {
			for _, kind := range []string{"granted", "announced", "multi"} {
				t.Run(how+"/"+kind, func(t *testing.T) {
					e := fltest.New(t, b)
					ctx := context.Background()
					holder := e.Client(fairlock.WithLeaseTTL(10 * time.Second))
					waiter := e.Client() // another process: a client and a connection pool of its own
					var held *fairlock.Lease
					var err error
					switch kind {
					case "granted":
						held, err = newSem(holder, "handoff", 1).Acquire(ctx, 1)
					case "announced":
						// Granted through the queue when another lets go:
						// its first renewal, which confirms it, is seconds
						// away.
						first, err := newSem(waiter, "handoff", 1).Acquire(ctx, 1)
						if err != nil {
							t.Fatal(err)
						}
						ch := acquireAsync(ctx, newSem(holder, "handoff", 1), 1)
						e.WaitQueued("handoff", 1)
						e.Release(first)
						held = e.Granted(ch)
					case "multi":
						held, err = holder.AcquireAll(ctx,
							fairlock.Request{Name: "handoff", Capacity: 1, Permits: 1},
							fairlock.Request{Name: "other", Capacity: 1, Permits: 1})
					}
					if err != nil {
						t.Fatal(err)
					}
					waiting := acquireAsync(ctx, newSem(waiter, "handoff", 1), 1)
					e.WaitQueued("handoff", 1)
					start := time.Now()
					if err := closeBy(t, holder, how); err != nil {
						t.Fatalf("%s: %v", how, err)
					}
					closed := time.Since(start)
					l := e.Granted(waiting)
					took := time.Since(start)
					t.Logf("%s: %s returned in %v; the waiter was granted %v after it began", b.Name, how, closed, took)
					if took > time.Second {
						t.Fatalf("the waiter was granted %v after the holder's %s began, want well under the lease TTL of 10 s", took, how)
					}
					fltest.IsErr(t, "Err() of the closed holder's lease", held.Err(), fairlock.ErrClosed)
					e.Release(l)
					st, err := waiter.Status(ctx, "other")
					if err != nil || st.Held != 0 {
						t.Fatalf("Status of the other semaphore: %+v, %v; want nothing held", st, err)
					}
				})
			}
		}
	})
}

// Abandon leaves the leases in Redis: the next waiter waits until the
// lease's TTL runs out, as after a crash.
func TestAbandonWaitsOutTheTTL(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const ttl = 900 * time.Millisecond
		holder := e.Client(fairlock.WithLeaseTTL(ttl))
		held, err := newSem(holder, "abandoned", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		waiting := acquireAsync(ctx, newSem(e.Client(), "abandoned", 1), 1)
		e.WaitQueued("abandoned", 1)
		start := time.Now()
		if err := holder.Abandon(); err != nil {
			t.Fatalf("Abandon: %v", err)
		}
		fltest.IsErr(t, "Err() of the abandoned lease", held.Err(), fairlock.ErrClosed)
		l := e.Granted(waiting)
		took := time.Since(start)
		t.Logf("%s: the waiter was granted %v after Abandon (lease TTL %v)", b.Name, took, ttl)
		// Renewed every third of the TTL, the lease had at least two
		// thirds of it (600 ms) left in Redis when Abandon began.
		if took < ttl/3 {
			t.Fatalf("the waiter was granted %v after Abandon, want the lease's TTL waited out", took)
		}
		e.Release(l)
	})
}

// refusing is a go-redis hook that fails every command with a refused
// connection while down is set, as go-redis reports a Redis that is not
// running: an error that passes, so releases are sent again until their
// bound.
type refusing struct{ down atomic.Bool }

func (r *refusing) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *refusing) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (r *refusing) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if r.down.Load() {
			err := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// With Redis down, Close still returns within its bound (one waiter TTL,
// the releases sent again until then), saying that the leases could not be
// released; Shutdown returns by its context's end, and a Close after it
// waits for the rest of the same close.
func TestCloseRedisDown(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const waiterTTL = 500 * time.Millisecond
		for _, how := range []string{"Close", "Shutdown"} {
			t.Run(how, func(t *testing.T) {
				e := fltest.New(t, b)
				ctx := context.Background()
				hook := &refusing{}
				rdb := b.Client(t)
				rdb.AddHook(hook)
				c := e.ClientOn(rdb, fairlock.WithWaiterTTL(waiterTTL))
				var leases []*fairlock.Lease
				for i := range 3 {
					l, err := newSem(c, fmt.Sprintf("down%d", i), 1).Acquire(ctx, 1)
					if err != nil {
						t.Fatal(err)
					}
					leases = append(leases, l)
				}
				hook.down.Store(true)
				start := time.Now()
				if how == "Shutdown" {
					sctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					err := c.Shutdown(sctx)
					cancel()
					took := time.Since(start)
					t.Logf("%s: Shutdown returned in %v: %v", b.Name, took, err)
					fltest.IsErr(t, "Shutdown with Redis down", err, context.DeadlineExceeded)
					if took > waiterTTL {
						t.Fatalf("Shutdown with a 100 ms context returned in %v", took)
					}
				}
				err := c.Close()
				took := time.Since(start)
				t.Logf("%s: Close returned in %v (waiter TTL %v): %v", b.Name, took, waiterTTL, err)
				fltest.IsErr(t, "Close with Redis down", err, fairlock.ErrRedis)
				if took > waiterTTL+2*time.Second {
					t.Fatalf("Close with Redis down returned in %v, want about the waiter TTL (%v)", took, waiterTTL)
				}
				for _, l := range leases {
					fltest.IsErr(t, "Err() of a lease Close could not release", l.Err(), fairlock.ErrClosed)
				}
				if err := c.Close(); err == nil || !errors.Is(err, fairlock.ErrRedis) {
					t.Fatalf("second Close = %v, want the first's result", err)
				}
			})
		}
	})
}

// refuseReleases is a go-redis hook that fails the first n release
// scripts sent with a refused connection, an error that passes.
type refuseReleases struct{ n, seen atomic.Int64 }

func (r *refuseReleases) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *refuseReleases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (r *refuseReleases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 3 {
			nkeys, _ := args[2].(int)
			if i := 3 + nkeys; i < len(args) && args[i] == "release" && r.seen.Add(1) <= r.n.Load() {
				err := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// A release Close sends that meets an error that passes is sent again, with
// backoff, until it lands: the next waiter is granted and Close returns
// nil.
func TestCloseSendsAgain(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		hook := &refuseReleases{}
		rdb := b.Client(t)
		rdb.AddHook(hook)
		holder := e.ClientOn(rdb, fairlock.WithLeaseTTL(10*time.Second))
		held, err := newSem(holder, "again", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		waiting := acquireAsync(ctx, newSem(e.Client(), "again", 1), 1)
		e.WaitQueued("again", 1)
		hook.n.Store(3)
		start := time.Now()
		if err := holder.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		l := e.Granted(waiting)
		t.Logf("%s: the waiter was granted %v after Close began, its release refused %d times first", b.Name, time.Since(start), hook.n.Load())
		if sent := hook.seen.Load(); sent < 4 {
			t.Fatalf("the release was sent %d times, want 3 refused and one that landed", sent)
		}
		if time.Since(start) > 5*time.Second {
			// Half the lease TTL: the release landed, the lease did not expire.
			t.Fatalf("the waiter was granted %v after Close, want well under the lease TTL (10s)", time.Since(start))
		}
		fltest.IsErr(t, "Err() of the closed holder's lease", held.Err(), fairlock.ErrClosed)
		e.Release(l)
	})
}

// Close and Shutdown release every lease of a client holding a thousand,
// a few at a time: Status, read by another client, shows none held.
func TestCloseReleasesThousands(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		n := 1000
		if b.Mini != nil && redistest.Race {
			// miniredis's Lua interpreter under the race detector runs a
			// release in tens of milliseconds, one at a time.
			n = 200
		}
		for _, how := range []string{"Close", "Shutdown"} {
			t.Run(how, func(t *testing.T) {
				e := fltest.New(t, b)
				ctx := context.Background()
				// Close's releases get one waiter TTL. miniredis runs a
				// release script in milliseconds, not tens of
				// microseconds, one at a time: give it time.
				var opts []fairlock.Option
				if b.Mini != nil {
					opts = append(opts, fairlock.WithWaiterTTL(time.Minute))
				}
				c := e.Client(opts...)
				names := []string{"many0", "many1", "many2", "many3"}
				leases := make([]*fairlock.Lease, n)
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for w := range 8 {
					wg.Go(func() {
						for i := w; i < n; i += 8 {
							l, err := newSem(c, names[i%len(names)], int64(n)).TryAcquire(ctx, 1)
							if err != nil {
								errs <- err
								return
							}
							leases[i] = l
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				other := e.Client()
				for _, name := range names {
					if st, err := other.Status(ctx, name); err != nil || st.Held != int64(n/len(names)) {
						t.Fatalf("Status of %s before %s: %+v, %v", name, how, st, err)
					}
				}
				start := time.Now()
				if err := closeBy(t, c, how); err != nil {
					t.Fatalf("%s: %v", how, err)
				}
				t.Logf("%s: %s released %d leases in %v", b.Name, how, n, time.Since(start))
				for _, l := range leases {
					select {
					case <-l.Done():
					default:
						t.Fatalf("a lease's Done is open after %s returned", how)
					}
					fltest.IsErr(t, "Err() of a released lease", l.Err(), fairlock.ErrClosed)
				}
				for _, name := range names {
					st, err := other.Status(ctx, name)
					if err != nil || st.Held != 0 || st.InUse != 0 {
						t.Fatalf("Status of %s after %s: held %d, in use %d (%v); want none", name, how, st.Held, st.InUse, err)
					}
				}
			})
		}
	})
}

// releases is a go-redis hook that counts, by ticket, the release scripts
// Redis ran (those that returned a reply: a script refused before it ran,
// for want of its SHA or its flags, is sent again).
type releases struct {
	mu       sync.Mutex
	byTicket map[string]int
}

func (r *releases) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *releases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (r *releases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		args := cmd.Args()
		if c, ok := cmd.(*redis.Cmd); !ok || err != nil || c.Err() != nil || c.Val() == nil || len(args) < 3 {
			return err // not a script, or one that ran nothing (NOSCRIPT, no FCALL...)
		}
		nkeys, _ := args[2].(int)
		if i := 3 + nkeys; i+1 < len(args) && args[i] == "release" {
			ticket, _ := args[i+1].(string)
			r.mu.Lock()
			if r.byTicket == nil {
				r.byTicket = map[string]int{}
			}
			r.byTicket[ticket]++
			r.mu.Unlock()
		}
		return err
	}
}

// endCounter is an Observer that counts each lease's ends (released or
// lost) by event ID.
type endCounter struct {
	mu   sync.Mutex
	ends map[uint64]int
}

func (o *endCounter) Observe(e fairlock.Event) {
	if e.Kind != fairlock.LeaseReleased && e.Kind != fairlock.LeaseLost {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ends == nil {
		o.ends = map[uint64]int{}
	}
	o.ends[e.ID]++
}

// A Release racing Close releases the lease once, whichever comes first:
// the Release returns nil (it came first) or an error matching ErrClosed
// (Close did), one release script runs per lease, and each lease ends
// once for an observer.
func TestReleaseRacingClose(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const n = 200
		for round := range 3 {
			t.Run(fmt.Sprint(round), func(t *testing.T) {
				e := fltest.New(t, b)
				ctx := context.Background()
				count := &releases{}
				rdb := b.Client(t)
				rdb.AddHook(count)
				obs := &endCounter{}
				c := e.ClientOn(rdb, fairlock.WithObserver(obs))
				leases := make([]*fairlock.Lease, n)
				for i := range leases {
					l, err := newSem(c, "race", n).TryAcquire(ctx, 1)
					if err != nil {
						t.Fatal(err)
					}
					leases[i] = l
				}
				start := make(chan struct{})
				var wg sync.WaitGroup
				var released, closed atomic.Int64
				for i, l := range leases {
					wg.Go(func() {
						<-start
						// Spread over a few milliseconds, so that some
						// come before Close reaches their lease and some
						// after.
						time.Sleep(time.Duration(i%40) * 100 * time.Microsecond)
						switch err := l.Release(ctx); {
						case err == nil:
							released.Add(1)
						case errors.Is(err, fairlock.ErrClosed):
							closed.Add(1)
						default:
							t.Errorf("Release racing Close = %v, want nil or ErrClosed", err)
						}
					})
				}
				wg.Go(func() {
					<-start
					if err := c.Close(); err != nil {
						t.Errorf("Close: %v", err)
					}
				})
				close(start)
				wg.Wait()
				t.Logf("%s: %d released by their holders, %d by Close", b.Name, released.Load(), closed.Load())
				count.mu.Lock()
				defer count.mu.Unlock()
				if len(count.byTicket) != n {
					t.Fatalf("release scripts ran for %d tickets, want %d", len(count.byTicket), n)
				}
				for ticket, k := range count.byTicket {
					if k != 1 {
						t.Fatalf("the release of ticket %s ran %d times", ticket, k)
					}
				}
				obs.mu.Lock()
				defer obs.mu.Unlock()
				if len(obs.ends) != n {
					t.Fatalf("%d leases ended for the observer, want %d", len(obs.ends), n)
				}
				for id, k := range obs.ends {
					if k != 1 {
						t.Fatalf("lease %d ended %d times for the observer", id, k)
					}
				}
				if st, err := e.Client().Status(ctx, "race"); err != nil || st.Held != 0 {
					t.Fatalf("Status after the race: held %d (%v)", st.Held, err)
				}
			})
		}
	})
}

// Close releases the leases held when it begins, and leases granted while
// it runs (at once, through the queue, over several semaphores) are given
// back: once every call on the closing client has returned, nothing it
// held or queued is left in Redis.
func TestCloseWhileAcquiring(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for round := range 3 {
			t.Run(fmt.Sprint(round), func(t *testing.T) {
				e := fltest.New(t, b)
				ctx := context.Background()
				c := e.Client()
				a := fairlock.Request{Name: "busy-a", Capacity: 2, Permits: 1}
				bb := fairlock.Request{Name: "busy-b", Capacity: 2, Permits: 1}
				var wg sync.WaitGroup
				var grants atomic.Int64
				var mu sync.Mutex
				var got []*fairlock.Lease
				stop := make(chan struct{})
				for w := range 6 {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							var l *fairlock.Lease
							var err error
							switch w % 3 {
							case 0:
								l, err = c.Acquire(ctx, a)
							case 1:
								l, err = c.TryAcquire(ctx, bb)
							case 2:
								l, err = c.AcquireAll(ctx, a, bb)
							}
							if errors.Is(err, fairlock.ErrClosed) {
								return
							}
							if err != nil {
								continue
							}
							grants.Add(1)
							mu.Lock()
							got = append(got, l)
							mu.Unlock()
							// Hold a few milliseconds, or until the lease
							// ends (Close): what Close ends is left to it.
							select {
							case <-l.Done():
								continue
							case <-time.After(5 * time.Millisecond):
							}
							if err := l.Release(ctx); err != nil && !errors.Is(err, fairlock.ErrClosed) {
								t.Errorf("Release: %v", err)
							}
						}
					})
				}
				e.WaitFor("grants", func() bool { return grants.Load() > 20 })
				if err := c.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				close(stop)
				wg.Wait()
				t.Logf("%s: %d grants before Close", b.Name, grants.Load())
				for _, l := range got {
					if l.Err() == nil {
						t.Fatal("a lease of the closed client is still held")
					}
				}
				other := e.Client()
				for _, name := range []string{a.Name, bb.Name} {
					st, err := other.Status(ctx, name)
					if err != nil || st.Held != 0 || st.Queued != 0 {
						t.Fatalf("Status of %s after Close: held %d, queued %d (%v); want nothing", name, st.Held, st.Queued, err)
					}
				}
			})
		}
	})
}

// failLeaves is a go-redis hook that, once armed, fails every withdrawal
// (release.lua's "leave") with err, without sending it.
type failLeaves struct {
	armed atomic.Bool
	err   error
}

func (f *failLeaves) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failLeaves) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *failLeaves) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 3 && f.armed.Load() {
			nkeys, _ := args[2].(int)
			if i := 3 + nkeys; i < len(args) && args[i] == "leave" {
				cmd.SetErr(f.err)
				return f.err
			}
		}
		return next(ctx, cmd)
	}
}

// When the withdrawals of the waits Close ended do not land, Close says
// so: its error matches ErrRedis and the last failure, and says how many
// of how many failed; each of those Acquire calls still returns ErrClosed,
// its ticket left in its queue (to end at its waiter TTL). So it goes
// for a withdrawal that fails at once (an error that does not pass) and
// for one sent again until the close's bound (an error that passes). Half
// of the Acquire calls can end by their context (their withdrawal runs on
// a goroutine of the client's), half cannot (it runs on the caller's).
func TestCloseReportsFailedWithdrawals(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const waiterTTL = 500 * time.Millisecond
		for _, tc := range []struct {
			name string
			err  error
		}{
			{"failing", errors.New("test: withdrawal refused")},
			{"timing out", fmt.Errorf("test: withdrawal timed out: %w", context.DeadlineExceeded)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				const n = 4
				e := fltest.New(t, b)
				other := e.Client()
				hook := &failLeaves{err: tc.err}
				rdb := b.Client(t)
				rdb.AddHook(hook)
				c := e.ClientOn(rdb, fairlock.WithWaiterTTL(waiterTTL))
				var blocked []<-chan fltest.Result
				for i := range n {
					name := fmt.Sprintf("w%d", i)
					held, err := newSem(other, name, 1).Acquire(context.Background(), 1)
					if err != nil {
						t.Fatal(err)
					}
					defer e.Release(held)
					ctx := context.Background()
					if i%2 == 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithCancel(ctx)
						defer cancel()
					}
					blocked = append(blocked, acquireAsync(ctx, newSem(c, name, 1), 1))
					e.WaitQueued(name, 1)
				}
				hook.armed.Store(true)
				start := time.Now()
				err := c.Close()
				t.Logf("%s: Close returned in %v: %v", b.Name, time.Since(start), err)
				fltest.IsErr(t, "Close whose withdrawals failed", err, fairlock.ErrRedis)
				fltest.IsErr(t, "Close whose withdrawals failed", err, tc.err)
				if want := fmt.Sprintf("%d of %d acquisitions", n, n); err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("Close = %v, want it to say %q", err, want)
				}
				// The tickets are still queued: the error says what happened.
				for i := range n {
					q, err := e.RDB.ZCard(context.Background(), e.Key(fmt.Sprintf("w%d", i), "q")).Result()
					if err != nil || q != 1 {
						t.Fatalf("queue of w%d when Close returned: %d tickets (%v), want the one left", i, q, err)
					}
				}
				for i, ch := range blocked {
					r := e.Receive(ch)
					fltest.IsErr(t, fmt.Sprintf("Acquire %d, blocked at Close", i), r.Err, fairlock.ErrClosed)
				}
			})
		}
	})
}

// stallScript is a go-redis hook that, once armed, lets the next script
// command run in Redis and holds its reply back until release closes.
type stallScript struct {
	armed   atomic.Bool
	held    chan struct{} // closed once the script has run
	release chan struct{}
}

func (s *stallScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *stallScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (s *stallScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "evalsha", "eval", "fcall":
			if s.armed.CompareAndSwap(true, false) {
				err := next(ctx, cmd)
				close(s.held)
				<-s.release
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// A grant that raced Close (its reply came once the close had begun) is
// given back; when that does not land, Close says so, as for a wait it
// ended, and the Acquire returns ErrClosed.
func TestCloseReportsAGrantNotGivenBack(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		fail := &failLeaves{err: errors.New("test: give-back refused")}
		stall := &stallScript{held: make(chan struct{}), release: make(chan struct{})}
		rdb := b.Client(t)
		rdb.AddHook(fail)
		rdb.AddHook(stall)
		c := e.ClientOn(rdb)
		// "full" is held elsewhere: c's TryAcquire on it, which tells when
		// the close has begun, is never granted (a grant would race the
		// close too).
		held, err := e.Client().TryAcquire(ctx, fairlock.Request{Name: "full", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(held)
		stall.armed.Store(true)
		acquired := acquireAsync(ctx, newSem(c, "raced", 1), 1)
		<-stall.held // granted in Redis, the reply held back
		fail.armed.Store(true)
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		e.WaitFor("the close to begin", func() bool {
			_, err := c.TryAcquire(ctx, fairlock.Request{Name: "full", Capacity: 1, Permits: 1})
			return errors.Is(err, fairlock.ErrClosed)
		})
		close(stall.release)
		select {
		case err = <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return")
		}
		t.Logf("%s: Close = %v", b.Name, err)
		fltest.IsErr(t, "Close whose give-back failed", err, fairlock.ErrRedis)
		fltest.IsErr(t, "Close whose give-back failed", err, fail.err)
		if want := "1 of 1 acquisitions"; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Close = %v, want it to say %q", err, want)
		}
		r := e.Receive(acquired)
		fltest.IsErr(t, "the Acquire whose grant raced Close", r.Err, fairlock.ErrClosed)
	})
}
