package fairlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/fault"
)

var (
	// ErrNotAcquired is returned by TryAcquire when the permits are not
	// free at once, or when earlier waiters are queued for them.
	ErrNotAcquired = fault.ErrNotAcquired

	// ErrLeaseLost reports that a lease ended without being released: it
	// expired, could not be renewed in time, or was dropped from Redis. The
	// holder's critical section may have overlapped the next holder's; the
	// fencing token is how a resource protects itself from that.
	ErrLeaseLost = fault.ErrLeaseLost

	// ErrMaxHold reports that a lease reached its cap on holding (see
	// [WithMaxHold] and [Request.MaxHold]): it was not renewed past the
	// cap, so it ended there though its holder had not released it. It
	// matches [ErrLeaseLost] too (errors.Is(ErrMaxHold, ErrLeaseLost)
	// holds): for the holder the outcome is the same as a lost lease, its
	// critical section is no longer protected, and code that checks
	// ErrLeaseLost learns so without knowing of the cap.
	ErrMaxHold = fault.ErrMaxHold

	// ErrNotHeld is returned by Release on a lease that was already
	// released, and matches the cause [Lease.Err] reports after a release
	// ("fairlock: lease released").
	ErrNotHeld = fault.ErrNotHeld

	// ErrCapacityMismatch is returned when a semaphore is used with a
	// capacity other than the one stored with it in Redis. The stored
	// capacity holds until the semaphore is idle: no live holders and no
	// live waiters (leases that expired and waiters whose process died are
	// looked past: up to 400 of them per call; more are dropped by the
	// calls with the stored capacity, or go with the keys' expiry).
	ErrCapacityMismatch = fault.ErrCapacityMismatch

	// ErrInvalidName is returned for a semaphore name fairlock cannot use:
	// empty, longer than [MaxNameLen], not UTF-8, holding control
	// characters, consisting of one hash tag alone ("{acct}", which would
	// share its keys with "acct"), or holding a '}' without carrying a
	// hash tag ("a}b", "}x", "{}x": the first would share its keys with
	// "{a}b}", the others would have keys in different Cluster slots), or
	// carrying a hash tag that does not begin it ("b{c}" under the prefix
	// "a" would share its keys with "c" under the prefix "ab"; use
	// "{c}:b").
	// Distinct valid names never share a Redis key.
	ErrInvalidName = fault.ErrInvalidName

	// ErrInvalidArgument is returned for an argument out of range: permits
	// <= 0 or above the capacity, capacity <= 0 or above [MaxCapacity], a
	// non-positive duration, a nil client.
	ErrInvalidArgument = fault.ErrInvalidArgument

	// ErrCrossSlot is returned for a request over several semaphores whose
	// keys live in different Redis Cluster hash slots: one script cannot
	// change them atomically. Names that share a hash tag ("{acct}:1",
	// "{acct}:2") share a slot.
	ErrCrossSlot = fault.ErrCrossSlot

	// ErrNotReplicated is returned, with [ErrRedis], when a client made
	// with [WithReplicaAck] did not see its write acknowledged by enough
	// replicas in time.
	ErrNotReplicated = fault.ErrNotReplicated

	// ErrForeignKey reports that a key in fairlock's key space holds a
	// value of another type than fairlock keeps there: another program
	// wrote it. The call that met it changed nothing in Redis; the error
	// names the key. It matches [ErrRedis] too. Delete the key, or give
	// fairlock a key prefix of its own ([WithPrefix]).
	ErrForeignKey = fault.ErrForeignKey

	// ErrIncompatible reports that a semaphore's keys are in a layout
	// another release of fairlock keeps, which this release does not
	// read: a fleet being upgraded runs two releases on one name. The call
	// that met them changed nothing in Redis; the error names the key and
	// both layouts. It matches [ErrRedis] too, so code that retries Redis
	// failures retries it; it lasts until the semaphore is idle and its
	// keys have expired, or every process runs one release.
	// docs/reliability.md ("Upgrading a fleet") says what an upgrade needs.
	ErrIncompatible = fault.ErrIncompatible

	// ErrDeadlock is returned at once by a call that would wait for
	// permits the caller holds itself: its context carries a live lease
	// (see [LeaseContext]) holding so many permits of a semaphore it asks
	// for that the request cannot be granted while that lease is held (a
	// mutex locked again, a write lock asked for under a read lock of the
	// same RWMutex, more permits than the capacity minus those held).
	// Nothing is sent to Redis for such a request. The error names the
	// semaphore and the token of the lease that holds it. Calls that never
	// wait (TryAcquire and the other Try calls) are not checked: they
	// return [ErrNotAcquired] as for any busy semaphore. docs/guide.md
	// ("Ownership") says what the check cannot see.
	ErrDeadlock = fault.ErrDeadlock

	// ErrClosed is returned by calls on a [Client] after Close (or
	// Shutdown, or Abandon), and is the cause of the leases the close
	// ended (see [Lease.Err]).
	ErrClosed = fault.ErrClosed

	// ErrRedis wraps a failure reported by Redis or by the connection to it:
	// network errors, OOM under maxmemory, a key of another program's in
	// fairlock's key space ([ErrForeignKey]), keys of another release's
	// layout ([ErrIncompatible]). The original error is
	// wrapped too, so errors.As still reaches it.
	ErrRedis = fault.ErrRedis
)

// Error is the error fairlock's calls return: the operation, the
// semaphores it was on, and why it failed. Err is what errors.Is and
// errors.As look through: one of the sentinels above (ErrLeaseLost,
// ErrRedis, ...), the caller's context error, and, with ErrRedis, the
// error go-redis reported.
type Error struct {
	Op    string   // "acquire", "try acquire", "release", "renew", "hold", "wait", "signal", "broadcast", "status", "new", "close", "shutdown"; a latch's "new latch", "count down", "wait latch", "latch count"; a barrier's "new barrier", "await barrier", "barrier status"
	Names []string // the semaphores, in name order; none for "new", "close" and "shutdown"
	Err   error
}

// Error reads "fairlock: <op> <names>: <why>", naming fairlock once.
func (e *Error) Error() string {
	why := "<nil>"
	if e.Err != nil {
		why = strings.ReplaceAll(e.Err.Error(), "fairlock: ", "")
	}
	if len(e.Names) == 0 {
		return "fairlock: " + e.Op + ": " + why
	}
	return "fairlock: " + e.Op + " " + labelOf(e.Names) + ": " + why
}

func (e *Error) Unwrap() error { return e.Err }

// opError returns err as an *Error of op on names.
func opError(op string, names []string, err error) error {
	return &Error{Op: op, Names: names, Err: err}
}

// labelOf names one semaphore ("a") or several (["a" "b"]) in messages.
func labelOf(names []string) string {
	if len(names) == 1 {
		return strconv.Quote(names[0])
	}
	return fmt.Sprintf("%q", names)
}

// transient reports whether err, from a script call, is one that passes:
// the call was refused or lost on its way (a connection dropped or
// refused, a Cluster slot migrating or moved, a server loading its data,
// a replica promoted or demoted, a cluster or master down, a server busy
// with a script) and sending it again later may land. A script's own
// error reply (FAIRLOCK_..., a wrong key type), out-of-memory and a closed
// go-redis client are not: sending again gives the same answer.
func transient(err error) bool {
	if err == nil {
		return false
	}
	if msg, ok := fault.ReplyOf(err); ok {
		for _, p := range []string{"TRYAGAIN", "LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "MOVED", "ASK", "BUSY", "NOREPLICAS"} {
			if strings.HasPrefix(msg, p+" ") || msg == p {
				return true
			}
		}
		return false
	}
	var nerr net.Error
	return errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, context.DeadlineExceeded)
}

// leftAsIs reports whether a script call that failed with err left Redis
// as it was: the call never reached Redis (a dial error), or a fairlock
// script refused it (a FAIRLOCK_ reply: a script refuses before its first
// write). Nothing of such a call is to be withdrawn. (A dial error's
// withdrawal, if any, is the call's late clean-up's.) Another refusal
// (OOM, READONLY, LOADING...) leaves this try as it was, but not an
// earlier try of the same call that ran and whose reply was lost: the
// Redis client then returns the last try's error.
func leftAsIs(err error) bool {
	if fault.IsDialError(err) {
		return true
	}
	msg, replied := fault.ReplyOf(err)
	return replied && strings.HasPrefix(msg, "FAIRLOCK_")
}

// cutShort reports whether err is a context's: a call cut short by its
// caller's context, which may not have been sent at all (go-redis checks
// the context before it sends).
func cutShort(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

const (
	capacityErrPrefix = "FAIRLOCK_CAPACITY "
)

// fail turns an error from Redis or the connection into fairlock's error
// for op on the semaphores names (in the order the script took them). It is
// the one place where Redis errors become a call's (the errors a script
// names, through fault.ScriptError, which the background paths use too).
func fail(ctx context.Context, op string, names []string, err error) error {
	// Only the caller's context makes a context error the caller's; an
	// internal timeout means Redis did not answer in time.
	if ctxErr := ctx.Err(); ctxErr != nil {
		return opError(op, names, ctxErr)
	}
	if callpath.DeadlineLike(err) && callpath.PastDeadline(ctx) {
		// ctx's deadline, passed a moment before ctx says so (settle).
		return opError(op, names, context.DeadlineExceeded)
	}
	if errors.Is(err, ErrRedis) {
		return opError(op, names, err)
	}
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, capacityErrPrefix); ok {
		// "<stored> <index>": the capacity stored with the index-th
		// semaphore.
		stored, idx, _ := strings.Cut(rest, " ")
		i, _ := strconv.Atoi(idx)
		if len(names) > 1 && i >= 1 && i <= len(names) {
			return opError(op, names, fmt.Errorf("%w: stored capacity of %q is %s", ErrCapacityMismatch, names[i-1], stored))
		}
		return opError(op, names, fmt.Errorf("%w: stored capacity is %s", ErrCapacityMismatch, stored))
	}
	if mapped := fault.ScriptError(err); mapped != err {
		return opError(op, names, mapped)
	}
	if strings.HasPrefix(msg, "CROSSSLOT") {
		return opError(op, names, fmt.Errorf("%w: %w", ErrCrossSlot, err))
	}
	return opError(op, names, fmt.Errorf("%w: %w", ErrRedis, err))
}
