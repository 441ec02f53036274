package fairlock

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Expiry returns the time, by this process's clock, until which the lease
// is surely held in Redis: it is counted from when its last renewal (or
// its grant) was sent, not from when Redis answered, so Redis expires the
// lease at this time or somewhat later, never earlier (as long as the two
// clocks run at the same rate). It is a lower bound, and a snapshot: a
// renewal moves it forward, every third of the lease's TTL. Expiry sends
// nothing and reads no clock; once the lease has ended (see [Lease.Err])
// it returns the zero time. It is meant for reporting and for a resource
// that takes a deadline with the fencing token; to know whether the
// lease is held, ask [Lease.Err], which ends the lease once this time
// has passed.
func (l *Lease) Expiry() time.Time {
	if l.endedBy() != nil {
		return time.Time{}
	}
	return l.expiresBy()
}

// String describes the lease for logs: its semaphore (each, for a lease
// over several), its fencing token, its permits, and whether it is held,
// released, abandoned ([Client.Abandon]) or lost, as in
//
//	fairlock lease "jobs": token 42, 1 permit, held
//
// It holds nothing that lets another process act on the lease. It sends
// nothing, and unlike [Lease.Err] it never ends a lease whose time has
// passed: it reports it "expired".
func (l *Lease) String() string {
	var b strings.Builder
	b.WriteString("fairlock lease ")
	b.WriteString(labelOf(l.p.names))
	b.WriteString(": ")
	for i, pt := range l.p.parts {
		if i > 0 {
			b.WriteString("; ")
		}
		if len(l.p.parts) > 1 {
			fmt.Fprintf(&b, "%q ", pt.req.Name)
		}
		unit := "permits"
		if pt.req.Permits == 1 {
			unit = "permit"
		}
		fmt.Fprintf(&b, "token %d, %d %s", l.tokens[i], pt.req.Permits, unit)
	}
	b.WriteString(", ")
	b.WriteString(l.state())
	return b.String()
}

// state says in a word whether the lease is held, without ending it.
func (l *Lease) state() string {
	err := l.endedBy()
	switch {
	case err == nil && time.Now().Before(l.expiresBy()):
		return "held"
	case err == nil:
		return "expired"
	case errors.Is(err, ErrNotHeld):
		return "released"
	case errors.Is(err, errClosedAbandoned):
		return "abandoned"
	case errors.Is(err, ErrClosed):
		return "released"
	default:
		return "lost"
	}
}
