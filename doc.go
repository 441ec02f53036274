// Package fairlock is the engine of fair, first-in first-out distributed
// semaphores on Redis.
//
// A [Client] stands for one process. It grants permits of named semaphores
// strictly in arrival order: a request at the head of the queue that does not
// fit yet blocks later, smaller ones, and nobody barges past a waiter.
// Every change of state is one Lua script that judges time by Redis's own
// clock. A release grants the freed permits to the next waiters inside the
// same script and wakes them through a list they block on, so no one polls.
//
// Each grant is a [Lease] with a fencing token, renewed automatically while
// held. A holder that crashes stops renewing and its permits return when the
// lease TTL runs out; a waiter that crashes stops refreshing and leaves the
// queue after the waiter TTL. Neither delays anybody by more than one TTL.
//
// Most programs use package [github.com/fairlock/fairlock/semaphore], which
// offers counting semaphores, mutexes and read-write mutexes on top of
// this package.
//
// # Redis keys
//
// A semaphore named N keeps its state under keys starting with
// prefix+"{N}" (or prefix+N when N already carries a hash tag such as
// "{acct}:17"), so all its keys share a Cluster slot:
//
//	:s  hash    capacity and permits in use
//	:q  zset    waiting tickets by arrival
//	:d  zset    waiting tickets by liveness deadline
//	:h  zset    leases by expiry
//	:i  hash    ticket records
//	:t  string  last sequence number (expires on its own)
//	:w:<client> list of wake-ups for one client's waiters
//
// Every key expires when the last lease or waiter deadline it records has
// passed, and an idle semaphore's keys are deleted at once. fairlock needs
// Redis 6.2 or later with a maxmemory-policy that never evicts keys with a
// TTL (noeviction, the default, or an allkeys- policy in a Redis used only
// for locks is not enough: use noeviction).
package fairlock
