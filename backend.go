package fairlock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/fairlock/fairlock/backend"
)

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

// unsupported reports whether err says the client or the server lacks the
// command sent.
func unsupported(err error) bool {
	if errors.Is(err, errors.ErrUnsupported) {
		return true
	}
	msg, ok := ReplyOf(err)
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

// EvalCode is a script sent by EVALSHA, then EVAL if the server lacks it.
type EvalCode struct {
	src, sha string
}

func NewEvalCode(src string) *EvalCode { return &EvalCode{src: src, sha: SHA1Hex(src)} }

// Run sends e through send on keys and args: EVALSHA, and EVAL when the
// server does not have the script yet.
func (e *EvalCode) Run(send func(backend.Script) Result, keys, args []string) Result {
	r := send(backend.Script{Command: backend.EvalSHA, Name: e.sha, Keys: keys, Args: args})
	if msg, ok := ReplyOf(r.Err); ok && strings.HasPrefix(msg, "NOSCRIPT") {
		r = send(backend.Script{Command: backend.Eval, Name: e.src, Keys: keys, Args: args})
	}
	return r
}

// On runs e On b.
func (e *EvalCode) On(ctx context.Context, b backend.Backend, keys []string, args ...string) Result {
	return e.Run(func(s backend.Script) Result {
		v, err := b.Script(ctx, s)
		return Result{v, err}
	}, keys, args)
}
