// Package robustness is fairlock's robustness suite, built the way etcd's
// tests/robustness and Jepsen's lock workloads check locks: real processes
// take fairlock's locks to guard a fenced resource while a nemesis injects
// faults, and the history they record is then checked.
//
// # Traffic
//
// Three child processes each run one fairlock.Client, talking to Redis
// through a TCP proxy of its own, each on a different Go Redis client: the
// test binary re-executed (go-redis), and the test binaries of
// fairlockrueidis and fairlockvalkey, which the run builds and whose
// TestMain runs [ChildMain] through their [Dial]. So every fault meets
// every client, and the three share the semaphores. A fault that strikes
// one child strikes each in turn. Each child runs four workers, each a
// loop of acquire, read-modify-write on the fenced store, release:
//
//   - a mutex (semaphore.NewMutex) guarding one register;
//   - a semaphore of capacity 3, taking 1 to 3 permits: a holder of all 3
//     is alone and read-modify-writes its register, the others only read it,
//     since up to 3 of them legitimately hold at once;
//   - a read-write mutex: writers read-modify-write, readers read;
//   - a multi-lock (multilock.Lock) of two mutexes, each guarding its own
//     register, fenced with its own part token.
//
// Two more workers join a run that asks for them: a countdown latch
// worker (latch.go: count down, count, wait on a sequence of latches,
// checked by [CheckLatch] against porcupine's [LatchModel]) and a cyclic
// barrier worker (barrier.go: every child awaits one barrier of three
// parties, round after round, checked by [CheckBarrier]: whole rounds,
// each ending between its parties' calls and returns, rising per party,
// never both completed and broken).
//
// # The fenced store
//
// The parent runs the store ([Store]), on loopback and never faulted. Per
// register it keeps a value, the highest token that wrote and the highest
// that read. A read carrying a token below the highest write token is
// refused; a write carrying one below the highest read or write token is
// refused. Readers therefore share (a read never refuses another read),
// while a holder whose lease was lost is refused as soon as a later holder
// has read or written. A refusal is a fenced rejection: a legal outcome,
// counted, after which the holder gives up its critical section.
//
// A single fenced register would be the wrong model for the capacity-3
// semaphore, whose holders are concurrent: there only the exclusive
// holders write, and the capacity itself is checked from the leases'
// lifetimes (below).
//
// # Validation
//
// [Check] validates a run:
//
//   - linearizability: each register's history of reads and writes, with
//     invocation and return times, is checked by porcupine against [Model],
//     whose state is the value and the highest tokens. A write carries the
//     value its holder read; the model accepts it only if that is the value
//     it overwrites, so two holders that both read v and both wrote v+1
//     (a lock failure the fencing did not stop) cannot be linearized, while
//     a refusal is legal exactly when the store's rule calls for one;
//   - no lost update: each register's final value equals the writes the
//     store accepted and the history records;
//   - capacity: at no moment do the leases of a semaphore hold more than its
//     capacity. Each lease's certainly-live span runs from Acquire's return
//     (after the grant) to the last time the child read the clock and then
//     found Lease.Err nil (a lease's Done closes before Redis can give its
//     permits to another), so it lies within the lease's life by Redis's
//     clock: Redis runs on the same host, and TIME reads the same clock;
//   - tokens: unique per semaphore, and increasing in grant order wherever
//     that order is known (one Acquire returned before another was called);
//   - deadlines: every acquire and release returned within a slack of its
//     context's deadline, except across a pause (SIGSTOP) of its process.
//
// # Nemesis
//
// Each fault is injected for a bounded time and healed: latency, stall or
// cut at the proxies (of one client or all), a child stopped past its
// lease (SIGSTOP), Redis paused, Redis killed and restarted with
// appendfsync always or everysec, a Sentinel failover (the master killed
// or paused, without and with WithReplicaAck; the children then reach
// Redis through Sentinel, not a proxy), and a Cluster move of the slots of
// every semaphore. A fault the docs say may break a promise (a restart
// that loses acknowledged writes, a failover without WithReplicaAck) may
// show the violations it is documented to cause; they are reported, not
// failed. On a latch or a barrier those are allowed only where the calls
// meet the fault's span (Limits.Faults, lostWrites): a failover's starts
// once the replica holds every write the master acknowledged (caughtUp).
// TestLatchUnderFaults and TestBarrierUnderFaults pick their rows from
// the same table (objectFaults); -robustness.mutate runs them with a
// rule of the Lua broken, and they must then fail. The short run (go test) injects each fault once, for a second or
// two; -robustness.long injects each -robustness.rounds times and
// -robustness.report writes the per-fault table (docs/reliability.md holds
// the latest). Under -short only the fault-free run and the checks' own
// tests run.
//
// # Rolling upgrades
//
// TestRollingUpgrade builds this package's test binary from the previous
// release (previousRelease, a commit of this repository) and runs it as
// two of the three children, beside one of this build, fault-free, with
// every connection cut, and with a child of either release stopped past
// its lease: two releases of fairlock on one Redis must keep the promises
// of one.
//
// # Mutations
//
// [Mutations] breaks one rule of the Lua at a time (the capacity check,
// the token sequence, a latch that opens early, a barrier round that
// completes a party short) through internal/testhook in the children, and
// TestMutationsCaught requires the checks to fail.
package robustness
