// Package fault holds the errors that fairlock's layers share: the
// sentinel errors the root package exports (each is documented there, under
// the same name), and the classes of failure the call path tells apart (a
// Redis error reply, a failed dial).
package fault

import (
	"errors"
	"fmt"

	"github.com/fairlock/fairlock/backend"
)

// The root package's sentinel errors (see fairlock.ErrNotAcquired and the
// rest): the root package exports these very values.
var (
	ErrNotAcquired            = errors.New("fairlock: not acquired")
	ErrLeaseLost              = errors.New("fairlock: lease lost")
	ErrMaxHold          error = &subError{"fairlock: maximum hold reached", ErrLeaseLost}
	ErrNotHeld                = errors.New("fairlock: lease not held")
	ErrCapacityMismatch       = errors.New("fairlock: capacity mismatch")
	ErrInvalidName            = errors.New("fairlock: invalid name")
	ErrInvalidArgument        = errors.New("fairlock: invalid argument")
	ErrCrossSlot              = errors.New("fairlock: semaphores in different cluster slots")
	ErrNotReplicated          = errors.New("fairlock: not acknowledged by replicas")
	ErrForeignKey       error = &subError{"fairlock: key written by another program", ErrRedis}
	ErrIncompatible     error = &subError{"fairlock: keys of another fairlock release", ErrRedis}
	ErrDeadlock               = errors.New("fairlock: deadlock")
	ErrClosed                 = errors.New("fairlock: client closed")
	ErrRedis                  = errors.New("fairlock: redis error")
)

// Sub returns a sentinel that is a special case of parent: errors.Is
// matches it to parent as well as to itself.
func Sub(msg string, parent error) error { return &subError{msg, parent} }

// subError is a sentinel that is a special case of another: errors.Is
// matches it to its parent as well as to itself.
type subError struct {
	msg    string
	parent error
}

func (e *subError) Error() string { return e.msg }
func (e *subError) Unwrap() error { return e.parent }

// DialError is the error of a call that ended when a dial failed: it
// matches ErrRedis. Whether the call's script ran is not known (an earlier
// attempt of go-redis's may have sent it on a connection that then broke),
// so its clean-up runs when the call ends, in the background (see call).
type DialError struct{ Err error }

func (e *DialError) Error() string   { return fmt.Sprintf("%v: cannot reach Redis: %v", ErrRedis, e.Err) }
func (e *DialError) Unwrap() []error { return []error{ErrRedis, e.Err} }

// IsDialError reports whether err is a call's return at a dial failure.
func IsDialError(err error) bool {
	if err == nil {
		return false
	}
	var d *DialError
	return errors.As(err, &d)
}

// ReplyOf returns the text of err's Redis error reply, and whether it has
// one.
func ReplyOf(err error) (string, bool) {
	if err == nil { // (before rerr, which escapes: a nil error costs nothing)
		return "", false
	}
	var rerr *backend.ReplyError
	if !errors.As(err, &rerr) {
		return "", false
	}
	return rerr.Reply, true
}
