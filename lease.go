package fairlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/sched"
	"github.com/fairlock/fairlock/internal/script"
)

// A Lease holds permits of a semaphore until it is released or lost. It is
// renewed automatically while held. Its methods are safe for concurrent
// use.
type Lease struct {
	c      *Client
	p      plan
	ticket string
	tokens []int64 // one per semaphore, in p's order
	// ticket and tokens[0] as script arguments, boxed beforehand (nil:
	// boxed at each call); see leaseBoxes.
	boxes leaseBoxes

	over endSignal // closes when the lease ends; its cause says why

	// Renewal runs on the client's scheduler, so no goroutine exists
	// between renewals.
	stopCtx   context.Context    // guarded by rmu: cancelled when renewal stops; made by the first renewal
	halt      context.CancelFunc // guarded by rmu: stopCtx's, or nil (see haltLocked)
	rmu       sync.Mutex
	idle      sync.Cond    // on rmu: signalled when a renewal in flight ends
	timer     *sched.Entry // guarded by rmu: &entry once started
	entry     sched.Entry
	due       time.Time     // guarded by rmu: when timer is set to run (see schedule)
	deadline  time.Time     // guarded by rmu: when the lease may have expired
	stopped   bool          // guarded by rmu
	renewing  bool          // guarded by rmu
	announced bool          // guarded by rmu: announced, not yet confirmed
	maxHold   time.Duration // the cap on holding (see maxhold.go); 0 for none
	holdEnd   time.Time     // when the cap ends the lease, locally; zero for none
	capped    bool          // guarded by rmu: a renewal brought Redis's expiry to the cap
	renewErr  error         // guarded by rmu: the last renewal's error, if it failed (the lease ends with it if its deadline passes)
	// ending is why the lease ended, once the lease itself found so (its
	// renewal, its cap, a lapse): set with stopped, before finish reports
	// it and cancels its contexts, so Err reads it meanwhile. Guarded by
	// rmu.
	ending error

	mu       sync.Mutex // serialises Release
	released bool
	closedBy bool // released by its client's Close (guarded by mu)
	// atClose runs once its client's Close or Shutdown has released the
	// lease (internal/engine's AtCloseRelease: an election's leader
	// record is cleared and the change published). Guarded by mu.
	atClose func(ctx context.Context)

	granted time.Time // local time the lease was handed to its caller

	emu sync.Mutex
	// ended is set by the first finish. quiet: the lease is not yet handed
	// to its caller (a grant being confirmed on the replicas), so its end,
	// should it come now, is not reported: the caller's acquisition
	// reports that it failed instead.
	ended, quiet bool                               // guarded by emu
	subs         map[uint64]context.CancelCauseFunc // LeaseContexts to end with the lease; guarded by emu
	nsubs        uint64                             // guarded by emu
	subsEnded    bool                               // guarded by emu: subs were ended, none is added
	cause        error                              // guarded by emu: why it ended, once subsEnded
}

// leaseBoxes are a lease's ticket and first token boxed as script
// arguments, where the acquisition had them (see Lease.boxes).
type leaseBoxes struct{ ticket, tok0 any }

// newLease wraps a grant and starts its renewal. deadline is the local
// time by which Redis may have expired the grant, derived from Redis's own
// expiry of it (see clock.Sample). A grant announced through a wake list
// (announced) lasts only the waiter TTL until its first renewal confirms
// it; that renewal comes at a third of the time left, not at once: most
// short holds release before, and the handoff costs no extra script.
// Every other renewal is due when two thirds of the TTL are left (see
// renewalDue).
func (c *Client) newLease(ctx context.Context, p plan, ticket string, tokens []int64, deadline time.Time, announced bool, boxes leaseBoxes) (*Lease, error) {
	l := &Lease{c: c, p: p, ticket: ticket, tokens: tokens, granted: time.Now(), boxes: boxes}
	// An announced grant with WithReplicaAck is the caller's only once
	// confirmed.
	l.quiet = announced && c.cfg.ackReplicas > 0
	l.idle.L = &l.rmu
	l.deadline = deadline
	first := renewalDue(deadline, p.ttl(c))
	if announced {
		first, l.announced = max(time.Until(deadline)/renewDivisor, 0), true
	}
	first = l.capHold(first, announced)

	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		l.stopped = true
		l.over.end(ErrClosed)
		// Nobody would renew it; free the permits now rather than at expiry.
		c.withdrawAtClose(ctx, p, ticket)
		return nil, opError("acquire", p.names, ErrClosed)
	}
	c.leases[l] = struct{}{}
	c.mu.Unlock()
	l.rmu.Lock()
	if !announced || c.cfg.ackReplicas == 0 {
		l.due = time.Now().Add(first)
		l.timer = c.sched.Start(&l.entry, first, renewLease, l)
		l.rmu.Unlock()
		return l, nil
	}
	// With WithReplicaAck, an announced grant is confirmed, and the
	// confirmation replicated, before the caller may rely on it.
	l.due = time.Now()                                            // (renewed below)
	l.timer = c.sched.Start(&l.entry, clock.Never, renewLease, l) // reset by renew

	l.rmu.Unlock()
	l.renew()
	l.rmu.Lock()
	confirmed := !l.announced && !l.stopped
	l.rmu.Unlock()
	l.emu.Lock()
	if confirmed && !l.ended {
		l.quiet = false // from now on its end is reported
	} else {
		confirmed = false // (it may have ended, unreported, meanwhile)
	}
	l.emu.Unlock()
	if !confirmed {
		_ = l.Release(ctx)
		if c.isClosed() { // (Close may have released it meanwhile)
			return nil, opError("acquire", p.names, ErrClosed)
		}
		return nil, opError("acquire", p.names, fmt.Errorf("%w: %w: the grant could not be confirmed on the replicas", ErrRedis, ErrNotReplicated))
	}
	return l, nil
}

// Token returns the lease's fencing token. Tokens of one semaphore
// strictly increase over all its grants, so a resource that remembers the
// highest token it has seen can refuse a holder whose lease was lost (say,
// paused past its TTL) once a later holder has written. Tokens are derived
// from Redis's clock in microseconds, raised by one where grants come
// faster, so they keep increasing even after an idle semaphore's keys
// expire, and after Redis loses its data, unless the clock of the Redis that
// serves next is behind the one that served before.
//
// A lease over several semaphores has a token for each (see
// [Lease.Parts]); Token returns the one of the first in name order.
func (l *Lease) Token() int64 { return l.tokens[0] }

// Permits returns the number of permits the lease holds (of the first
// semaphore in name order, for a lease over several).
func (l *Lease) Permits() int64 { return l.p.first().req.Permits }

// Name returns the name of the semaphore the lease holds permits of (the
// first in name order, for a lease over several).
func (l *Lease) Name() string { return l.p.first().req.Name }

// Part is one semaphore held by a [Lease].
type Part struct {
	Name     string
	Capacity int64
	Permits  int64
	Token    int64 // the fencing token of this grant of this semaphore
}

// Parts returns what the lease holds of each of its semaphores, in name
// order. All parts were granted together and end together.
func (l *Lease) Parts() []Part {
	out := make([]Part, len(l.p.parts))
	for i, pt := range l.p.parts {
		out[i] = Part{Name: pt.req.Name, Capacity: pt.req.Capacity, Permits: pt.req.Permits, Token: l.tokens[i]}
	}
	return out
}

// Done returns a channel that is closed when the lease ends: released,
// expired, not renewed in time, at its cap on holding ([WithMaxHold]), or
// its client closed (released by [Client.Close] or [Client.Shutdown], or
// left to expire by [Client.Abandon]).
func (l *Lease) Done() <-chan struct{} { return l.over.Done() }

// endSignal says that a lease has ended, and why: a channel closed then
// and the first cause given, as a context.WithCancelCause would, without
// its allocations: the channel is made only if Done is called.
type endSignal struct {
	mu    sync.Mutex
	cause error
	done  chan struct{}
}

// end ends e for cause (nil: context.Canceled), unless it has ended.
func (e *endSignal) end(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	e.mu.Lock()
	if e.cause == nil {
		e.cause = cause
		if e.done != nil {
			close(e.done)
		}
	}
	e.mu.Unlock()
}

// Done returns a channel closed once e has ended.
func (e *endSignal) Done() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.done == nil {
		e.done = make(chan struct{})
		if e.cause != nil {
			close(e.done)
		}
	}
	return e.done
}

// Cause returns the first cause e ended for, or nil while it has not.
func (e *endSignal) Cause() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cause
}

// Err returns nil while the lease is held, and afterwards why it ended:
// an error matching [ErrNotHeld] once released (by [Lease.Release] or
// semaphore.Cond.Wait), an error matching [ErrLeaseLost] if it was
// lost (also matching [ErrMaxHold] if it reached its cap on holding), or
// [ErrClosed] if its client was closed (Close and Shutdown release the
// lease, Abandon leaves it to expire; the message says which).
//
// Err reads the clock: once the time by which Redis may have expired the
// lease has passed without a renewal, Err ends the lease as lost, even if
// the timers that would have ended it have not run yet (say, the process
// was stopped past the lease's TTL and has just resumed). So nil from Err
// means the lease was live in Redis when Err was called.
//
// An ending the lease finds itself (its renewal refused or too late, its
// cap, the clock) is read by Err from the moment it is found, before Done
// closes and before the observer hears of it; a Release or Close under way
// in another goroutine ends the lease when its call returns.
func (l *Lease) Err() error {
	if err := l.over.Cause(); err != nil {
		return err
	}
	err := l.lapse(time.Now())
	if cause := l.over.Cause(); cause != nil {
		return cause // (the first cause given sticks)
	}
	return err
}

// lapse returns why the lease has ended if it has found so itself (see
// ending), or nil while it may be live at now. Past its deadline, it ends
// the lease as lost, whatever its renewal is doing: a renewal in flight
// is abandoned (its answer ignored, as renew ignores one that comes after
// the deadline), and one still scheduled returns at once when it runs. A
// lease whose renewal a call that gives it up has stopped (Release, a
// condition's wait, Close) is left to that call to end; past its deadline
// lapse still returns the error. It takes no lock of the scheduler's, so
// it works while the scheduler's timers are held up.
func (l *Lease) lapse(now time.Time) error {
	l.rmu.Lock()
	if l.ending != nil || now.Before(l.deadline) {
		err := l.ending
		l.rmu.Unlock()
		return err
	}
	// Redis's expiry, brought to the cap, may come a tick or two before
	// the cap on the local clock (see cappedRenewal).
	err := l.maxHoldErr()
	if !l.capped {
		err = opError("renew", l.p.names, fmt.Errorf("%w: not renewed in time: its deadline passed %v ago", ErrLeaseLost, now.Sub(l.deadline).Round(time.Millisecond)))
	}
	if l.stopped {
		l.rmu.Unlock()
		return err
	}
	l.endLocked(err)
	l.rmu.Unlock()
	l.finish(err)
	return err
}

// endedBy returns why the lease ended, if it has, or found itself ended:
// its first cause; nil while its end is not decided.
func (l *Lease) endedBy() error {
	if err := l.over.Cause(); err != nil {
		return err
	}
	l.rmu.Lock()
	defer l.rmu.Unlock()
	return l.ending
}

// haltLocked cuts short a renewal in flight, if one was ever made (see
// stopCtx); the caller has set stopped. Called with rmu held.
func (l *Lease) haltLocked() {
	if l.halt != nil {
		l.halt()
	}
}

// endLocked stops the lease's renewal for good, for cause, which Err
// reads from now on; the caller then calls finish(cause), without rmu.
// Called with rmu held.
func (l *Lease) endLocked(cause error) {
	l.stopped, l.ending = true, cause
	l.haltLocked()
}

// Release frees the lease's permits, of all its semaphores at once, and
// hands them to the next waiters. It stops renewal before it returns. It returns an error matching
// [ErrLeaseLost] if the lease had already expired or been dropped, so the
// caller learns its critical section may have overlapped another holder's,
// and [ErrNotHeld] if the lease was released before, or an error matching
// [ErrClosed] if its client's Close (or Shutdown) released it; after
// [Client.Abandon], Release still releases the lease. If the lease had
// reached its cap on holding ([WithMaxHold]) before Release, Release frees
// whatever Redis still holds of it and returns an error matching
// [ErrMaxHold] (and so ErrLeaseLost).
//
// If the release meets an error that passes (a dropped or refused
// connection, a Cluster slot migrating, a server loading its data or
// failing over: TRYAGAIN, LOADING, READONLY and their kin), Release returns
// an error matching [ErrRedis] that says so, the lease counts as released
// (Done closes, with a cause matching [ErrNotHeld], and a later Release returns
// ErrNotHeld), and the release is sent again in the background, with
// backoff, until it lands or the lease would have expired anyway, so that
// the next waiter does not wait out the lease's TTL. Sending a release
// twice is safe: the second finds neither the lease nor the tombstone a
// lease that ended otherwise leaves, and, sent while the lease surely
// lived by this process's clock, knows the first released it (sent after
// that, it reports ErrLeaseLost: the lease may have lapsed and its keys
// gone). Any other error
// also matches ErrRedis; the lease is then no longer renewed (Done closes)
// and its permits return when its TTL runs out.
//
// Release returns by ctx's end whatever state Redis is in. If ctx ends
// first, it returns an error for which errors.Is(err, ctx.Err()) holds,
// the lease counts as released, and the release goes on in the background
// (sent again as above if it failed). [Client.Close] waits for releases
// going on in the background, at most a waiter TTL; the permits of one
// that has not landed by then return when the lease's TTL runs out, and
// Close's error says so. A Release whose call is on its way when its
// client's Close ends the leases (or a Shutdown, once it does) returns an
// error matching [ErrClosed] as the close begins, unless ctx ends within a
// waiter TTL anyway or, through go-redis, cannot end (see Client.Close):
// the lease counts as released, and its release goes on in the
// background as above, within Close's bound.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		if l.closedBy {
			return opError("release", l.p.names, errClosedReleased)
		}
		return opError("release", l.p.names, ErrNotHeld)
	}
	l.stopRenewal()
	rel := l.p.releaseCallBoxed(script.OpRelease, l.ticket, l.boxes.ticket, l.c, l.announced, l.tokens, l.boxes.tok0, l.p.ttl(l.c))
	until := l.expiresBy()
	// Sent while the lease surely lived (until is no later than Redis's
	// expiry of it), a release that finds no trace of it knows that an
	// earlier run of this call released it.
	live := time.Now().Before(until)
	// The call ends when the client's close ends the leases it holds, too
	// (see boundBy): a close waits for this lease (Release holds its mu)
	// and must not wait past its bound for a Redis that does not answer.
	// The release then goes on in the background within the close's
	// bound, which reports it if it does not land (see resendReport).
	// (Under a context that cannot end, through go-redis: the thin path,
	// no bound and no lock for it.)
	var end *callpath.Ends
	if l.c.mayOutlastClose(ctx) {
		end = l.c.releaseEnd()
	}
	callCtx, bound := l.c.boundBy(ctx, end)
	o, ok := l.c.calls.Op(callCtx, rel.Under(ctx), func(o callpath.Outcome) {
		if _, err := l.c.released(l.p, o.Res); transient(err) || cutShort(err) { // hands on work the script left
			// The release did not reach Redis, or the caller's context
			// (or the close) ended it before it was sent: send it again.
			l.c.resendLater(rel, l.p, until)
		}
	})
	bound.done()
	if !ok {
		// The release goes on in the background; the lease counts as
		// released.
		l.released = true
		l.finish(errReleased)
		return opError("release", l.p.names, l.c.endedBy(ctx, end, o.Res.Err))
	}
	res, ackErr := o.Res, o.AckErr
	n, err := l.c.released(l.p, res)
	n = ops.ReleaseResult(n, live)
	if err == nil && n == 1 && ackErr != nil {
		// Released on the master; a failover now could bring the lease
		// back until its TTL runs out.
		l.released = true
		l.finish(errReleased)
		return opError("release", l.p.names, ackErr)
	}
	if err != nil && transient(err) {
		// (Whether or not ctx has ended since: the release did not land.)
		if !fault.IsDialError(err) { // (then the call's late handler sends it again)
			l.c.resendLater(rel, l.p, until)
		}
		l.released = true
		l.finish(errReleased)
		if !errors.Is(err, ErrRedis) { // a dial error already says it
			err = fmt.Errorf("%w: %w", ErrRedis, err)
		}
		return opError("release", l.p.names, fmt.Errorf("%w; the release is sent again in the background until it lands or the lease expires", err))
	}
	if err != nil {
		err = fail(ctx, "release", l.p.names, err)
		l.finish(fmt.Errorf("%w: release failed, the lease is no longer renewed: %w", ErrLeaseLost, err))
		return err
	}
	l.released = true
	if cause := l.endedBy(); errors.Is(cause, ErrMaxHold) {
		// The cap ended the lease before Release stopped its renewal.
		l.finish(cause) // (if its own finish has not yet run)
		return opError("release", l.p.names, ErrMaxHold)
	}
	if n != 1 {
		l.finish(ErrLeaseLost)
		return opError("release", l.p.names, ErrLeaseLost)
	}
	l.finish(errReleased)
	return nil
}

// releaseEnd returns what ends a Release's call besides its context (see
// boundBy): the close's end of the client's leases (Client.renewing),
// which waits for a Release under way; nil once an Abandon has closed the
// client, whose close waits for no release (a Release after Abandon still
// releases its lease).
func (c *Client) releaseEnd() *callpath.Ends {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.shut; s != nil && !s.release {
		return nil
	}
	return c.renewEnds
}

// errReleased is the cause a lease ends with when its holder released it
// (by Release or CondWait): it matches ErrNotHeld.
var errReleased error = fault.Sub("fairlock: lease released", ErrNotHeld)

// releaseSpent sends the release oc of a lease on p, best effort, under
// a context that outlives ctx by up to one waiter TTL (ending by a close's
// bound, as every clean-up does: see cleanUpBy), and after an error that
// passes (a refused connection included) sends it again in the
// background until until, when the lease would have expired anyway (or
// the close's bound). It blocks; callers that must not, run it as a late
// outcome of call.
func (c *Client) releaseSpent(ctx context.Context, oc script.Call, p plan, until time.Time) {
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), c.cleanUpBy())
	defer cancel()
	res, _ := c.calls.Run(ctx, oc)
	if _, err := c.released(p, res); transient(err) {
		c.resendLater(oc, p, until)
	} else if err != nil {
		c.logf(slog.LevelWarn, "fairlock: release failed; Redis ends the lease at its TTL", p.names, "", slog.Any("error", err))
	}
}

// expiresBy returns the local time by which the lease has expired in
// Redis unless renewed.
func (l *Lease) expiresBy() time.Time {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	return l.deadline
}

// stopRenewal stops renewal and waits for a renewal in flight, so none
// reaches Redis after it returns.
func (l *Lease) stopRenewal() {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	l.stopped = true
	l.haltLocked()
	if l.timer != nil {
		l.timer.Stop()
	}
	for l.renewing {
		l.idle.Wait()
	}
}

// finish ends the lease with cause (the first cause given sticks, and
// the end the lease found itself, see ending, comes before any), forgets
// it in its client, and ends its LeaseContexts, before it returns.
func (l *Lease) finish(cause error) {
	l.rmu.Lock()
	if l.ending != nil {
		// The lease found itself ended first: Err has said so since.
		cause = l.ending
	}
	l.rmu.Unlock()
	l.emu.Lock()
	if l.ended {
		l.emu.Unlock()
		return
	}
	l.ended = true
	quiet := l.quiet
	// LeaseContexts end first, before the report (an observer's code may
	// take its time) and before Done closes, so whoever sees Done closed
	// finds them ended.
	subs := l.subs
	l.subs, l.subsEnded, l.cause = nil, true, cause
	l.emu.Unlock()
	for _, end := range subs {
		end(cause)
	}
	// Reported before Done closes, so whoever waits on Done sees it said.
	held := time.Since(l.granted)
	switch {
	case quiet:
	case errors.Is(cause, ErrNotHeld):
		l.c.observeFor(l.p, Event{Kind: LeaseReleased, Names: l.p.names, Held: held, ID: l.p.id})
	default:
		l.c.observeFor(l.p, Event{Kind: LeaseLost, Names: l.p.names, Held: held, Err: cause, ID: l.p.id})
		if !errors.Is(cause, ErrClosed) {
			l.c.logf(slog.LevelWarn, "fairlock: lease lost", l.p.names, strconv.FormatInt(l.tokens[0], 10),
				slog.Duration("held", held), slog.Any("cause", cause))
		}
	}
	l.over.end(cause)
	l.c.mu.Lock()
	delete(l.c.leases, l)
	l.c.drainedLocked() // (a Shutdown waits for it)
	l.c.mu.Unlock()
}

// abandon stops maintaining the lease without releasing it.
func (l *Lease) abandon(cause error) {
	l.stopRenewal()
	l.finish(cause)
}

// renewLease runs a's renew (a *Lease): a scheduler entry's function
// that needs no method value.
func renewLease(a any) { a.(*Lease).renew() }

// renew extends the lease; it runs on the lease's timer, when two thirds
// of the TTL are left (see renewalDue). It counts the TTL from when each
// renewal was sent, never from its answer, so the holder gives the lease
// up before Redis can have expired it, and times the next renewal by the
// same count.
// It waits for a renewal's answer no later than the lease's deadline (nor
// after stopRenewal), even from a Redis that does not answer: the lease is
// then lost at its deadline. A renewal whose answer comes after renew gave
// up on it is ignored: if it did renew the lease in Redis, the lease
// expires there a TTL after it was sent, as any lost lease does (it is
// not released early, in case its holder has not yet seen Done). A lease
// with a cap on holding is renewed only up to the cap, and ends there by
// this timer (see maxhold.go).
func (l *Lease) renew() {
	l.rmu.Lock()
	if l.stopped {
		l.rmu.Unlock()
		return
	}
	if l.holdOver(time.Now()) {
		cause, announced := l.maxHoldErr(), l.announced
		l.endLocked(cause)
		l.rmu.Unlock()
		l.endAtCap(cause, announced)
		return
	}
	if now := time.Now(); !now.Before(l.deadline) {
		// The renewal comes after the deadline: this process did not run
		// in time (stopped, starved of CPU), whatever Redis did.
		late := now.Sub(l.deadline).Round(time.Millisecond)
		lost := opError("renew", l.p.names, fmt.Errorf("%w: not renewed in time: this process did not run until %v past the lease's deadline (stopped or starved of CPU)", ErrLeaseLost, late))
		if l.renewErr != nil {
			// Renewals were failing, and their retries ran out with the
			// lease's time: the last one's error says why.
			lost = opError("renew", l.p.names, fmt.Errorf("%w: not renewed in time: the renewals before its deadline failed: %w", ErrLeaseLost, l.renewErr))
		}
		l.endLocked(lost)
		l.rmu.Unlock()
		l.finish(lost)
		return
	}
	l.renewing = true
	deadline, announced, due := l.deadline, l.announced, l.due
	if l.stopCtx == nil {
		// (Most leases are released before their first renewal: they
		// never need one.)
		l.stopCtx, l.halt = context.WithCancel(context.Background())
	}
	stopCtx := l.stopCtx
	l.rmu.Unlock()

	ttl := l.p.ttl(l.c)
	sent := time.Now()
	lease, capped := l.renewalTTL(ttl, sent)
	ctx, cancel := context.WithDeadline(stopCtx, l.answerBy(deadline, sent))
	var n int64
	var err error
	if l.batchable() && !capped {
		n, err = l.c.renew.Renew(ctx, l.p.parts[0].k, l.ticket, l.p.parts[0].req.Permits, l.tokens[0], announced, lease)
	} else {
		o, _ := l.c.calls.Op(ctx, l.p.releaseCallTTL(script.OpRenew, l.ticket, l.c, announced, l.tokens, lease), nil)
		n, err = l.c.released(l.p, o.Res)
		if err == nil && n == 1 && o.AckErr != nil {
			err = o.AckErr // renewed on the master only: try again
		}
	}
	cancel()

	l.rmu.Lock()
	l.renewing = false
	l.idle.Broadcast()
	var lost, atCap error
	switch {
	case l.stopped:
	case err == nil && n == 1:
		l.renewErr = nil
		l.deadline, l.announced = clock.ExpiresAfter(sent, ttl), false
		l.schedule(renewalDue(l.deadline, ttl))
		if capped {
			l.cappedRenewal(sent, lease)
		}
		l.c.observeFor(l.p, Event{Kind: LeaseRenewed, Names: l.p.names, Held: time.Since(l.granted), ID: l.p.id})
	case err == nil:
		lost = opError("renew", l.p.names, fmt.Errorf("%w: expired", ErrLeaseLost))
	case !time.Now().Before(deadline):
		lost = opError("renew", l.p.names, fmt.Errorf("%w: not renewed in time: %w", ErrLeaseLost, renewalFailure(fault.ScriptError(err), sent, due, deadline, ttl)))
	case l.pastCap(time.Now()):
		atCap = l.maxHoldErr()
		l.endLocked(atCap)
	default:
		// Retry soon, but never past the deadline (nor the cap).
		l.renewErr = renewalFailure(fault.ScriptError(err), sent, due, deadline, ttl)
		l.schedule(l.untilCap(min(ttl/retryDivisor, time.Until(deadline))))
		l.c.logf(slog.LevelWarn, "fairlock: renewal failed; retrying until the lease's deadline", l.p.names,
			strconv.FormatInt(l.tokens[0], 10), slog.Time("deadline", deadline), slog.Any("error", err))
	}
	if lost != nil {
		l.endLocked(lost)
	}
	l.rmu.Unlock()
	if lost != nil {
		l.finish(lost)
	}
	if atCap != nil {
		l.endAtCap(atCap, announced)
	}
}

// schedule sets the renewal timer to run renew after d. Called with rmu
// held.
func (l *Lease) schedule(d time.Duration) {
	l.due = time.Now().Add(d)
	l.timer.Reset(d)
}

// renewalDue returns how long from now the next renewal of a lease
// renewed for ttl and counted to deadline is due: when two thirds of ttl
// are left, at once if fewer are. The deadline counts from when the grant
// or the last renewal was sent, so a slow answer does not shorten the time
// the next renewal has to land; a renewal timed from the answer would go
// out later after each slow one, with less time left.
func renewalDue(deadline time.Time, ttl time.Duration) time.Duration {
	return max(time.Until(deadline)-(ttl-ttl/renewDivisor), 0)
}

// renewalFailure says why a renewal, due at due and sent at sent, failed
// to land before the lease's deadline: the process, when a context
// deadline ended it and it went out more than a renewal period (a third of
// ttl) after it was due; Redis, when it did not answer in time (a renewal
// after a slow answer is due at once and may go out with little time
// left: Redis's slowness, not the process's) or failed (err matches
// ErrRedis then).
func renewalFailure(err error, sent, due, deadline time.Time, ttl time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) {
		left := deadline.Sub(sent).Round(time.Millisecond)
		if late := sent.Sub(due); late > ttl/renewDivisor {
			return fmt.Errorf("this process ran late: its renewal went out %v after it was due, only %v before the lease's deadline", late.Round(time.Millisecond), left)
		}
		return fmt.Errorf("%w: Redis did not answer within the %v left before the lease's deadline", ErrRedis, left)
	}
	if !errors.Is(err, ErrRedis) { // a dial error already says it
		err = fmt.Errorf("%w: %w", ErrRedis, err)
	}
	return err
}

// LeaseContext returns a copy of parent that is also cancelled when lease
// ends, with the lease's [Lease.Err] as cause (see [context.Cause]), so work
// done under the lease can stop once the lease no longer protects it.
//
// The context is also owned by the lease (and by the leases parent is
// owned by, through LeaseContexts nested one in another): a waiting
// acquisition under it ([Client.Acquire], [Client.AcquireAll] and the
// calls of packages semaphore, multilock and election built on them)
// that asks for permits the lease holds, more than the capacity minus
// those held, fails at once with [ErrDeadlock] rather than wait for a
// lease that cannot end while its holder waits: a mutex locked again, a
// write lock asked for under a read lock of the same RWMutex. A lease
// counts while its [Lease.Err] is nil. docs/guide.md ("Ownership") says
// what the check cannot see: other contexts, other processes, other
// go-redis clients.
//
// The context is cancelled as the lease ends, before its Done channel closes
// and before the call that ended it (Release, CondWait, Close) returns;
// for a lease that has already ended (Err is not nil) it is returned
// cancelled. Call cancel when the work is done to free the resources it
// holds; it ends the context with [context.Canceled] and leaves the lease
// alone. LeaseContext fails in no way: a nil lease gives a context
// cancelled at once, with a cause matching [ErrInvalidArgument].
// (It is not an [Option]; the options that set TTLs are WithLeaseTTL and
// WithWaiterTTL.)
func LeaseContext(parent context.Context, lease *Lease) (ctx context.Context, cancel context.CancelFunc) {
	ctx, cancelCause := context.WithCancelCause(parent)
	cancel = func() { cancelCause(context.Canceled) }
	if lease == nil {
		cancelCause(fmt.Errorf("%w: LeaseContext of a nil lease", ErrInvalidArgument))
		return ctx, cancel
	}
	l := lease
	ctx = withOwner(ctx, l)
	// A lease that has ended, or is past its deadline, its timers run or
	// not, gives a context ended at once.
	ending := l.lapse(time.Now())
	l.emu.Lock()
	if l.subsEnded || ending != nil {
		cause := l.cause
		if !l.subsEnded {
			cause = ending
		}
		l.emu.Unlock()
		cancelCause(cause)
		return ctx, cancel
	}
	id := l.nsubs
	l.nsubs++
	if l.subs == nil {
		l.subs = make(map[uint64]context.CancelCauseFunc)
	}
	l.subs[id] = cancelCause
	l.emu.Unlock()
	return ctx, func() {
		l.emu.Lock()
		delete(l.subs, id)
		l.emu.Unlock()
		cancelCause(context.Canceled)
	}
}

// batchable reports whether l renews in batches.
func (l *Lease) batchable() bool { return len(l.p.parts) == 1 && l.c.cfg.ackReplicas == 0 }
