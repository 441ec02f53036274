package fairlock

import (
	"errors"

	"github.com/redis/go-redis/v9"
)

// The go-redis side of the script call: what run turns a go-redis
// command's outcome into, so that the engine above it reads fairlock's
// own values and errors only (call.go's result, errorReply, errPoolTimeout).

// resultOf returns what cmd, a script call, came to, its error passed
// through fromClient.
func resultOf(cmd *redis.Cmd, err error) result {
	return result{val: cmd.Val(), err: fromClient(err)}
}

// fromClient returns err, from go-redis, as the engine reads it: a
// server's error reply as an *errorReply, go-redis's pool timeout as
// matching errPoolTimeout, and the rest (connection errors, a context's)
// as it is. The go-redis error stays in the chain, for a caller who
// matches it.
func fromClient(err error) error {
	var rerr redis.Error
	switch {
	case err == nil:
		return nil
	case errors.As(err, &rerr):
		return &errorReply{reply: rerr.Error(), err: err}
	case errors.Is(err, redis.ErrPoolTimeout):
		return &kindError{err: err, kind: errPoolTimeout}
	}
	return err
}

// An errorReply is the server's error reply to a call: a script's own
// (FAIRLOCK_...), or Redis refusing it (READONLY, MOVED, OOM...). Its text
// is the client's error's; reply is the server's words.
type errorReply struct {
	reply string
	err   error
}

func (e *errorReply) Error() string { return e.err.Error() }
func (e *errorReply) Unwrap() error { return e.err }

// errPoolTimeout is a client's connection pool that had no connection
// free in time.
var errPoolTimeout = errors.New("fairlock: no connection free in time")

// A kindError is a client's error that also matches kind.
type kindError struct{ err, kind error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.err, e.kind} }
