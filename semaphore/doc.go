// Package semaphore provides fair, first-in first-out counting
// semaphores, mutexes and read-write mutexes shared by processes through
// Redis.
//
// Permits are granted strictly in arrival order across every process that
// uses the same semaphore name: nobody barges, and a large request at the
// head of the queue is not starved by a stream of small ones. Each grant is
// a [fairlock.Lease] carrying a fencing token; it is renewed automatically
// while held and ends (its Done channel closes) if it is lost.
//
// The values in this package hold no per-acquisition state and are safe
// for concurrent use; they are cheap, and may be created per call.
package semaphore
