// Package fairlock is the engine of fair, first-in first-out distributed
// semaphores on Redis.
//
// Most programs use package [github.com/fairlock/fairlock/semaphore], which
// offers counting semaphores, mutexes and read-write mutexes on top of
// this package, package [github.com/fairlock/fairlock/multilock] for
// several at once, and package [github.com/fairlock/fairlock/election] for
// a leader. An adapter for another Redis client implements package
// [github.com/fairlock/fairlock/backend].
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
// [Client.AcquireAll] takes several semaphores at once, all or nothing,
// sharing each one's first-in first-out order; it cannot deadlock.
//
// # Failure behaviour
//
// Every blocking call returns by its context's end, Redis up or down, with
// an error for which errors.Is(err, ctx.Err()) holds; what it left to do in
// Redis (withdrawing a ticket, finishing a release) goes on in the
// background, bounded, and [Client.Close] waits for it. Close releases the
// leases a client still holds, so that a process that exits hands them on
// at once; [Client.Shutdown] first lets the work under them finish and
// release them, until its context ends; [Client.Abandon] leaves them to
// expire instead. Errors from Redis
// or the connection match [ErrRedis]; a refused connection or a name that
// does not resolve is reported at once, to the calls waiting for a
// connection, not to those already sent (see [New]). A release refused by
// an error that passes (a migrating Cluster slot, a failover, a dropped
// connection) is sent again in the background until it lands or the lease
// would have expired anyway. With Redis at maxmemory, leases are still renewed and
// released and waiters kept alive; new requests are refused with
// ErrRedis. A lease whose renewals fail ends (its Done closes) before
// Redis can have given its permits to another; a process paused past its
// lease learns it only when it resumes, which is what fencing tokens are
// for. Failover can lose acknowledged writes: see [WithReplicaAck].
//
// # Redis keys
//
// A semaphore named N keeps its state under keys starting with
// prefix+"{N}" (or prefix+N when N already carries a hash tag such as
// "{acct}:17"), so all its keys share one hash tag, hence one Cluster
// slot. Distinct valid names never share a key ([ErrInvalidName] lists the
// names refused for that):
//
//	:s  hash    the layout, capacity, permits in use, counts, token sequence,
//	            key expiry, bounds on the earliest lease expiry and waiter
//	            deadline; one lease and its expiry (a mutex's only one);
//	            the tokens of live grants, for retried and withdrawn calls;
//	            a mark on each queued or condition-waiting ticket;
//	            tombstones of leases that ended without their release, and
//	            the replies of signals, for resent calls (10-20 s)
//	:q  zset    waiters by arrival
//	:d  zset    every waiter's liveness deadline: those of :q and of :c
//	:h  zset    the other leases, by expiry
//	:t  zset    tombstoned tickets by when they may be forgotten
//
// Every other key is derived: the base, the control character U+001F
// (␟ here), a kind, and mostly ␟ and a payload. No name, condition name,
// prefix or client id holds a control character, so a derived key is
// never another object's:
//
//	␟c␟<cond>   zset  waiters on a condition variable of the mutex N, by
//	                  arrival (<cond> empty for the default one)
//	␟w␟<client> list  wake-ups for one client's waiters on Cluster; on a
//	                  single node they all share one list,
//	                  <prefix>{w:/<len(prefix)>/<client>}
//	␟ld, ␟lc    an election's record and change channel (package election)
//
// Every key expires once the deadlines it records have passed. An idle
// semaphore keeps only :s (and :t while it has tombstones), for at most
// two minutes; the release that leaves it idle deletes it when its token
// sequence is more than a second old and it has no tombstones. A mutex
// held and released without contention uses :s alone. fairlock needs Redis 7.0 or
// later or Valkey 8 (the versions its tests run on; Redis 6.2 runs its
// scripts, untested), run with maxmemory-policy noeviction: a volatile-* policy evicts
// keys with a TTL first. Where the server has functions (Redis 7 and
// later, Valkey), the scripts run as a function library loaded once per
// server; elsewhere as EVALSHA.
package fairlock
