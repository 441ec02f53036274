package fairlock

import "time"

// clockSample relates Redis's clock to the local one: a script that
// reported Redis's time redis was sent at local time sent, so Redis's
// moment redis came no earlier than sent.
type clockSample struct {
	sent  time.Time
	redis int64 // ms
}

// localDeadline returns a local time no later than the moment Redis's
// clock reaches at (ms), by s: so a lease counted to it ends, locally,
// before Redis can have expired it.
func (s clockSample) localDeadline(at int64) time.Time {
	return s.sent.Add(time.Duration(at-s.redis) * time.Millisecond)
}
