package robustness

import (
	"testing"

	"github.com/fairlock/fairlock/internal/redistest"
)

// TestLatchUnderFaults runs the traffic with the latch worker in every
// child under the faults of the proxy (a client's connection cut, every
// client's stalled; each is also what makes go-redis resend) and with
// none: the latch calls must be linearizable against LatchModel and each
// return by its deadline, beside the semaphores' checks.
func TestLatchUnderFaults(t *testing.T) {
	redistest.Long(t)
	for _, f := range faults {
		switch f.name {
		case "none", "proxy cut 1.5s, one client", "proxy stall 1.5s, all clients":
		default:
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			sc := f.scenario
			sc.latch = true
			expectClean(t, run(t, sc))
		})
	}
}
