package robustness

import (
	"testing"

	"github.com/fairlock/fairlock/internal/redistest"
)

// TestBarrierUnderFaults runs the traffic with the barrier worker in
// every child under objectFaults (latch_test.go): the Awaits must pass
// CheckBarrier (whole rounds, each ending between its parties' calls and
// returns, rising per party, never both completed and broken) and each
// return by its deadline, beside the semaphores' checks, but for what a
// row allows.
func TestBarrierUnderFaults(t *testing.T) {
	redistest.Long(t)
	for _, f := range pick(t, objectFaults...) {
		t.Run(f.name, func(t *testing.T) {
			sc := f.scenario
			sc.barrier, sc.mutation = true, *mutate
			res, _ := runFault(t, f, sc)
			expectTraffic(t, res)
		})
	}
}
