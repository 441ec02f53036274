package fairlock

import (
	"sync/atomic"
	"time"
)

// EventKind says what happened in an [Event].
type EventKind int

// The events a [Client] reports to its [Observer].
const (
	// WaitStarted: a request joined a queue (it was not granted at once),
	// a lease began to wait on a condition variable (semaphore.Cond.Wait),
	// a countdown latch's Wait (package latch) began to wait (the latch
	// was not open), or a cyclic barrier's Await (package barrier) began
	// to wait (its arrival was registered, and was not its round's last:
	// the last party's Await returns at once and reports nothing).
	WaitStarted EventKind = iota + 1
	// Granted: a request was granted, at once (Wait is 0) or after
	// waiting (Wait is how long: for a condition wait, on the condition
	// and then in the queue).
	Granted
	// WaitAbandoned: a queued request or a latch's Wait gave up, or a
	// barrier's Await ended without its round completing (Err says why:
	// the caller's context, Close, or Redis; for an Await also its round
	// broken by another party, an error matching barrier.ErrBrokenBarrier);
	// Wait is how long it waited.
	WaitAbandoned
	// LeaseRenewed: a renewal extended a lease; Held is its age.
	LeaseRenewed
	// LeaseReleased: the holder released a lease; Held is how long it was
	// held.
	LeaseReleased
	// LeaseLost: a lease ended without its holder's release (Err says
	// why: expired, not renewed in time, dropped, or the client closed);
	// Held is how long it was held. A lease its client's Close or Shutdown
	// released is lost to its holder, whose work under it was cut short,
	// as one Abandon left to expire is: both report LeaseLost with an Err
	// matching ErrClosed (its message says which), as the lease's own Err
	// does; LeaseReleased is the holder's release alone.
	LeaseLost
	// WaitEnded: a wait that grants nothing ended because what it waited
	// for happened: a countdown latch's Wait returned because the latch
	// opened, or a barrier's Await because its round completed. Wait is
	// how long it waited. No lease follows.
	WaitEnded
)

var kindNames = [...]string{"", "wait_started", "granted", "wait_abandoned", "lease_renewed", "lease_released", "lease_lost", "wait_ended"}

// String returns the kind's name in snake case ("lease_lost"), or
// "unknown" for a value that is not one of the kinds.
func (k EventKind) String() string {
	if k > 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// An Event is one thing a [Client] reports to its [Observer].
type Event struct {
	Kind EventKind
	// Names are the semaphores of the request, in name order (one for a
	// single semaphore), the latch's name for a latch's Wait, or the
	// barrier's for a barrier's Await.
	Names []string
	// Permits are the permits asked or held, of each semaphore in Names
	// (nil for a latch's Wait or a barrier's Await, which ask for none).
	Permits []int64
	// Wait is how long the request waited (Granted, WaitAbandoned,
	// WaitEnded).
	Wait time.Duration
	// Held is how long the lease has been held (LeaseRenewed,
	// LeaseReleased, LeaseLost).
	Held time.Duration
	// Err says why a wait or a lease ended (WaitAbandoned, LeaseLost).
	Err error
	// ID tells one acquisition's events from another's, concurrent ones on
	// the same semaphores included: it is set once per call of Acquire,
	// TryAcquire, a condition wait (semaphore.Cond.Wait), a latch's Wait
	// or a barrier's Await, unique in this process (never 0), and
	// carried by the events of the lease that call returned. Each wait,
	// and each lease, is reported from its start to its end once: a lease
	// a condition wait spends ends under its own ID, and the wait goes on under a
	// new one. A grant the caller never receives (one that could not be
	// confirmed on the replicas with WithReplicaAck) is reported as the
	// wait abandoned, not as a lease.
	ID uint64
}

// An Observer receives a [Client]'s events, for metrics and tracing (see
// the module github.com/fairlock/fairlock/fairlockotel). Observe is called
// synchronously on the path that caused the event, from many goroutines at
// once: it must be safe for concurrent use, return quickly and not call
// back into the Client. An Observer that panics crashes the program, as a
// panicking callback would.
type Observer interface {
	Observe(Event)
}

// eventIDs hands out Event.ID, process-wide so that clients sharing an
// observer never repeat one.
var eventIDs atomic.Uint64

// A waitReport reports to its client's observer one wait that grants
// nothing: a countdown latch's Wait, a barrier's Await. The wait calls
// waiting each time it is registered in Redis to wait; its caller calls
// end with the error the call returns. The wait is reported, under one
// ID, from WaitStarted (at the first waiting, however often it asks
// again) to WaitEnded (end(nil): what it waited for happened) or
// WaitAbandoned (with the error); one that never waited reports nothing,
// its error included.
type waitReport struct {
	c       *Client
	id      uint64
	names   []string
	started time.Time
}

// reportWait returns the report of a wait on name that grants nothing:
// its waiting (nil when c has no observer, and nothing is reported) and
// its end.
func (c *Client) reportWait(name string) (waiting func(), end func(err error)) {
	if c.cfg.observer == nil {
		return nil, func(error) {}
	}
	w := &waitReport{c: c, id: eventIDs.Add(1), names: []string{name}}
	return w.waiting, w.end
}

// waiting reports the wait's start, the first time it waits.
func (w *waitReport) waiting() {
	if w.started.IsZero() {
		w.started = time.Now()
		w.c.observe(Event{Kind: WaitStarted, Names: w.names, ID: w.id})
	}
}

// end reports the wait's end, if it waited: WaitEnded when err is nil,
// WaitAbandoned with err otherwise.
func (w *waitReport) end(err error) {
	switch {
	case w.started.IsZero():
	case err == nil:
		w.c.observe(Event{Kind: WaitEnded, Names: w.names, Wait: time.Since(w.started), ID: w.id})
	default:
		w.c.observe(Event{Kind: WaitAbandoned, Names: w.names, Wait: time.Since(w.started), Err: err, ID: w.id})
	}
}
