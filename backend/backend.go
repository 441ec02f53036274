// Package backend is the interface between fairlock and a Redis client:
// what an adapter implements so that fairlock runs its scripts and blocking
// reads through that client. [github.com/fairlock/fairlock.New] takes a go-redis client and
// builds its own; the modules fairlockrueidis and fairlockvalkey implement
// it for rueidis and valkey-go. Users of fairlock need none of this; an
// adapter author needs all of it, and passes the result to
// [github.com/fairlock/fairlock.NewWithBackend].
package backend

import (
	"context"
	"time"
)

// A Backend is a Redis client as fairlock uses it: the few commands the
// engine sends, with replies as plain Go values. [github.com/fairlock/fairlock.New] wraps a go-redis
// client in one; the modules fairlockrueidis and fairlockvalkey wrap
// rueidis and valkey-go clients. Another client needs only an
// implementation of these methods, passed to [github.com/fairlock/fairlock.NewWithBackend].
//
// Replies are nil (a nil bulk string or array), int64, string, or []any of
// those (a status reply is its text). A Redis error reply is returned as a
// *[ReplyError]; any other error (a connection's, a context's) as the
// client returned it, so that fairlock can tell a call that may have run
// from one that did not. Every method must honour ctx as its client does.
type Backend interface {
	// Info says what the client can do and how it places keys. It is read
	// once, by NewWithBackend.
	Info() Info

	// Script sends one script command (FCALL, EVALSHA or EVAL) and
	// returns its reply.
	Script(ctx context.Context, s Script) (any, error)

	// ScriptWait sends s and then WAIT replicas timeout on the same
	// connection, pipelined, and returns s's reply and error, then how
	// many replicas WAIT counted and WAIT's own error. It is called only
	// when Info().Wait is true.
	ScriptWait(ctx context.Context, s Script, replicas int, timeout time.Duration) (reply any, acked int64, err, waitErr error)

	// LoadLibrary sends FUNCTION LOAD code to every primary (to the one
	// server on a single node). A server that has the library already
	// ("already exists") counts as loaded. It is called only when
	// Info().Functions is true.
	LoadLibrary(ctx context.Context, code string) error

	// BlockingPop pops from the first of keys that holds elements,
	// waiting up to timeout for one to: BLMPOP timeout n keys LEFT COUNT
	// count, or BLPOP timeout keys when count is 0. It returns the key
	// and the elements popped, or an empty key and no error when the
	// timeout passed. A client or server that has no BLMPOP returns an
	// error matching [errors.ErrUnsupported] (or Redis's "unknown
	// command" reply) when count is above 0.
	BlockingPop(ctx context.Context, timeout time.Duration, count int, keys []string) (key string, vals []string, err error)

	// Pop pops up to count elements from the head of the list key
	// (LPOP key count); none when key does not exist. A client or server
	// that cannot returns an error matching errors.ErrUnsupported.
	Pop(ctx context.Context, key string, count int) ([]string, error)

	// Blocking returns the Backend on which the engine's blocking reads
	// (BlockingPop, and the Pop after it) run, and a function that closes
	// it, or nil when it is this Backend. A blocking read holds a
	// connection for up to a second; a client that multiplexes commands
	// on shared connections returns one that keeps its blocking reads
	// apart (a dedicated client, or its own dedicated connections).
	Blocking() (Backend, func() error, error)
}

// Info says what a [Backend] can do.
type Info struct {
	// Layout is how the client places keys on servers.
	Layout Layout

	// Functions reports that the client can load and call the engine's
	// function library (FUNCTION LOAD on every primary, FCALL): Redis 7.0
	// or later, or Valkey. When the server then refuses functions, the
	// engine falls back to EVALSHA and EVAL by itself.
	Functions bool

	// Wait reports that ScriptWait works: a script and a WAIT share one
	// connection. [WithReplicaAck] needs it.
	Wait bool

	// Deadlines reports that every method returns by its context's end,
	// whatever Redis and the network do (the client stops waiting for a
	// reply, a connection or a retry then): the engine then runs each call
	// on its caller's goroutine. Without it, a call whose context can end
	// runs on a goroutine of the engine's, so that the caller returns in
	// time whatever the client does. A client that returns by a context's
	// end only in part (say, not while it dials a connection) gets there
	// through [Within].
	Deadlines bool
}

// Layout is how a [Backend]'s client places keys on servers.
type Layout int

const (
	// Single is one server (also one chosen by Sentinel): any keys
	// may share a call, and one blocking read covers every wake list.
	Single Layout = iota

	// Cluster is Redis Cluster: keys live in hash slots, a call's
	// keys must share one slot, and a blocking read covers one slot.
	Cluster

	// Other is a client whose placement fairlock does not know: a
	// blocking read covers one wake list.
	Other
)

// Script is one script command for a [Backend] to send.
type Script struct {
	Command Command
	// Name is the function's name (FCALL), the script's SHA-1 in hex
	// (EVALSHA), or its source (EVAL).
	Name string
	Keys []string
	Args []string
	// Boxed, when not nil, is Args as []any, each element the string at
	// its index in Args, made once by fairlock: a client whose commands
	// take []any may send it rather than box Args again. A Backend may
	// ignore it; it must not change it.
	Boxed []any
}

// Command is the command that runs a [Script].
type Command int

const (
	FCall   Command = iota + 1 // FCALL Name numkeys keys... args...
	EvalSHA                    // EVALSHA Name numkeys keys... args...
	Eval                       // EVAL Name numkeys keys... args...
)

// A ReplyError is Redis's error reply to a command (a script's own error,
// or Redis refusing the command: READONLY, MOVED, OOM...), as a [Backend]
// returns it. Reply is the server's words; Err, if not nil, is the
// client's own error for it, which stays in the chain (errors.As finds
// it) and whose text Error returns.
type ReplyError struct {
	Reply string
	Err   error
}

func (e *ReplyError) Error() string {
	if e.Err != nil {
		return e.Err.Error()
	}
	return e.Reply
}

func (e *ReplyError) Unwrap() error { return e.Err }

// A Subscriber is a Backend that can subscribe to a pub/sub channel:
// package election's Observe needs one. The go-redis, rueidis and
// valkey-go Backends are Subscribers.
type Subscriber interface {
	// Subscribe returns a subscription to channel. It may subscribe at
	// its first Receive.
	Subscribe(ctx context.Context, channel string) (Subscription, error)
}

// A Subscription receives the messages of one pub/sub channel on a
// connection of its own.
type Subscription interface {
	// Receive waits up to timeout for the next event and returns it: a
	// message's payload, or subscribed true when the subscription was made
	// or made again (messages published while it was not were missed). It
	// returns ok false when the timeout passed with neither (having made
	// sure the connection still answers), and an error when the connection
	// failed: the next Receive subscribes again. A Receive blocked when
	// ctx ends returns at once.
	Receive(ctx context.Context, timeout time.Duration) (payload string, subscribed, ok bool, err error)
	// Close ends the subscription and any Receive blocked on it.
	Close() error
}

// Within returns call's result, or, if ctx ends first, ended(ctx.Err())
// at once, leaving call to finish on a goroutine of its own: a Backend
// whose client stops waiting for a reply when a context ends, but not for
// everything (valkey-go and rueidis wait for a connection that is being
// dialled, their own or another caller's, up to their dial timeout,
// whatever the context says), wraps its calls in Within so as to report
// [Info.Deadlines]. What call does after Within has returned is as for a
// call whose context ended with its command on the way: it may run on
// Redis all the same. Under a context that cannot end, call runs on the
// caller's goroutine.
func Within[T any](ctx context.Context, call func() T, ended func(error) T) T {
	if ctx.Done() == nil {
		return call()
	}
	if err := ctx.Err(); err != nil {
		return ended(err)
	}
	ch := make(chan T, 1)
	go func() { ch <- call() }()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
	}
	select {
	case v := <-ch: // came as ctx ended: the answer is better than none
		return v
	default:
		return ended(ctx.Err())
	}
}
