package fairlock

import "time"

// clockSample relates Redis's clock to the local one: a script that
// reported Redis's time redis was sent at local time sent, so Redis's
// moment redis came no earlier than sent.
type clockSample struct {
	sent  time.Time
	redis int64 // ms
}

// clockTick is the resolution of Redis's clock as the scripts read it:
// whole milliseconds, rounded down. A script that reads redis may run with
// Redis's clock anywhere in [redis, redis+1 ms), so what it sets to expire
// at redis+d (d in whole milliseconds) may expire up to a tick less than d
// after the script ran. Every local deadline allows for that tick.
const clockTick = time.Millisecond

// localDeadline returns a local time before the moment Redis's clock
// reaches at (ms), by s: so a lease counted to it ends, locally, before
// Redis can have expired it. Redis's clock stood at redis plus up to a
// tick when the script read it, no earlier than sent, so it reaches at no
// sooner than at-redis less a tick after sent.
func (s clockSample) localDeadline(at int64) time.Time {
	return s.sent.Add(time.Duration(at-s.redis)*time.Millisecond - clockTick)
}

// expiresAfter returns a local time before Redis expires what a script
// sent at sent set to last d from its clock: d in whole milliseconds, as
// ms renders it for the script, less a tick (see clockTick).
func expiresAfter(sent time.Time, d time.Duration) time.Time {
	return sent.Add(time.Duration(ms(d))*time.Millisecond - clockTick)
}
