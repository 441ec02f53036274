// Package election elects one leader among processes, on top of fairlock's
// fair mutex.
//
// Every candidate is a waiter of one fair mutex, so candidates are served
// in the order they asked: [Election.Campaign] blocks until the candidate
// holds the mutex, records its value, and returns its [Leadership]. The
// leader's term is the lease's fencing token, so terms strictly increase
// over an election's leaders; a resource that remembers the highest term
// it has seen can refuse a deposed leader. [Leadership.Done] closes when
// leadership ends: resigned, lease lost (a crash, a pause past the lease
// TTL, Redis unreachable for that long), or client closed.
// [Leadership.Resign] hands the mutex to the next candidate at once.
//
// [Election.Leader] reads the current leader; it never reports a leader
// whose lease has ended by Redis's clock. [Election.Observe] pushes every
// change of leader, through Redis pub/sub, and reads the leader again
// after every (re)subscription, so an observer that was disconnected
// resynchronises and never misses the latest leader. Every way a
// leadership ends reaches observers: a resignation or the leader's
// client closing is published; a lease that lapses with nobody to say so
// (a crash, a pause) is seen at its expiry, when observers read the
// leader again.
//
// # Redis keys
//
// An election named N uses the mutex N (the keys of package fairlock,
// under prefix+"{N}") and adds, in the same hash tag:
//
//	␟ld   hash     the leader record {value, term}; renewed by its leader at
//	               a third of the lease TTL, it expires two lease TTLs
//	               after the last renewal
//	␟lc   channel  pub/sub channel of changes: "term value" when a leader
//	               takes office, "0" when one resigns or its client closes
//
// (␟ is the control character U+001F, which no name holds, so these are
// never another semaphore's keys.)
package election
