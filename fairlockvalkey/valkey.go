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
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/backend"
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

// Backend returns rdb as a [backend.Backend].
func Backend(rdb valkey.Client) backend.Backend { return adapter{rdb} }

type adapter struct{ rdb valkey.Client }

func (b adapter) Info() backend.Info {
	if b.rdb.Mode() == valkey.ClientModeCluster {
		return backend.Info{Layout: backend.Cluster, Functions: true, Deadlines: true}
	}
	return backend.Info{Layout: backend.Single, Functions: true, Wait: true, Deadlines: true}
}

var commandNames = map[backend.Command]string{backend.FCall: "FCALL", backend.EvalSHA: "EVALSHA", backend.Eval: "EVAL"}

// script builds s's command. valkey-go panics on a Cluster command whose
// keys span slots; fairlock never sends one (it checks a multi-semaphore
// request's slots first), and build reports it as Redis would.
func (b adapter) script(s backend.Script) (cmd valkey.Completed, err error) {
	name, ok := commandNames[s.Command]
	if !ok {
		return cmd, fmt.Errorf("%w: script command %d", errors.ErrUnsupported, s.Command)
	}
	defer func() {
		if p := recover(); p != nil {
			err = &backend.ReplyError{Reply: fmt.Sprintf("CROSSSLOT Keys in request don't hash to the same slot (%v)", p)}
		}
	}()
	return b.rdb.B().Arbitrary(name, s.Name, strconv.Itoa(len(s.Keys))).Keys(s.Keys...).Args(s.Args...).Build(), nil
}

// maxResends is how many times a script lost on its way (its connection
// closed under it) is sent again at once, as go-redis does by default
// (MaxRetries 3): valkey-go sends nothing twice by itself. The engine's
// scripts may run twice (a resent call finds what the first run did).
const maxResends = 3

func (b adapter) Script(ctx context.Context, s backend.Script) (any, error) {
	for attempt := 0; ; attempt++ {
		cmd, err := b.script(s) // valkey-go recycles a command once sent
		if err != nil {
			return nil, err
		}
		v, err := value(do(ctx, b.rdb, cmd))
		if attempt == maxResends || !lostOnTheWay(ctx, err) {
			return v, err
		}
	}
}

// lostOnTheWay reports whether err says the command's connection closed
// under it (the server restarted, killed the client, or a proxy cut it),
// or ended while ctx still runs: valkey-go dials once for every caller
// waiting for a connection, under the first one's context, so another
// caller's deadline can end a dial this command waited for. Sending it
// again may land.
func lostOnTheWay(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return false // ctx's own deadline, a moment before ctx says so
	}
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed) || errors.As(err, &ne) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

func (b adapter) ScriptWait(ctx context.Context, s backend.Script, replicas int, timeout time.Duration) (any, int64, error, error) {
	for attempt := 0; ; attempt++ {
		cmd, err := b.script(s)
		if err != nil {
			return nil, 0, err, err
		}
		// WAIT blocks, so valkey-go sends the pair on a dedicated connection.
		wait := b.rdb.B().Wait().Numreplicas(int64(replicas)).Timeout(timeout.Milliseconds()).Build()
		res := doMulti(ctx, b.rdb, cmd, wait)
		v, err := value(res[0])
		if attempt < maxResends && lostOnTheWay(ctx, err) {
			continue
		}
		waitErr := errOf(res[1])
		var acked int64
		if waitErr == nil {
			acked, waitErr = res[1].AsInt64()
		}
		return v, acked, err, waitErr
	}
}

func (b adapter) LoadLibrary(ctx context.Context, code string) error {
	if b.rdb.Mode() != valkey.ClientModeCluster {
		return loaded(errOf(do(ctx, b.rdb, b.rdb.B().FunctionLoad().FunctionCode(code).Build())))
	}
	// Every node valkey-go knows; a replica refuses the write (READONLY),
	// which leaves it to its primary.
	var errs []error
	for _, node := range b.rdb.Nodes() {
		err := loaded(errOf(do(ctx, node, node.B().FunctionLoad().FunctionCode(code).Build())))
		var rerr *backend.ReplyError
		if errors.As(err, &rerr) && strings.HasPrefix(rerr.Reply, "READONLY") {
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
	return err
}

func (b adapter) BlockingPop(ctx context.Context, timeout time.Duration, count int, keys []string) (string, []string, error) {
	if count > 0 {
		cmd := b.rdb.B().Blmpop().Timeout(timeout.Seconds()).Numkeys(int64(len(keys))).Key(keys...).Left().Count(int64(count)).Build()
		res := do(ctx, b.rdb, cmd)
		if err := errOf(res); err != nil {
			if valkey.IsValkeyNil(err) {
				return "", nil, nil
			}
			return "", nil, err
		}
		kv, err := res.AsLMPop()
		return kv.Key, kv.Values, err
	}
	res := do(ctx, b.rdb, b.rdb.B().Blpop().Key(keys...).Timeout(timeout.Seconds()).Build())
	if err := errOf(res); err != nil {
		if valkey.IsValkeyNil(err) {
			return "", nil, nil
		}
		return "", nil, err
	}
	got, err := res.AsStrSlice()
	switch {
	case err != nil:
		return "", nil, err
	case len(got) != 2:
		return "", nil, fmt.Errorf("%w: BLPOP replied %q", fairlock.ErrRedis, got)
	}
	return got[0], got[1:], nil
}

func (b adapter) Pop(ctx context.Context, key string, count int) ([]string, error) {
	res := do(ctx, b.rdb, b.rdb.B().Lpop().Key(key).Count(int64(count)).Build())
	if err := errOf(res); err != nil {
		if valkey.IsValkeyNil(err) {
			return nil, nil
		}
		return nil, err
	}
	return res.AsStrSlice()
}

// Blocking returns b itself: valkey-go sends blocking commands on
// dedicated connections of its own.
func (b adapter) Blocking() (backend.Backend, func() error, error) { return b, nil, nil }

// A doer sends commands: a client, a Cluster node's, a dedicated
// connection.
type doer interface {
	Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult
	DoMulti(ctx context.Context, cmds ...valkey.Completed) []valkey.ValkeyResult
}

// do sends cmd through d and returns its result by ctx's end: valkey-go
// stops waiting for a reply when ctx ends, but waits for a connection
// being dialled (the call's own, whose handshake it bounds by ctx's
// deadline only, up to its dial timeout; or another caller's, whatever
// ctx says), so the call is bounded here (see [backend.Within]).
func do(ctx context.Context, d doer, cmd valkey.Completed) valkey.ValkeyResult {
	return backend.Within(ctx, func() valkey.ValkeyResult { return d.Do(ctx, cmd) }, valkey.NewErrorResult)
}

// doMulti sends cmds through d together, bounded as do is.
func doMulti(ctx context.Context, d doer, cmds ...valkey.Completed) []valkey.ValkeyResult {
	return backend.Within(ctx, func() []valkey.ValkeyResult { return d.DoMulti(ctx, cmds...) }, func(err error) []valkey.ValkeyResult {
		res := make([]valkey.ValkeyResult, len(cmds))
		for i := range res {
			res[i] = valkey.NewErrorResult(err)
		}
		return res
	})
}

// value returns a reply as fairlock reads it: nil, int64, string or []any.
func value(res valkey.ValkeyResult) (any, error) {
	if err := errOf(res); err != nil {
		if valkey.IsValkeyNil(err) {
			return nil, nil
		}
		return nil, err
	}
	msg, _ := res.ToMessage()
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
		raw, _ := m.ToString()
		return nil, &backend.ReplyError{Reply: raw, Err: err}
	}
	return m.ToAny()
}

// errOf returns res's error as fairlock reads it: a Redis error reply as
// a *backend.ReplyError holding the reply as Redis sent it (valkey-go's
// own error drops a leading "ERR "), valkey.Nil for a nil reply, the
// rest (a connection's, a context's) as valkey-go returned it.
func errOf(res valkey.ValkeyResult) error {
	msg, err := res.ToMessage()
	if _, ok := valkey.IsValkeyErr(err); !ok {
		return err
	}
	raw, _ := msg.ToString()
	if raw == "" {
		raw = err.Error()
	}
	return &backend.ReplyError{Reply: raw, Err: err}
}

// Subscribe returns a subscription to channel on a dedicated connection
// of rdb's, made at the first Receive and made again after it fails.
func (b adapter) Subscribe(ctx context.Context, channel string) (backend.Subscription, error) {
	return &subscription{rdb: b.rdb, channel: channel, events: make(chan subEvent, subBuffer), closed: make(chan struct{})}, nil
}

// errSubClosed is a closed subscription's error.
var errSubClosed = errors.New("fairlock: subscription closed")

// subBuffer bounds the events a subscription holds for its reader. Past
// it, the messages are dropped and the reader is told to read the state
// afresh, as after a resubscription.
const subBuffer = 64

type subEvent struct {
	payload    string
	subscribed bool
}

type subscription struct {
	rdb     valkey.Client
	channel string
	events  chan subEvent
	closed  chan struct{}

	mu     sync.Mutex
	done   bool
	conn   valkey.DedicatedClient
	cancel func()       // gives conn back
	lost   <-chan error // closed when conn's hooks will not be called again
	missed atomic.Bool  // events were dropped since the reader last heard
}

func (s *subscription) push(e subEvent) {
	select {
	case s.events <- e:
	default:
		s.missed.Store(true)
	}
}

// connect subscribes on a dedicated connection; the subscription's
// confirmation arrives as an event. It returns by ctx's end, or the
// subscription's close, though the connection is being dialled then (valkey-go
// dials it with no context, up to its dial timeout): a connection that
// comes later is given back.
func (s *subscription) connect(ctx context.Context) (<-chan error, error) {
	s.mu.Lock()
	if s.done {
		s.mu.Unlock()
		return nil, errSubClosed
	}
	if s.conn != nil {
		lost := s.lost
		s.mu.Unlock()
		return lost, nil
	}
	s.mu.Unlock()
	type dedicated struct {
		conn   valkey.DedicatedClient
		cancel func()
	}
	got := make(chan dedicated, 1)
	go func() {
		conn, cancel := s.rdb.Dedicate()
		got <- dedicated{conn, cancel}
	}()
	var d dedicated
	select {
	case d = <-got:
	case <-ctx.Done():
		go func() { (<-got).cancel() }()
		return nil, ctx.Err()
	case <-s.closed:
		go func() { (<-got).cancel() }()
		return nil, errSubClosed
	}
	lost := d.conn.SetPubSubHooks(valkey.PubSubHooks{
		OnMessage: func(m valkey.PubSubMessage) {
			// (A connection given back while its SUBSCRIBE was on its
			// way may come back subscribed to another channel.)
			if m.Channel == s.channel {
				s.push(subEvent{payload: m.Message})
			}
		},
		OnSubscription: func(m valkey.PubSubSubscription) {
			if m.Kind == "subscribe" {
				s.push(subEvent{subscribed: true})
			}
		},
	})
	if err := errOf(do(ctx, d.conn, d.conn.B().Subscribe().Channel(s.channel).Build())); err != nil {
		go d.cancel()
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		go d.cancel()
		return nil, errSubClosed
	}
	if s.conn != nil { // another Receive's connection came first
		go d.cancel()
		return s.lost, nil
	}
	s.conn, s.cancel, s.lost = d.conn, d.cancel, lost
	return lost, nil
}

// drop gives back the connection that failed, so that the next Receive
// subscribes on another.
func (s *subscription) drop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cancel != nil {
		// Giving the connection back unsubscribes on it, with no context:
		// on a Redis that stopped answering, that waits.
		go s.cancel()
	}
	s.conn, s.cancel, s.lost = nil, nil, nil
}

func (s *subscription) Receive(ctx context.Context, timeout time.Duration) (string, bool, bool, error) {
	lost, err := s.connect(ctx)
	if err != nil {
		return "", false, false, err
	}
	if s.missed.Swap(false) {
		return "", true, true, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case e := <-s.events:
		return e.payload, e.subscribed, true, nil
	case err, ok := <-lost:
		s.drop()
		if !ok || err == nil {
			err = errors.New("fairlock: subscription's connection lost")
		}
		return "", false, false, err
	case <-t.C:
		// Silence: make sure the connection still answers.
		s.mu.Lock()
		conn := s.conn
		s.mu.Unlock()
		if conn != nil {
			if err := errOf(do(ctx, conn, conn.B().Ping().Build())); err != nil && ctx.Err() == nil {
				s.drop()
				return "", false, false, err
			}
		}
		return "", false, false, nil
	case <-ctx.Done():
		return "", false, false, ctx.Err()
	case <-s.closed:
		return "", false, false, errSubClosed
	}
}

func (s *subscription) Close() error {
	s.mu.Lock()
	if !s.done {
		s.done = true
		close(s.closed)
	}
	s.mu.Unlock()
	s.drop()
	return nil
}
