// Package clock relates Redis's clock, as the scripts read it, to the
// local one: the local deadlines by which a lease or a waiter is counted
// come before Redis can have expired it.
package clock

import "time"

// A Sample relates Redis's clock to the local one: a script that
// reported Redis's time Redis was sent at local time Sent, so Redis's
// moment Redis came no earlier than Sent.
type Sample struct {
	Sent  time.Time
	Redis int64 // ms
}

// Never is a delay no timer reaches: a timer's duration for "not
// planned", whatever is planned comes earlier.
const Never = time.Duration(1<<63 - 1)

// Tick is the resolution of Redis's clock as the scripts read it:
// whole milliseconds, rounded down. A script that reports the time R (a
// Sample's Redis) may run with Redis's clock anywhere in [R, R+1 ms), so
// what it sets to expire at R+d (d in whole milliseconds) may expire up to a tick less than d
// after the script ran. Every local deadline allows for that tick.
const Tick = time.Millisecond

// LocalDeadline returns a local time before the moment Redis's clock
// reaches at (ms), by s: so a lease counted to it ends, locally, before
// Redis can have expired it. Redis's clock stood at Redis plus up to a
// tick when the script read it, no earlier than Sent, so it reaches at no
// sooner than at-Redis less a tick after Sent.
func (s Sample) LocalDeadline(at int64) time.Time {
	return s.Sent.Add(time.Duration(at-s.Redis)*time.Millisecond - Tick)
}

// ExpiresAfter returns a local time before Redis expires what a script
// sent at sent set to last d from its clock: d in whole milliseconds, as
// MS renders it for the script, less a tick (see Tick).
func ExpiresAfter(sent time.Time, d time.Duration) time.Time {
	return sent.Add(time.Duration(MS(d))*time.Millisecond - Tick)
}

// MS renders a duration as whole milliseconds, at least 1, for scripts.
func MS(d time.Duration) int64 {
	return max(int64(d/time.Millisecond), 1)
}
