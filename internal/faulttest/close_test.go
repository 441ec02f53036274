package faulttest

import (
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// A holder process that closes its client on its way out (Close, or
// Shutdown with a context while its work releases the lease) hands its
// lease to the next waiter, another process, within a few round trips,
// not when the lease's TTL (10 s) runs out; one that abandons its client
// leaves the lease to expire, so the next waiter waits out the TTL, as
// after a crash.
func TestHolderProcessCloses(t *testing.T) {
	b := redistest.RealBackend(t)
	for _, mode := range []string{"close", "shutdown", "abandon"} {
		t.Run(mode, func(t *testing.T) {
			s := newSpec(t, b.Addr, "closing", 1)
			s.lease = 10 * time.Second
			if mode == "abandon" {
				s.lease = 900 * time.Millisecond
			}
			c := client(t, s)
			holder := start(t, mode, s)
			holder.token(10 * time.Second)
			waiter := start(t, "hold", s)
			waitWaiters(t, c, s, 1)
			begun := time.Now()
			_ = holder.stdin.Close()
			if got := holder.expect("closed ", 10*time.Second); got != "<nil>" {
				t.Fatalf("the holder's %s: %s", mode, got)
			}
			closed := time.Since(begun)
			got := holder.expect("lease ", time.Second)
			if mode == "shutdown" {
				// Shutdown let the work release its lease itself.
				if !strings.Contains(got, "lease released") || strings.Contains(got, "client closed") {
					t.Fatalf("the holder's lease ended with %q, want released by its holder", got)
				}
			} else if !strings.Contains(got, "client closed") {
				t.Fatalf("the holder's lease ended with %q, want the client closed", got)
			}
			waiter.token(s.lease + 5*time.Second)
			took := time.Since(begun)
			t.Logf("%s: the holder closed in %v; the waiter (another process) was granted %v after the holder was told to close (lease TTL %v)",
				mode, closed.Round(time.Microsecond), took.Round(time.Microsecond), s.lease)
			switch {
			case mode != "abandon" && took > time.Second:
				t.Errorf("the waiter was granted %v after the holder's %s, want well under the lease TTL (%v)", took, mode, s.lease)
			case mode == "abandon" && took < s.lease/3:
				// Renewed every third of the TTL, the lease had at least
				// two thirds of it left when the holder abandoned it.
				t.Errorf("the waiter was granted %v after the holder's Abandon, want the lease's TTL (%v) waited out", took, s.lease)
			}
			holder.stop(5 * time.Second)
			waiter.stop(5 * time.Second)
		})
	}
}
