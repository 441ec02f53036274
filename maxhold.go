package fairlock

import (
	"context"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/script"
)

// The cap on holding ([WithMaxHold], [Request.MaxHold]) lives in the
// renewal: a lease is renewed only up to its cap, and its last renewal asks
// Redis for just the time left, so Redis's own expiry, not the holder's
// goodwill, ends it there. The holder's Done closes at the cap on the local
// clock. Redis's expiry, set in whole milliseconds of its clock, may come up
// to two of them before the cap; Err reports the cap from then on (see
// cappedRenewal).

// maxHold returns the cap on holding p's lease: the earliest of its parts'
// caps, each its Request.MaxHold or else def (the client's); 0 for none.
func (p plan) maxHold(def time.Duration) time.Duration {
	var d time.Duration
	for _, pt := range p.parts {
		h := pt.req.MaxHold
		if h == 0 {
			h = def
		}
		if h > 0 && (d == 0 || h < d) {
			d = h
		}
	}
	return d
}

// capHold sets the lease's cap (if it has one) and returns when its first
// renewal is due: first, or at once if Redis's expiry of the grant lies
// beyond the cap (a cap shorter than the grant's TTL). The cap counts from
// the earliest moment the grant can have happened by the local clock: its
// deadline less the TTL Redis gave it (a lease TTL, or, for an announced
// grant, the shorter of the lease and waiter TTLs), and no later than now.
func (l *Lease) capHold(first time.Duration, announced bool) time.Duration {
	l.maxHold = l.p.maxHold(l.c.cfg.maxHold)
	if l.maxHold == 0 {
		return first
	}
	given := l.p.ttl(l.c)
	if announced {
		given = min(given, l.c.cfg.waiterTTL)
	}
	granted := l.deadline.Add(clock.Tick - given) // (see clock.Sample.LocalDeadline)
	if now := time.Now(); now.Before(granted) {
		granted = now
	}
	l.holdEnd = granted.Add(l.maxHold)
	if l.deadline.After(l.holdEnd) {
		return 0
	}
	return first
}

// renewalTTL returns the TTL to ask a renewal sent at sent for: the lease
// TTL, or the time left to the cap when that is shorter (capped), in whole
// milliseconds as the scripts take it and rounded down so that Redis's
// expiry lands at the cap, not after it; at least 1 ms, so that a renewal
// sent past the cap still brings Redis's expiry down to about now.
func (l *Lease) renewalTTL(ttl time.Duration, sent time.Time) (d time.Duration, capped bool) {
	if l.holdEnd.IsZero() {
		return ttl, false
	}
	left := l.holdEnd.Sub(sent).Truncate(time.Millisecond)
	if left >= ttl {
		return ttl, false
	}
	return max(left, time.Millisecond), true
}

// cappedRenewal notes a renewal, sent at sent for d, that brought Redis's
// expiry to the cap: nothing more is renewed, and the timer ends the lease
// at the cap. d is rounded down to whole milliseconds and Redis counts it
// from its clock rounded down, so Redis may expire the lease up to two
// ticks before the cap: the deadline says when, and Err reports the cap
// from then on. Called with rmu held.
func (l *Lease) cappedRenewal(sent time.Time, d time.Duration) {
	l.capped = true
	l.deadline = clock.ExpiresAfter(sent, d)
	if l.deadline.After(l.holdEnd) {
		// A 1 ms renewal sent past the cap.
		l.deadline = l.holdEnd
	}
	l.schedule(time.Until(l.holdEnd))
}

// answerBy returns until when a renewal sent at sent waits for its answer:
// the lease's deadline, or the cap if that comes first (a cap shorter than
// the grant's TTL) and has not yet come, so that a Redis that does not
// answer cannot keep the lease past its cap.
func (l *Lease) answerBy(deadline, sent time.Time) time.Time {
	if l.holdEnd.After(sent) && l.holdEnd.Before(deadline) {
		return l.holdEnd
	}
	return deadline
}

// holdOver reports whether the lease has reached its cap at now, with
// Redis's expiry of it no later than the cap: nothing is left to renew or
// shorten. Called with rmu held.
func (l *Lease) holdOver(now time.Time) bool {
	return !l.holdEnd.IsZero() && !now.Before(l.holdEnd) && !l.deadline.After(l.holdEnd)
}

// pastCap reports whether now is at or past the lease's cap.
func (l *Lease) pastCap(now time.Time) bool {
	return !l.holdEnd.IsZero() && !now.Before(l.holdEnd)
}

// untilCap returns d, or the time left to the cap if that is shorter.
func (l *Lease) untilCap(d time.Duration) time.Duration {
	if l.holdEnd.IsZero() {
		return d
	}
	return min(d, time.Until(l.holdEnd))
}

// endAtCap ends the lease at its cap: Done closes with cause (see
// maxHoldErr), then the lease is released in the background (for up to
// one waiter TTL, as any clean-up). Redis expires it about now anyway (its last renewal asked
// for no more), so releasing changes no one's safety; it wakes the next
// waiter now, whose timer may be set for the later expiry the lease had
// before its last renewal shortened it, and frees a grant that outlasts
// the cap because the renewal meant to shorten it failed.
func (l *Lease) endAtCap(cause error, announced bool) {
	l.finish(cause)
	rel := l.p.releaseCall(script.OpRelease, l.ticket, l.c, announced, l.tokens)
	l.c.spawn(func() { l.c.cleanUp(context.Background(), rel, l.p) })
}

// maxHoldErr is the cause a lease ends with at its cap.
func (l *Lease) maxHoldErr() error {
	return opError("hold", l.p.names, fmt.Errorf("%w (%v)", ErrMaxHold, l.maxHold))
}
