package fault

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
)

// ErrPoolTimeout is what a client's error also matches when its connection
// pool had no connection free in time (see Slow).
var ErrPoolTimeout = errors.New("fairlock: no connection free in time")

// Slow reports whether err says Redis or the connection pool answered too
// slowly, rather than that Redis could not be reached.
func Slow(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrPoolTimeout) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// Unsupported reports whether err says the client or the server lacks the
// command sent.
func Unsupported(err error) bool {
	if errors.Is(err, errors.ErrUnsupported) {
		return true
	}
	msg, ok := ReplyOf(err)
	return ok && strings.Contains(strings.ToLower(msg), "unknown command")
}

// WrongType reports whether err is Redis's refusal of a command on a key
// that holds another type.
func WrongType(err error) bool {
	msg, ok := ReplyOf(err)
	return ok && strings.HasPrefix(msg, "WRONGTYPE")
}

// The prefixes of the errors the scripts reply with for a reason they name.
const (
	ForeignErrPrefix = "FAIRLOCK_FOREIGN_KEY "
	LayoutErrPrefix  = "FAIRLOCK_LAYOUT "
)

// ScriptError returns err as fairlock's error when a script refused the
// call for a reason it names (a key of another program's, keys of
// another release's layout), wherever err came from, and err itself
// otherwise. Errors met in the background (a waiter's refresh, a lease's
// renewal) pass through it, so that the caller who finally sees them can
// match them as a direct call's.
func ScriptError(err error) error {
	msg, ok := ReplyOf(err)
	if !ok {
		return err
	}
	if rest, ok := strings.CutPrefix(msg, ForeignErrPrefix); ok {
		return foreignKey(rest)
	}
	if rest, ok := strings.CutPrefix(msg, LayoutErrPrefix); ok {
		return incompatible(rest)
	}
	return err
}

// typeNames says what Redis's type names are, in messages.
var typeNames = map[string]string{
	"string": "a string", "list": "a list", "set": "a set", "zset": "a sorted set",
	"hash": "a hash", "stream": "a stream",
}

func typeName(t string) string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return "a " + t
}

// foreignKey reads a script's "FAIRLOCK_FOREIGN_KEY <found> <kept> <key>"
// (queue.lua's run_entry) as an error matching ErrForeignKey.
func foreignKey(rest string) error {
	found, rest, _ := strings.Cut(rest, " ")
	kept, key, _ := strings.Cut(rest, " ")
	return fmt.Errorf("%w: %q holds %s where fairlock keeps %s; nothing was changed (delete the key, or give fairlock a prefix of its own with WithPrefix)",
		ErrForeignKey, key, typeName(found), typeName(kept))
}

// incompatible reads a script's "FAIRLOCK_LAYOUT <found> <kept> <key>"
// (queue.lua's LAYOUT) as an error matching ErrIncompatible.
func incompatible(rest string) error {
	found, rest, _ := strings.Cut(rest, " ")
	kept, key, _ := strings.Cut(rest, " ")
	return fmt.Errorf("%w: %q is in key layout %s, and this release keeps layout %s; nothing was changed (one name needs one layout: finish the upgrade, or let the semaphore go idle until its keys expire)",
		ErrIncompatible, key, found, kept)
}
