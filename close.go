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

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// Closing a client. Close and Shutdown release the leases the client
// holds, so that the next waiters are granted at once rather than when the
// leases' TTL runs out; Abandon leaves them in Redis to expire. The first
// of the three to be called decides which; each stops new grants at once,
// withdraws blocked waits, and waits, within its bound, for the client's
// background work. Close and Abandon end the leases at once; Shutdown
// first waits for their holders to release them, renewing them meanwhile,
// and ends the rest only when its context ends (or a Close or Abandon
// comes).

// closeSlack is how long past its bound Close still waits for the
// acquisitions under way: their withdrawals are bounded by the same
// moment (cleanUpBy), so they return just after it, their callers then
// getting ErrClosed before Close returns.
const closeSlack = 250 * time.Millisecond

// closeFanOut bounds the releases Close sends at once: enough to release
// thousands of leases in a few round trips' time, few enough not to drain
// the connection pool that other clients of the same go-redis client use.
const closeFanOut = 16

// defaultAnswerWait is how long past its bound a close waits for calls
// already sent through a Backend that does not return by its context's
// end, when fairlock cannot see the client's read timeout (or it has
// none): go-redis's default ReadTimeout.
const defaultAnswerWait = 5 * time.Second

// answerWait returns how long past its bound a close waits for the calls
// already sent through b: go-redis's ReadTimeout through go-redis (each
// try waits for it, whatever the context, and a try begun before the
// context's end runs out), defaultAnswerWait for other Backends that do
// not return by their context's end. A Backend that does returns by the
// contexts the close bounds: 0, the close waits for its calls as they
// return.
func answerWait(b backend.Backend, info backend.Info) time.Duration {
	if info.Deadlines {
		return 0
	}
	if g, ok := b.(*goRedis); ok {
		if d := g.readTimeout(); d > 0 {
			return d
		}
	}
	return defaultAnswerWait
}

// nudgeBound is how long, from the close, the nudges that end listeners'
// blocking reads (on a RedisClient whose blocking connections Close cannot
// close itself) may take: all are sent at once, each bounded by it.
const nudgeBound = time.Second

// closeMode is how a call closes the client.
type closeMode int

const (
	closeNow     closeMode = iota // Close: release the leases at once
	closeDrain                    // Shutdown: let the holders release them first
	closeAbandon                  // Abandon: leave them to expire
)

// shutdownState is one close of a client: set, with Client.closed, by the first
// Close, Shutdown or Abandon.
type shutdownState struct {
	release bool          // release the leases (Close, Shutdown), or leave them (Abandon)
	cut     chan struct{} // closed when the close ends the leases still held
	drained chan struct{} // closed when the client holds no lease
	done    chan struct{} // closed when the close's work has ended

	// Guarded by the client's mu.
	isDrained bool      // drained is closed
	by        time.Time // set at the cut: when the close's work gives up, one waiter TTL from the cut
	ended     []*Lease  // the leases still held at the cut, which the close ends

	pending atomic.Int64 // of ended, releases not yet landed (nor given up)
	failed  atomic.Int64 // releases that did not land
	lastErr lastError    // why the last of those did not
	// With WithReplicaAck, the releases that landed on the master but
	// that its replicas did not acknowledge.
	unacked    atomic.Int64
	unackedErr lastError // the last of those's error
	// The withdrawals of the acquisitions the close ended (waits, grants
	// that raced it).
	withdrawals     atomic.Int64 // begun
	withdrawFailed  atomic.Int64 // that did not land
	withdrawLastErr lastError    // why the last of those did not
	// The releases and withdrawals sent again in the background that the
	// close found on their way (a Release's or a clean-up's, its call
	// ended by the close or failed before it), which it bounds.
	resends       atomic.Int64 // found
	resendFailed  atomic.Int64 // that did not land
	resendLastErr lastError    // why the last of those did not

	err error // set before done closes: releases and withdrawals that did not land
}

// lastError holds the last error stored, of whatever type (an
// atomic.Value panics when a value of another type than the first is
// stored: one error's type is not the next's).
type lastError struct{ p atomic.Pointer[error] }

func (l *lastError) Store(err error) { l.p.Store(&err) }

// Load returns the last error stored, or nil.
func (l *lastError) Load() error {
	if p := l.p.Load(); p != nil {
		return *p
	}
	return nil
}

// fail notes a release that did not land, for err.
func (s *shutdownState) fail(err error) {
	s.failed.Add(1)
	s.lastErr.Store(err)
}

// unack notes a release that landed on the master but that its
// replicas did not acknowledge, for err (ErrNotReplicated's).
func (s *shutdownState) unack(err error) {
	s.unacked.Add(1)
	s.unackedErr.Store(err)
}

// failResend notes a release or withdrawal sent again in the background
// that the close bounded and that did not land, for err.
func (s *shutdownState) failResend(err error) {
	s.resendFailed.Add(1)
	s.resendLastErr.Store(err)
}

// failWithdrawal notes a withdrawal of an acquisition the close ended
// that did not land, for err.
func (s *shutdownState) failWithdrawal(err error) {
	s.withdrawFailed.Add(1)
	s.withdrawLastErr.Store(err)
}

var (
	// errClosedReleased is the cause a lease ends with when Close or
	// Shutdown releases it: it matches ErrClosed.
	errClosedReleased error = fault.Sub("fairlock: client closed, lease released", ErrClosed)
	// errClosedAbandoned is the cause a lease ends with when Abandon
	// leaves it to expire: it matches ErrClosed.
	errClosedAbandoned error = fault.Sub("fairlock: client closed, lease left to expire", ErrClosed)
)

// Shutdown closes the client gracefully, as net/http's Server.Shutdown
// closes a server: it refuses new work at once and waits, while ctx lasts,
// for the work under way to finish. From the call on, Acquire and its kin
// fail with [ErrClosed], and blocked Acquire calls (and condition waits)
// leave their queues and return ErrClosed: a waiter holds nothing yet, so
// it is not work under way. The leases the client holds stay held, and
// renewed, until the code that holds them releases them ([Lease.Release],
// or the end of a semaphore's Do, which then returns nil). Shutdown
// returns nil once every lease is released and every goroutine the client
// started has ended.
//
// If ctx ends first, Shutdown ends the leases still held as [Client.Close]
// does (each one's Done closes, its LeaseContexts end, with a cause
// matching ErrClosed, then its release is sent) and returns an error for
// which errors.Is(err, ctx.Err()) holds and that says how many leases it
// had to end; their releases go on in the background, within Close's
// bound counted from ctx's end. No lease is released under running code
// before that code lets it go or ctx ends. A client with nothing to wait
// for (no lease, no waiter, no background work) returns nil at once,
// whatever ctx. Shutdown's other error is Close's: releases, or
// withdrawals of the waits it ended, that could not land within Close's
// bound (Redis down), matching [ErrRedis].
//
// Call Shutdown when the process stops on a signal while work may still
// run under the client's leases: it lets that work end, and hands its
// leases on once it has. Give it the time the process has left (a SIGTERM
// grace period less what the rest of the shutdown needs), and stop the
// work (cancel its contexts) so that it returns. Call [Client.Close] once
// the work is over, or when it must end now.
//
// Close, Shutdown and [Client.Abandon] may be called many times and
// concurrently: the first begins the close and decides whether leases are
// released (Close, Shutdown) or left to expire (Abandon). A Close or
// Abandon during a Shutdown ends its wait for the holders at once, as
// http.Server.Close does; every call then waits for the close as its own
// bound allows and returns its result.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.shutdown(ctx, closeDrain)
}

// Abandon closes the client without releasing the leases it holds: it
// stops renewing them, so their Done channels close (with a cause matching
// [ErrClosed]) and Redis drops them when their TTL runs out. Otherwise it
// is [Client.Close]: blocked waits end with ErrClosed (leaving their
// queues), later calls fail with ErrClosed, and Abandon waits for the
// client's background work, as long as Close would. It returns nil, or
// Close's error for the withdrawals of the waits it ended, and the
// releases and withdrawals sent again in the background that it cut
// short, that could not land, or what it left unanswered at its bound,
// or, when Close or Shutdown began the close, that close's result
// (after a Shutdown, it ends the leases still held at once, released as
// Shutdown decided).
//
// Use Abandon when the leases must outlive the process: say a process
// hands its work to a successor that takes the work over under the same
// leases' protection by fencing token, or one that exits while a child it
// started still works on the resource, so that nobody else is granted the
// resource until the TTL says the work is surely over. The cost is the one
// of a crash: each semaphore's next waiter waits until the lease's TTL
// runs out ([WithLeaseTTL], 10 s by default) after the last renewal, or
// the lease's own TTL if its request gave one ([Request.LeaseTTL]). A
// lease granted through a wake-up (after waiting in the queue) and not yet
// renewed is held in Redis only for the waiter TTL ([WithWaiterTTL], 3 s
// by default) from its grant, until its first renewal confirms it: left by
// Abandon before that renewal, it expires at that earlier time. A
// [Lease.Release] after Abandon still releases the lease at once.
func (c *Client) Abandon() error {
	return c.shutdown(context.Background(), closeAbandon)
}

// shutdown runs Close, Shutdown (with ctx) and Abandon: the first call
// begins the close, every call waits for it while ctx lasts.
func (c *Client) shutdown(ctx context.Context, mode closeMode) error {
	start := time.Now()
	c.mu.Lock()
	s := c.shut
	if s == nil {
		s = &shutdownState{release: mode != closeAbandon,
			cut: make(chan struct{}), drained: make(chan struct{}), done: make(chan struct{})}
		c.shut = s
		c.closed, c.waits.Closed = true, true
		c.closeAll() // blocked waits leave their queues, blocking reads end
		var listening []*wait.Listener
		for _, ls := range c.waits.Listeners {
			listening = append(listening, ls...)
		}
		closeBlk := c.waits.CloseBlk
		// With nothing held, queued or running, the close's work is a few
		// local steps: done before shutdown returns, whatever ctx.
		idle := len(c.leases) == 0 && c.tasks == 0 && c.acquiring == 0 && c.wg.idle() && len(listening) == 0
		c.drainedLocked()
		if mode != closeDrain {
			c.cutLocked(s)
		}
		c.mu.Unlock()
		if idle || ctx.Done() == nil && mode != closeDrain {
			c.stop(s, start, listening, closeBlk)
		} else {
			go c.stop(s, start, listening, closeBlk)
		}
	} else {
		if mode != closeDrain {
			c.cutLocked(s)
		}
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
	// ctx ended (a Shutdown's): end what is left.
	c.mu.Lock()
	c.cutLocked(s)
	ended := len(s.ended)
	c.mu.Unlock()
	if ended > 0 {
		what := fmt.Sprintf("%d leases", ended)
		if ended == 1 {
			what = "1 lease"
		}
		return opError("shutdown", nil, fmt.Errorf("%w: %s still held ended by the close; their releases go on in the background for at most one waiter TTL", ctx.Err(), what))
	}
	return opError("shutdown", nil, fmt.Errorf("%w: the client's background work had not ended (it goes on for at most one waiter TTL from the close)", ctx.Err()))
}

// drainedLocked closes the close's drained once the client holds no
// lease. Called with c.mu held.
func (c *Client) drainedLocked() {
	if s := c.shut; s != nil && !s.isDrained && len(c.leases) == 0 {
		s.isDrained = true
		close(s.drained)
	}
}

// cutLocked ends the close's wait for the holders, if it has not ended:
// the leases still held are the close's to end, and its work gets one
// waiter TTL from now. Called with c.mu held.
func (c *Client) cutLocked(s *shutdownState) {
	if !s.by.IsZero() {
		return
	}
	s.by = time.Now().Add(c.cfg.waiterTTL)
	s.ended = make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		s.ended = append(s.ended, l)
	}
	if s.release {
		s.pending.Store(int64(len(s.ended)))
	}
	close(s.cut)
}

// cleanUpBy returns until when clean-up begun now (a withdrawal, a release
// sent again) may go on: one waiter TTL, and no later than the bound of a
// close that has ended the client's leases (see cutLocked).
func (c *Client) cleanUpBy() time.Time {
	by := time.Now().Add(c.cfg.waiterTTL)
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.shut; s != nil && !s.by.IsZero() {
		by = minTime(by, s.by)
	}
	return by
}

// draining reports whether a Shutdown is waiting for the leases that code
// holds (the close has not cut them yet).
func (c *Client) draining() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shut != nil && c.shut.by.IsZero()
}

// stop does the close's work: it ends the blocking reads of listening (the
// close began at start), waits for the holders to release their leases
// until the cut, releases or abandons the leases still held then, and
// waits for every goroutine the client started and every acquisition
// under way; then it closes s.done.
func (c *Client) stop(s *shutdownState, start time.Time, listening []*wait.Listener, closeBlk func() error) {
	var nudges sync.WaitGroup
	if closeBlk != nil {
		// Closing its connections ends every BLPOP in flight.
		_ = closeBlk()
	} else {
		// A listener blocked in BLPOP would otherwise stay blocked until
		// its timeout; an entry on its control list ends it now. The
		// nudges go out together, each bounded from the close's start.
		for _, l := range listening {
			nudges.Go(func() {
				ctx, cancel := context.WithDeadline(context.Background(), start.Add(nudgeBound))
				defer cancel()
				_ = script.NudgeScript.On(ctx, c.b, []string{c.waits.CtlOf(l)}, c.waiterMs)
			})
		}
	}
	select {
	case <-s.drained:
	case <-s.cut:
	}
	c.mu.Lock()
	c.cutLocked(s)
	leases, by := s.ended, s.by
	c.mu.Unlock()
	c.endRenews()
	var releases sync.WaitGroup
	if s.release {
		work := make(chan *Lease)
		for range min(len(leases), closeFanOut) {
			releases.Go(func() {
				for l := range work {
					switch err := l.releaseAtClose(by); {
					case errors.Is(err, ErrNotReplicated):
						s.unack(err)
					case err != nil:
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
	// The close waits for the releases, the goroutines the client
	// started and the acquisitions under way, until its bound (by) and,
	// for a call already sent, the Backend's answer wait past it (see
	// answerWait): then it stops waiting, whatever the Redis client does
	// (a Cluster client's retries can outlast any context by three read
	// timeouts), and says what it left.
	//
	// The acquisitions under way leave their queues (or hand their
	// withdrawal to a task waited for here) once they see the close; one
	// whose script call Redis does not answer, on a Backend that returns
	// by the caller's context (which the close does not end), is waited
	// for until the close's bound only, and the close says so.
	// (The wait lasts closeSlack past the bound: an acquisition whose
	// withdrawal the bound itself ends returns a moment after it.)
	background := false // guarded by c.mu: true once the goroutines have ended
	go func() {
		nudges.Wait()
		releases.Wait()
		c.wg.Wait()
		c.mu.Lock()
		background = true
		c.tasksDone.Broadcast()
		c.mu.Unlock()
	}()
	until := by.Add(closeSlack)
	wake := func(at time.Time) *time.Timer {
		return time.AfterFunc(time.Until(at), func() {
			c.mu.Lock()
			c.tasksDone.Broadcast()
			c.mu.Unlock()
		})
	}
	wakeUntil := wake(until)
	defer wakeUntil.Stop()
	var giveUp time.Time // none: the close waits for the Backend's calls
	if c.answerWait > 0 {
		giveUp = until.Add(c.answerWait)
		defer wake(giveUp).Stop()
	}
	c.mu.Lock()
	for (!background || c.tasks > 0 || (c.acquiring > 0 && (!c.info.Deadlines || time.Now().Before(until)))) && (giveUp.IsZero() || time.Now().Before(giveUp)) {
		c.tasksDone.Wait()
	}
	stuck, tasks, ended := c.acquiring, c.tasks, background
	c.mu.Unlock()
	var errs []error
	if n := s.failed.Load(); n > 0 {
		err := s.lastErr.Load()
		errs = append(errs, fmt.Errorf("%w: %d of %d leases could not be released (last: %w); Redis ends them when their TTL runs out", ErrRedis, n, len(leases), err))
	}
	if n := s.unacked.Load(); n > 0 {
		err := s.unackedErr.Load()
		errs = append(errs, fmt.Errorf("%w: %d of %d leases were released on the master, but its replicas did not acknowledge the release (last: %w); a failover can undo it, and Redis then ends the lease when its TTL runs out", ErrRedis, n, len(leases), err))
	}
	if n := s.withdrawFailed.Load(); n > 0 {
		err := s.withdrawLastErr.Load()
		errs = append(errs, fmt.Errorf("%w: %d of %d acquisitions the close ended could not be withdrawn (last: %w); Redis drops their tickets at their deadlines (a waiter's within its waiter TTL)", ErrRedis, n, s.withdrawals.Load(), err))
	}
	if n := s.resendFailed.Load(); n > 0 {
		err := s.resendLastErr.Load()
		errs = append(errs, fmt.Errorf("%w: %d of %d releases and withdrawals sent again in the background did not land by the close's bound (last: %w); Redis ends their leases and tickets at their TTL", ErrRedis, n, s.resends.Load(), err))
	}
	if n := s.pending.Load(); n > 0 && !ended {
		errs = append(errs, fmt.Errorf("%w: %d of %d releases were still unanswered when the close's bound passed; Redis ends those leases when their TTL runs out", ErrRedis, n, len(leases)))
	}
	if stuck > 0 {
		errs = append(errs, fmt.Errorf("%w: %d acquisitions were still waiting for Redis to answer when the close's bound passed; their tickets end at their waiter TTL", ErrRedis, stuck))
	}
	if g := c.wg.n.Load(); !ended && g > 0 || tasks > 0 {
		errs = append(errs, fmt.Errorf("%w: calls to Redis were still unanswered when the close's bound passed (%d of the client's goroutines, %d calls); they end in the background when the Redis client gives them up", ErrRedis, g, tasks))
	}
	if len(errs) > 0 {
		s.err = opError("close", nil, errors.Join(errs...))
	}
	close(s.done)
}

// releaseAtClose ends the lease for its client's Close: its Done closes,
// with errClosedReleased as cause, and its release is sent, and sent again
// after an error that passes, until it lands or by (or the lease's own
// deadline, past which Redis has dropped it anyway). The lease ends before
// the release is sent, so that work watching Done or a LeaseContext
// learns of it before the next holder can be granted. It returns why the
// release did not land (one that landed on the master but that its
// replicas did not acknowledge, with WithReplicaAck: an error matching
// ErrNotReplicated), or nil: landed, found the lease already gone, or left
// to its holder, whose Release or condition wait took it first.
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
	if after != nil && (err == nil || errors.Is(err, ErrNotReplicated)) {
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
func (l *Lease) endAtClose(by time.Time) (oc script.Call, until time.Time) {
	l.stopRenewal()
	l.released, l.closedBy = true, true
	oc = l.p.releaseCall(script.OpRelease, l.ticket, l.c, l.announced, l.tokens)
	until = minTime(l.expiresBy(), by)
	l.finish(errClosedReleased)
	return oc, until
}

// sendUntil runs the release oc on p's semaphores, and again after an
// error that passes (with resendLater's backoff), until it lands or until.
// It returns nil once it landed (whatever it found: a lease expired
// meanwhile is no error), or the last error. With WithReplicaAck, a
// release Redis's master ran counts as landed, and is not sent again; if
// the replicas did not acknowledge it, sendUntil returns that error
// (matching ErrNotReplicated).
func (c *Client) sendUntil(oc script.Call, p plan, until time.Time) error {
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
		res, ackErr := c.calls.Run(ctx, oc)
		_, err = c.released(p, res)
		cancel()
		if err == nil {
			return ackErr
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
	oc, until := l.endAtClose(c.cleanUpBy())
	c.spawn(func() {
		if err := c.sendUntil(oc, l.p, until); err != nil {
			s.fail(err)
		}
	})
}
