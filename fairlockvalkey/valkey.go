// Package fairlockvalkey runs fairlock on a valkey-go client: a single
// server, a Sentinel-managed one, or a Cluster.
//
//	rdb, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
//	...
//	c, err := fairlockvalkey.New(rdb)
//
// The Client behaves as one made by [fairlock.New] on a go-redis client.
// Its blocking reads run on valkey-go's pool of dedicated connections
// (ClientOption.BlockingPoolSize), and its other commands share valkey-go's
// pipelined connections. The Client never closes the valkey-go client.
package fairlockvalkey

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/valkey-io/valkey-go"
)

// New returns a fairlock Client that keeps its semaphores in Redis through
// rdb; see [fairlock.New] for opts and the errors. rdb stays the
// caller's to close, after the Client. [fairlock.WithReplicaAck] needs a
// client of a single server or of Sentinel; New refuses it on a Cluster.
func New(rdb valkey.Client, opts ...fairlock.Option) (*fairlock.Client, error) {
	if rdb == nil {
		return fairlock.NewWithBackend(nil, opts...)
	}
	return fairlock.NewWithBackend(Backend(rdb), opts...)
}

// Backend returns rdb as a [fairlock.Backend].
func Backend(rdb valkey.Client) fairlock.Backend { return backend{rdb} }

type backend struct{ rdb valkey.Client }

func (b backend) Info() fairlock.BackendInfo {
	if b.rdb.Mode() == valkey.ClientModeCluster {
		return fairlock.BackendInfo{Layout: fairlock.LayoutCluster, Functions: true}
	}
	return fairlock.BackendInfo{Layout: fairlock.LayoutSingle, Functions: true, Wait: true}
}

var commandNames = map[fairlock.ScriptCommand]string{fairlock.FCall: "FCALL", fairlock.EvalSHA: "EVALSHA", fairlock.Eval: "EVAL"}

// script builds s's command. valkey-go panics on a Cluster command whose
// keys span slots; fairlock never sends one (it checks a multi-semaphore
// request's slots first), and build reports it as Redis would.
func (b backend) script(s fairlock.Script) (cmd valkey.Completed, err error) {
	name, ok := commandNames[s.Command]
	if !ok {
		return cmd, fmt.Errorf("%w: script command %d", errors.ErrUnsupported, s.Command)
	}
	defer func() {
		if p := recover(); p != nil {
			err = &fairlock.ReplyError{Reply: fmt.Sprintf("CROSSSLOT Keys in request don't hash to the same slot (%v)", p)}
		}
	}()
	return b.rdb.B().Arbitrary(name, s.Name, strconv.Itoa(len(s.Keys))).Keys(s.Keys...).Args(s.Args...).Build(), nil
}

func (b backend) Script(ctx context.Context, s fairlock.Script) (any, error) {
	cmd, err := b.script(s)
	if err != nil {
		return nil, err
	}
	return value(b.rdb.Do(ctx, cmd))
}

func (b backend) ScriptWait(ctx context.Context, s fairlock.Script, replicas int, timeout time.Duration) (any, int64, error, error) {
	cmd, err := b.script(s)
	if err != nil {
		return nil, 0, err, err
	}
	// WAIT blocks, so valkey-go sends the pair on a dedicated connection.
	wait := b.rdb.B().Wait().Numreplicas(int64(replicas)).Timeout(timeout.Milliseconds()).Build()
	res := b.rdb.DoMulti(ctx, cmd, wait)
	v, err := value(res[0])
	acked, waitErr := res[1].AsInt64()
	return v, acked, err, fromClient(waitErr)
}

func (b backend) LoadLibrary(ctx context.Context, code string) error {
	if b.rdb.Mode() != valkey.ClientModeCluster {
		return loaded(b.rdb.Do(ctx, b.rdb.B().FunctionLoad().FunctionCode(code).Build()).Error())
	}
	// Every node valkey-go knows; a replica refuses the write (READONLY),
	// which leaves it to its primary.
	var errs []error
	for _, node := range b.rdb.Nodes() {
		err := loaded(node.Do(ctx, node.B().FunctionLoad().FunctionCode(code).Build()).Error())
		if msg, ok := reply(err); ok && strings.HasPrefix(msg, "READONLY") {
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// loaded returns FUNCTION LOAD's error, nil for a library already there.
func loaded(err error) error {
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return fromClient(err)
}

func (b backend) BlockingPop(ctx context.Context, timeout time.Duration, count int, keys []string) (string, []string, error) {
	if count > 0 {
		cmd := b.rdb.B().Blmpop().Timeout(timeout.Seconds()).Numkeys(int64(len(keys))).Key(keys...).Left().Count(int64(count)).Build()
		kv, err := b.rdb.Do(ctx, cmd).AsLMPop()
		if valkey.IsValkeyNil(err) {
			return "", nil, nil
		}
		return kv.Key, kv.Values, fromClient(err)
	}
	got, err := b.rdb.Do(ctx, b.rdb.B().Blpop().Key(keys...).Timeout(timeout.Seconds()).Build()).AsStrSlice()
	switch {
	case valkey.IsValkeyNil(err):
		return "", nil, nil
	case err != nil:
		return "", nil, fromClient(err)
	case len(got) != 2:
		return "", nil, fmt.Errorf("%w: BLPOP replied %q", fairlock.ErrRedis, got)
	}
	return got[0], got[1:], nil
}

func (b backend) Pop(ctx context.Context, key string, count int) ([]string, error) {
	got, err := b.rdb.Do(ctx, b.rdb.B().Lpop().Key(key).Count(int64(count)).Build()).AsStrSlice()
	if valkey.IsValkeyNil(err) {
		return nil, nil
	}
	return got, fromClient(err)
}

// Blocking returns b itself: valkey-go sends blocking commands on
// dedicated connections of its own.
func (b backend) Blocking() (fairlock.Backend, func() error, error) { return b, nil, nil }

// value returns a reply as fairlock reads it: nil, int64, string or []any.
func value(res valkey.ValkeyResult) (any, error) {
	msg, err := res.ToMessage()
	if err != nil {
		if valkey.IsValkeyNil(err) {
			return nil, nil
		}
		return nil, fromClient(err)
	}
	return plain(msg)
}

// plain converts one reply. A script's reply over RESP3 may hold a
// boolean (Lua true is 1 over RESP2, and false a nil), kept as RESP2 has
// it.
func plain(m valkey.ValkeyMessage) (any, error) {
	switch {
	case m.IsNil():
		return nil, nil
	case m.IsInt64():
		return m.AsInt64()
	case m.IsString():
		return m.ToString()
	case m.IsBool():
		if t, _ := m.AsBool(); t {
			return int64(1), nil
		}
		return nil, nil
	case m.IsArray():
		items, _ := m.ToArray()
		out := make([]any, len(items))
		for i, item := range items {
			v, err := plain(item)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	}
	if err := m.Error(); err != nil {
		return nil, fromClient(err)
	}
	return m.ToAny()
}

// fromClient returns err, from valkey-go, as fairlock reads it: a Redis
// error reply as a *fairlock.ReplyError with the server's words, the rest
// as it is.
func fromClient(err error) error {
	msg, ok := reply(err)
	if !ok {
		return err
	}
	return &fairlock.ReplyError{Reply: msg, Err: err}
}

// reply returns the server's words of err, a Redis error reply. valkey-go
// drops the "ERR " that begins a generic error; reply puts it back, so a
// reply reads as Redis sent it: an error code (an upper-case word:
// WRONGTYPE, MOVED, NOSCRIPT, FAIRLOCK_CAPACITY...) begins every other.
func reply(err error) (string, bool) {
	var rerr *valkey.ValkeyError
	if err == nil || !errors.As(err, &rerr) || rerr.IsNil() {
		return "", false
	}
	msg := rerr.Error()
	if code, _, _ := strings.Cut(msg, " "); code == "" || strings.ToUpper(code) != code || strings.ContainsAny(code, ":.") {
		msg = "ERR " + msg
	}
	return msg, true
}
