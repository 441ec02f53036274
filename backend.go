package fairlock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fairlock/fairlock/backend"
)

// replyOf returns the text of err's Redis error reply, and whether it has
// one.
func replyOf(err error) (string, bool) {
	if err == nil { // (before rerr, which escapes: a nil error costs nothing)
		return "", false
	}
	var rerr *backend.ReplyError
	if !errors.As(err, &rerr) {
		return "", false
	}
	return rerr.Reply, true
}

// unsupported reports whether err says the client or the server lacks the
// command sent.
func unsupported(err error) bool {
	if errors.Is(err, errors.ErrUnsupported) {
		return true
	}
	msg, ok := replyOf(err)
	return ok && strings.Contains(strings.ToLower(msg), "unknown command")
}

// NewWithBackend returns a Client that keeps its semaphores in Redis
// through b, as [New] does through a go-redis client; see New for the
// options and errors. The Client does not close b; it closes the Backend
// b.Blocking returned, if b made it, in [Client.Close].
// NewWithBackend fails with [ErrInvalidArgument] for a nil b and for
// [WithReplicaAck] when b cannot wait for replicas (backend.Info.Wait).
func NewWithBackend(b backend.Backend, opts ...Option) (*Client, error) {
	if b == nil || isNilPointer(b) {
		return nil, opError("new", nil, fmt.Errorf("%w: nil backend", ErrInvalidArgument))
	}
	return newClient(b, nil, opts)
}

// evalCode is a script sent by EVALSHA, then EVAL if the server lacks it.
type evalCode struct {
	src, sha string
}

func newEvalCode(src string) *evalCode { return &evalCode{src: src, sha: sha1Hex(src)} }

// run sends e through send on keys and args: EVALSHA, and EVAL when the
// server does not have the script yet.
func (e *evalCode) run(send func(backend.Script) result, keys, args []string) result {
	r := send(backend.Script{Command: backend.EvalSHA, Name: e.sha, Keys: keys, Args: args})
	if msg, ok := replyOf(r.err); ok && strings.HasPrefix(msg, "NOSCRIPT") {
		r = send(backend.Script{Command: backend.Eval, Name: e.src, Keys: keys, Args: args})
	}
	return r
}

// on runs e on b.
func (e *evalCode) on(ctx context.Context, b backend.Backend, keys []string, args ...string) result {
	return e.run(func(s backend.Script) result {
		v, err := b.Script(ctx, s)
		return result{v, err}
	}, keys, args)
}
