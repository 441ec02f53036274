package robustness

import (
	"testing"

	"github.com/fairlock/fairlock/internal/redistest"
)

// objectFaults are the rows of faults that TestLatchUnderFaults and
// TestBarrierUnderFaults run: none; the proxy's faults (a client's
// connection cut, every client's stalled; each is also what makes go-redis
// resend); a child stopped past its lease; Redis paused; a Sentinel
// failover with the master killed (without WithReplicaAck: the rows allow
// what lost writes can show, lostWrites) and with it paused under
// WithReplicaAck(1) (allowed: a latch with a count down that failed
// unacknowledged while the fault ran, unackedMark); and a Cluster slot move of every
// object's slot.
var objectFaults = []string{
	"none",
	"proxy cut 1.5s, one client",
	"proxy stall 1.5s, all clients",
	"client SIGSTOP 1.5s (lease 1s)",
	"Redis paused 1.5s",
	"Sentinel failover, master killed",
	"Sentinel failover, master paused, WithReplicaAck(1)",
	"Cluster: the slots of all four semaphores moved to another master",
}

// TestLatchUnderFaults runs the traffic with the latch worker in every
// child under objectFaults: the latch calls must be linearizable against
// LatchModel and each return by its deadline, beside the semaphores'
// checks, but for what a row allows.
func TestLatchUnderFaults(t *testing.T) {
	redistest.Long(t)
	for _, f := range pick(t, objectFaults...) {
		t.Run(f.name, func(t *testing.T) {
			sc := f.scenario
			sc.latch, sc.mutation = true, *mutate
			res, _ := runFault(t, f, sc)
			expectTraffic(t, res)
		})
	}
}

// expectTraffic fails t if a run took no lease or made no store call.
func expectTraffic(t *testing.T, res Result) {
	t.Helper()
	if res.Acquired == 0 || res.StoreOps == 0 {
		t.Errorf("no traffic: %d leases, %d store calls", res.Acquired, res.StoreOps)
	}
}
