package robustness

import (
	"testing"

	"github.com/fairlock/fairlock/internal/redistest"
)

// TestBarrierUnderFaults runs the traffic with the barrier worker in
// every child under the faults of the proxy (a client's connection cut,
// every client's stalled; each also makes go-redis resend) and with none:
// the Awaits must pass CheckBarrier (whole rounds, each ending between
// its parties' calls and returns, rising per party, never both completed
// and broken) and each return by its deadline, beside the semaphores'
// checks.
func TestBarrierUnderFaults(t *testing.T) {
	redistest.Long(t)
	for _, f := range faults {
		switch f.name {
		case "none", "proxy cut 1.5s, one client", "proxy stall 1.5s, all clients":
		default:
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			sc := f.scenario
			sc.barrier = true
			expectClean(t, run(t, sc))
		})
	}
}
