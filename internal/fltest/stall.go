package fltest

import (
	"context"
	"time"
)

// StallTick is how often WatchStalls' goroutine wakes to look at the
// clock.
const StallTick = 10 * time.Millisecond

// WatchStalls runs, until ctx ends, a goroutine that wakes every
// StallTick and calls found with each span longer than min in which it was
// not woken: a span in which this process did not run (the host did not
// schedule it, or it was stopped), which no library promise can outlast.
// Fault tests that hold calls to deadlines and leases to their renewals
// excuse what a process's own stall accounts for, and nothing else.
func WatchStalls(ctx context.Context, min time.Duration, found func(from, till time.Time)) {
	go func() {
		t := time.NewTicker(StallTick)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			now := time.Now()
			if now.Sub(last) > min+StallTick {
				found(last, now)
			}
			last = now
		}
	}()
}
