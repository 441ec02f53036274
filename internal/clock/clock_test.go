package clock

import (
	"testing"
	"time"
)

// The scripts read Redis's clock in whole milliseconds, rounded down, so
// a script that reads redis may run as late as redis+1ms less a hair: a
// lease it sets to expire at redis+d then expires d less that hair after
// it ran. A local deadline must come before that, even for a script that
// ran the moment it was sent.
func TestLocalDeadlineAllowsForClockTick(t *testing.T) {
	sent := time.Now()
	const redis, d = int64(1_000_000), int64(300)
	// The worst case: the script ran at local time sent, with Redis's
	// clock at redis+1ms less a nanosecond; Redis reaches redis+d a
	// nanosecond more than d-1ms later.
	expiry := sent.Add(time.Duration(d)*time.Millisecond - time.Millisecond + time.Nanosecond)
	if got := (Sample{Sent: sent, Redis: redis}).LocalDeadline(redis + d); !got.Before(expiry) {
		t.Fatalf("LocalDeadline = sent%+v, not before Redis's expiry at sent%+v", got.Sub(sent), expiry.Sub(sent))
	}
	if got := ExpiresAfter(sent, time.Duration(d)*time.Millisecond); !got.Before(expiry) {
		t.Fatalf("ExpiresAfter = sent%+v, not before Redis's expiry at sent%+v", got.Sub(sent), expiry.Sub(sent))
	}
	// A TTL that is not whole milliseconds is sent rounded down.
	if got := ExpiresAfter(sent, time.Duration(d)*time.Millisecond+999*time.Microsecond); !got.Before(expiry) {
		t.Fatalf("ExpiresAfter(%dms+999µs) = sent%+v, not before Redis's expiry at sent%+v", d, got.Sub(sent), expiry.Sub(sent))
	}
}
