package fairlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Closing a client. Close and Shutdown release the leases the client
// holds, so that the next waiters are granted at once rather than when the
// leases' TTL runs out; Abandon leaves them in Redis to expire. The first
// of the three to be called decides which; each stops new grants, ends
// blocked waits, and waits, within its bound, for the client's background
// work.

// closeFanOut bounds the releases Close sends at once: enough to release
// thousands of leases in a few round trips' time, few enough not to drain
// the connection pool that other clients of the same go-redis client use.
const closeFanOut = 16

// shutdownState is one close of a client: set, with Client.closed, by the first
// Close, Shutdown or Abandon.
type shutdownState struct {
	release bool          // release the leases (Close, Shutdown), or leave them (Abandon)
	by      time.Time     // when releases give up: one waiter TTL from the close
	done    chan struct{} // closed when the close's work has ended
	leases  int           // leases held when the close began
	pending atomic.Int64  // of those, releases not yet landed (nor given up)
	failed  atomic.Int64  // releases that did not land
	lastErr atomic.Value  // error: why the last of those did not
	err     error         // set before done closes: releases that did not land
}

// fail notes a release that did not land, for err.
func (s *shutdownState) fail(err error) {
	s.failed.Add(1)
	s.lastErr.Store(err)
}

var (
	// errClosedReleased is the cause a lease ends with when Close or
	// Shutdown releases it: it matches ErrClosed.
	errClosedReleased error = &subError{"fairlock: client closed, lease released", ErrClosed}
	// errClosedAbandoned is the cause a lease ends with when Abandon
	// leaves it to expire: it matches ErrClosed.
	errClosedAbandoned error = &subError{"fairlock: client closed, lease left to expire", ErrClosed}
)

// Shutdown closes the client as [Client.Close] does, releasing the leases
// it holds, but returns by ctx's end: as net/http's Server.Shutdown, it
// begins the close, waits for it while ctx lasts, and returns nil once
// every lease it held is released (a lease found already lost or expired
// counts: Shutdown has nothing left to do for it) and every background
// task has ended. If ctx ends first, Shutdown returns an error for which
// errors.Is(err, ctx.Err()) holds and that says how many releases had not
// landed; the close goes on in the background, bounded as Close's is (one
// waiter TTL from its start, plus go-redis's ReadTimeout for a command
// already sent to a Redis that does not answer), and leases not released
// by then expire at their TTL. A ctx already done begins the close all the
// same. Shutdown's other error is Close's: releases that could not land
// within that bound (Redis down), matching [ErrRedis].
//
// Close, Shutdown and [Client.Abandon] may be called many times and
// concurrently: the first begins the close and decides whether leases are
// released (Close, Shutdown) or left to expire (Abandon); a later call
// waits for that close as its own bound allows and returns its result.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.shutdown(ctx, true)
}

// Abandon closes the client without releasing the leases it holds: it
// stops renewing them, so their Done channels close (with a cause matching
// [ErrClosed]) and Redis drops them when their TTL runs out. Otherwise it
// is [Client.Close]: blocked waits end with ErrClosed (leaving their
// queues), later calls fail with ErrClosed, and Abandon waits for the
// client's background work, as long as Close would. It returns nil, or,
// when Close or Shutdown began the close, that close's result.
//
// Use Abandon when the leases must outlive the process: say a process
// hands its work to a successor that takes the work over under the same
// leases' protection by fencing token, or one that exits while a child it
// started still works on the resource, so that nobody else is granted the
// resource until the TTL says the work is surely over. The cost is the one
// of a crash: each semaphore's next waiter waits until the lease's TTL
// runs out ([WithLeaseTTL], 10 s by default) after the last renewal. A
// [Lease.Release] after Abandon still releases the lease at once.
func (c *Client) Abandon() error {
	return c.shutdown(context.Background(), false)
}

// shutdown runs Close (release), Shutdown (release, ctx) and Abandon (not
// release): the first call begins the close, every call waits for it
// while ctx lasts.
func (c *Client) shutdown(ctx context.Context, release bool) error {
	c.mu.Lock()
	s := c.shut
	if s == nil {
		s = &shutdownState{release: release, by: time.Now().Add(c.cfg.waiterTTL), done: make(chan struct{})}
		c.shut = s
		c.closed, c.waits.closed = true, true
		c.closeAll() // blocked waits leave their queues, blocking reads end
		var listening []*listener
		for _, ls := range c.waits.listeners {
			listening = append(listening, ls...)
		}
		closeBlk := c.waits.closeBlk
		leases := make([]*Lease, 0, len(c.leases))
		for l := range c.leases {
			leases = append(leases, l)
		}
		s.leases = len(leases)
		if release {
			s.pending.Store(int64(len(leases)))
		}
		c.mu.Unlock()
		if ctx.Done() == nil {
			c.stop(s, leases, listening, closeBlk)
		} else {
			go c.stop(s, leases, listening, closeBlk)
		}
	} else {
		c.mu.Unlock()
	}
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
	}
	select {
	case <-s.done: // done as ctx ended: say so rather than ctx's error
		return s.err
	default:
	}
	if n := s.pending.Load(); n > 0 {
		return opError("shutdown", nil, fmt.Errorf("%w: %d of %d leases not yet released; their releases go on in the background for at most one waiter TTL from the close", ctx.Err(), n, s.leases))
	}
	return opError("shutdown", nil, fmt.Errorf("%w: the client's background work had not ended (it goes on for at most one waiter TTL from the close)", ctx.Err()))
}

// stop does the close's work: it releases or abandons leases, ends the
// blocking reads of listening, and waits for every goroutine the client
// started; then it closes s.done.
func (c *Client) stop(s *shutdownState, leases []*Lease, listening []*listener, closeBlk func() error) {
	var releases sync.WaitGroup
	if s.release {
		work := make(chan *Lease)
		for range min(len(leases), closeFanOut) {
			releases.Go(func() {
				for l := range work {
					if err := l.releaseAtClose(s.by); err != nil {
						s.fail(err)
					}
					s.pending.Add(-1)
				}
			})
		}
		go func() {
			for _, l := range leases {
				work <- l
			}
			close(work)
		}()
	} else {
		for _, l := range leases {
			l.abandon(errClosedAbandoned)
		}
	}
	if closeBlk != nil {
		// Closing its connections ends every BLPOP in flight.
		_ = closeBlk()
	} else {
		// A listener blocked in BLPOP would otherwise stay blocked until
		// its timeout; an entry on its control list ends it now.
		for _, l := range listening {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = nudgeScript.on(ctx, c.b, []string{c.waits.ctlOf(l)}, c.waiterMs)
			cancel()
		}
	}
	releases.Wait()
	c.wg.Wait()
	c.mu.Lock()
	for c.tasks > 0 {
		c.tasksDone.Wait()
	}
	c.mu.Unlock()
	if n := s.failed.Load(); n > 0 {
		err, _ := s.lastErr.Load().(error)
		s.err = opError("close", nil, fmt.Errorf("%w: %d of %d leases could not be released (last: %w); Redis ends them when their TTL runs out", ErrRedis, n, s.leases, err))
	}
	close(s.done)
}

// releaseAtClose ends the lease for its client's Close: its Done closes,
// with errClosedReleased as cause, and its release is sent, and sent again
// after an error that passes, until it lands or by (or the lease's own
// deadline, past which Redis has dropped it anyway). The lease ends before
// the release is sent, so that work watching Done or a LeaseContext
// learns of it before the next holder can be granted. It returns why the
// release did not land, or nil: landed, found the lease already gone, or
// left to its holder, whose Release or condition wait took it first.
func (l *Lease) releaseAtClose(by time.Time) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	oc, until := l.endAtClose(by)
	after := l.atClose
	l.mu.Unlock()
	err := l.c.sendUntil(oc, l.p, until)
	if after != nil && err == nil {
		ctx, cancel := context.WithDeadline(context.Background(), by)
		after(ctx)
		cancel()
	}
	return err
}

// endAtClose stops renewing the lease, marks it released by Close and ends
// it (with errClosedReleased, unless it had already ended), and returns
// its release's arguments and until when to send them: by, or the lease's
// deadline if sooner. Called with l.mu held, on a lease not released.
func (l *Lease) endAtClose(by time.Time) (oc opCall, until time.Time) {
	l.stopRenewal()
	l.released, l.closedBy = true, true
	oc = l.p.releaseCall(opRelease, l.ticket, l.c, l.announced, l.tokens)
	until = minTime(l.expiresBy(), by)
	l.finish(errClosedReleased)
	return oc, until
}

// sendUntil runs the release oc on p's semaphores, and again after an
// error that passes (with resendLater's backoff), until it lands or until.
// It returns nil once it landed (whatever it found: a lease expired
// meanwhile is no error), or the last error. With WithReplicaAck, a
// release Redis's master ran counts as landed.
func (c *Client) sendUntil(oc opCall, p plan, until time.Time) error {
	wait := resendFirst
	var err error
	for {
		if !time.Now().Before(until) {
			if err == nil {
				err = fmt.Errorf("%w: no time left to send the release", context.DeadlineExceeded)
			}
			break
		}
		ctx, cancel := context.WithDeadline(context.Background(), until)
		res, _ := c.calls.run(ctx, oc)
		_, err = c.released(p, res)
		cancel()
		if err == nil {
			return nil
		}
		if !transient(err) {
			break
		}
		left := time.Until(until)
		if left <= 0 {
			break
		}
		time.Sleep(min(wait+rand.N(wait), left))
		wait = min(2*wait, resendMost)
	}
	if !errors.Is(err, ErrRedis) {
		err = fmt.Errorf("%w: %w", ErrRedis, err)
	}
	c.logf(slog.LevelWarn, "fairlock: release at close did not land; Redis ends the lease at its TTL", p.names, "",
		slog.Any("error", err))
	return err
}

// spendAtClose ends a lease that a condition wait was about to spend when
// it found its client closed: as the close ends the leases it holds,
// released in the background (Close waits for it) or left to expire.
// Called with l.mu held, on a lease not released, whose renewal is
// stopped.
func (l *Lease) spendAtClose() {
	c := l.c
	c.mu.Lock()
	s := c.shut // set with closed
	c.mu.Unlock()
	if !s.release {
		l.released = true
		l.finish(errClosedAbandoned)
		return
	}
	oc, until := l.endAtClose(s.by)
	c.spawn(func() {
		if err := c.sendUntil(oc, l.p, until); err != nil {
			s.fail(err)
		}
	})
}
