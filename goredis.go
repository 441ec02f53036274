package fairlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// The go-redis v9 Backend: what New makes of the client it is given. With
// prompt.go (dial errors reported at once) and ring.go (a Ring refused),
// it is all of the engine that knows go-redis.

// RedisClient is the part of a go-redis v9 client that fairlock uses.
// *redis.Client (also as returned by redis.NewFailoverClient for Sentinel)
// and *redis.ClusterClient satisfy it. On those two, where Redis has
// functions (7.0 and later, Valkey), fairlock runs its scripts as a
// function library that it loads on each server (FUNCTION LOAD, on every
// Cluster master) the first time one lacks it; elsewhere, and on any other
// RedisClient, through the Scripter methods (EVALSHA, EVAL).
//
// A *redis.Ring satisfies it too, but [New] refuses it: a Ring moves a
// shard's keys to another shard when it thinks that shard is down, so two
// processes could hold one lock.
type RedisClient interface {
	redis.Scripter
	BLPop(ctx context.Context, timeout time.Duration, keys ...string) *redis.StringSliceCmd
}

var (
	_ RedisClient = (*redis.Client)(nil)
	_ RedisClient = (*redis.ClusterClient)(nil)
)

// New returns a Client that keeps its semaphores in rdb. It starts no
// goroutine, opens no connection and sends nothing to Redis until first
// used. Its first wait builds a second go-redis client from rdb's options
// for its blocking reads (see [Client] for the connections it uses); rdb
// itself stays the caller's to close, after the Client. New fails with
// [ErrInvalidArgument] for a nil rdb, an invalid option, or
// [WithReplicaAck] on a client other than a *redis.Client (a
// *redis.ClusterClient is refused).
//
// New refuses a go-redis Ring with [ErrInvalidArgument]. A Ring marks a
// shard down after a few failed heartbeats and sends its keys to another
// shard, so a client cut off from the shard that keeps a lock would be
// granted it on another shard while its holder keeps it on the first: two
// holders. Use a *redis.ClusterClient, a Sentinel failover client, or one
// *redis.Client per shard with the names you place on it yourself. New
// recognises a *redis.Ring and any type that shows Ring's own methods
// (Options returning *redis.RingOptions, or both SetAddrs and
// GetShardClientForKey), as a struct embedding a *redis.Ring does; a
// wrapper that hides a Ring behind other methods cannot be recognised, and
// is the caller's to avoid.
//
// New adds a hook, once per go-redis client however many Clients are made
// on it, to a *redis.Client (also a Sentinel failover client) or to each
// node client of a *redis.ClusterClient (a node it makes later at once; a
// node it made before New at the first call for a key that node serves
// after a call has reached the Cluster). The hook stays for the go-redis
// client's life and acts only on this package's commands. Through it a
// call whose command waits for a connection that Redis refuses, or whose
// host name does not resolve, returns an error matching [ErrRedis] at once,
// with or without a deadline on its context, rather than after go-redis's
// dial retries (seconds); a call whose command was already sent on a
// working connection is not affected. (Once go-redis has stopped dialing a
// server after many refusals in a row, it fails a command without a dial,
// after its own retries: tens of milliseconds.) Other RedisClients (a
// wrapper of the caller's) get no hook: their calls report such an error
// when go-redis gives up.
func New(rdb RedisClient, opts ...Option) (*Client, error) {
	if rdb == nil || isNilPointer(rdb) {
		return nil, opError("new", nil, fmt.Errorf("%w: nil redis client", ErrInvalidArgument))
	}
	if err := ringError(rdb); err != nil {
		return nil, opError("new", nil, err)
	}
	g := newGoRedis(rdb)
	c, err := newClient(g, rdb, opts)
	if err != nil {
		return nil, err
	}
	for _, h := range c.cfg.blockingHooks {
		g.hooks = append(g.hooks, h.(redis.Hook))
	}
	return c, nil
}

// The options tests reach through internal/testhook.
func init() {
	testhook.TransformOption = func(f func(string) string) any { return withTransform(f) }
	testhook.BlockingHooksOption = func(hooks ...redis.Hook) any { return withBlockingHooks(hooks...) }
	testhook.EntryName = script.EntryOf
	testhook.RunScript = func(ctx context.Context, client any, op string, keys, args []string) (any, error) {
		return client.(*Client).calls.RunRaw(ctx, op, keys, args)
	}
	testhook.Grants = func(client any) (reply, wake, refresh int64) {
		return client.(*Client).waits.Grants.Get()
	}
	testhook.GivenBack = func(client any) int64 {
		return client.(*Client).waits.Grants.Late.Load()
	}
	testhook.OpFlags = func(name string) ([]string, bool) {
		o := script.OpNamed(name)
		if o == nil {
			return nil, false
		}
		if f := script.Entries[o.EntryIndex].Flags; f != "" {
			return strings.Split(f, ","), true
		}
		return nil, true
	}
	testhook.Batches = func(client any) (batches, calls int64) {
		if b := client.(*Client).calls.Batch; b != nil {
			return b.Sent()
		}
		return 0, 0
	}
}

// withBlockingHooks adds hooks to the go-redis client New builds for the
// client's blocking reads (tests only; see internal/testhook).
func withBlockingHooks(hooks ...redis.Hook) Option {
	return func(c *config) {
		for _, h := range hooks {
			c.blockingHooks = append(c.blockingHooks, h)
		}
	}
}

// goRedis is a go-redis client as a Backend.
type goRedis struct {
	rdb   RedisClient
	dials *dials       // has rdb's dials watched (prompt.go); nil if fairlock cannot see them
	hooks []redis.Hook // for the client Blocking builds (withBlockingHooks)
}

var _ backend.Backend = (*goRedis)(nil)

// newGoRedis returns rdb as a Backend, its dials watched (see prompt.go).
func newGoRedis(rdb RedisClient) *goRedis {
	return &goRedis{rdb: rdb, dials: watchDials(rdb)}
}

// client returns the Redis client c sends its commands through: the
// go-redis client given to New, or the Backend given to NewWithBackend.
func (c *Client) client() any {
	if g, ok := c.b.(*goRedis); ok {
		return g.rdb
	}
	return c.b
}

// pubsuber is a go-redis client that can subscribe: *redis.Client and
// *redis.ClusterClient.
type pubsuber interface {
	Subscribe(ctx context.Context, channels ...string) *redis.PubSub
}

// canSubscribe reports whether c's Backend can subscribe to a channel.
func (c *Client) canSubscribe() bool {
	if g, ok := c.b.(*goRedis); ok {
		_, ok = g.rdb.(pubsuber)
		return ok
	}
	_, ok := c.b.(backend.Subscriber)
	return ok
}

func (g *goRedis) Subscribe(ctx context.Context, channel string) (backend.Subscription, error) {
	ps, ok := g.rdb.(pubsuber)
	if !ok {
		return nil, fmt.Errorf("%w: %T cannot subscribe", errors.ErrUnsupported, g.rdb)
	}
	switch g.rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
		// No channel yet: go-redis would connect now, whatever ctx says.
		// The first Receive subscribes.
		return &goRedisSub{ps: ps.Subscribe(ctx), channel: channel, closed: make(chan struct{})}, nil
	}
	// Another client (a wrapper) may need a channel at once (a Ring's
	// panics without one): it subscribes now.
	return &goRedisSub{ps: ps.Subscribe(ctx, channel), channel: channel, closed: make(chan struct{}), subscribed: true}, nil
}

// goRedisSub is a go-redis PubSub as a Subscription. go-redis reconnects
// and subscribes again by itself, and says so with a subscription message.
//
// go-redis connects (dials, and greets Redis) without heeding a context's
// cancellation, up to its dial timeout, and holds the PubSub's lock
// meanwhile. So each read runs on a goroutine of its own, which Receive
// leaves at its context's end or the close: the next Receive takes over
// what the read left (one read at a time, as go-redis needs), and the
// close closes the PubSub in the background.
type goRedisSub struct {
	ps      *redis.PubSub
	channel string
	closed  chan struct{}

	mu         sync.Mutex
	subscribed bool                // SUBSCRIBE was answered (go-redis keeps the channel)
	pending    chan goRedisReading // a read Receive left, or nil
	done       bool
}

type goRedisReading struct {
	msg any
	err error
}

func (s *goRedisSub) Receive(ctx context.Context, timeout time.Duration) (string, bool, bool, error) {
	for {
		read, err := s.read(ctx, timeout)
		if err != nil {
			return "", false, false, err
		}
		var r goRedisReading
		select {
		case r = <-read:
		case <-ctx.Done():
			s.leave(read)
			return "", false, false, ctx.Err()
		case <-s.closed:
			return "", false, false, errGoRedisSubClosed
		}
		if r.err != nil {
			if (errors.Is(r.err, context.Canceled) || errors.Is(r.err, context.DeadlineExceeded)) && ctx.Err() == nil {
				continue // a read an earlier Receive left, ended by its context
			}
			return "", false, false, r.err
		}
		switch m := r.msg.(type) {
		case *redis.Subscription:
			return "", m.Kind == "subscribe", m.Kind == "subscribe", nil
		case *redis.Message:
			return m.Payload, false, true, nil
		}
		return "", false, false, nil // silence, or a PING's answer
	}
}

// read returns the read an earlier Receive left, or starts one: it
// subscribes first if nothing has, then waits up to timeout for the next
// message, and pings Redis after silence.
func (s *goRedisSub) read(ctx context.Context, timeout time.Duration) (chan goRedisReading, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return nil, errGoRedisSubClosed
	}
	if read := s.pending; read != nil {
		s.pending = nil
		return read, nil
	}
	read := make(chan goRedisReading, 1)
	subscribe := !s.subscribed
	go func() {
		if subscribe {
			// Until it is answered: go-redis may reconnect, after a
			// SUBSCRIBE that failed, without the channel it adds after.
			if err := s.ps.Subscribe(ctx, s.channel); err != nil {
				read <- goRedisReading{err: err}
				return
			}
			s.mu.Lock()
			s.subscribed = true
			s.mu.Unlock()
		}
		msg, err := s.ps.ReceiveTimeout(ctx, timeout)
		var ne net.Error
		switch {
		case err != nil && ctx.Err() != nil:
			// Ended by its context (go-redis heeds a deadline, as a
			// read's own), which a later Receive's need not share.
			err = ctx.Err()
		case errors.As(err, &ne) && ne.Timeout():
			// Silence: a dead connection fails here or at the next read.
			_ = s.ps.Ping(ctx)
			msg, err = nil, nil
		}
		read <- goRedisReading{msg, err}
	}()
	return read, nil
}

// leave keeps read, a read Receive stopped waiting for, for the next.
func (s *goRedisSub) leave(read chan goRedisReading) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pending = read
}

func (s *goRedisSub) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.done = true
		close(s.closed)
		go func() { _ = s.ps.Close() }() // (waits for a read that is connecting)
	}
	return nil
}

// errGoRedisSubClosed is a closed subscription's error.
var errGoRedisSubClosed = errors.New("fairlock: subscription closed")

// pipeliner is what ScriptWait needs of a client besides RedisClient: a
// pipeline, whose commands share one connection, so that WAIT covers the
// script before it. *redis.Client (also Sentinel failover) has it.
type pipeliner interface {
	Pipeline() redis.Pipeliner
}

// fcaller is a go-redis client that can call a function.
type fcaller interface {
	FCall(ctx context.Context, function string, keys []string, args ...any) *redis.Cmd
}

func (g *goRedis) Info() backend.Info {
	switch g.rdb.(type) {
	case *redis.Client:
		// A Cluster pipeline spreads its commands over several
		// connections, so a WAIT in it would not follow the script's
		// writes: only a *redis.Client (single or Sentinel) waits.
		return backend.Info{Layout: backend.Single, Functions: true, Wait: true}
	case *redis.ClusterClient:
		return backend.Info{Layout: backend.Cluster, Functions: true}
	}
	return backend.Info{Layout: backend.Other}
}

// send sends s on on (the client, or a pipeline of it).
func (g *goRedis) send(ctx context.Context, on redis.Scripter, s backend.Script) *redis.Cmd {
	args := s.Boxed
	if !sameArgs(args, s.Args) {
		args = make([]any, len(s.Args))
		for i, a := range s.Args {
			args[i] = a
		}
	}
	switch s.Command {
	case backend.FCall:
		if f, ok := on.(fcaller); ok {
			return f.FCall(ctx, s.Name, s.Keys, args...)
		}
	case backend.EvalSHA:
		return on.EvalSha(ctx, s.Name, s.Keys, args...)
	case backend.Eval:
		return on.Eval(ctx, s.Name, s.Keys, args...)
	}
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(fmt.Errorf("%w: script command %d on %T", errors.ErrUnsupported, s.Command, on))
	return cmd
}

// sameArgs reports whether argv holds exactly args, boxed: then go-redis
// is given argv, and no argument is boxed again.
func sameArgs(argv []any, args []string) bool {
	if len(argv) != len(args) {
		return false
	}
	for i, a := range args {
		if s, ok := argv[i].(string); !ok || s != a {
			return false
		}
	}
	return true
}

// The dial hooks watch each script call (see prompt.go): if a dial it
// waits for is refused, or Redis's name does not resolve, it ends at once
// with a dialError.
func (g *goRedis) Script(ctx context.Context, s backend.Script) (any, error) {
	cmd := g.send(g.dials.mark(ctx, s.Keys), g.rdb, s)
	return cmd.Val(), g.named(fromClient(g.dials.settle(cmd.Err())))
}

// ackChannel is the channel ScriptWait publishes to before its WAIT.
const ackChannel = "fairlock:replica-ack"

func (g *goRedis) ScriptWait(ctx context.Context, s backend.Script, replicas int, timeout time.Duration) (any, int64, error, error) {
	p, ok := g.rdb.(pipeliner)
	if !ok {
		err := fmt.Errorf("%w: WAIT on %T", errors.ErrUnsupported, g.rdb)
		return nil, 0, err, err
	}
	ctx = g.dials.mark(ctx, s.Keys)
	pipe := p.Pipeline()
	cmd := g.send(ctx, pipe, s)
	// WAIT counts the replicas that have this connection's last write. A
	// script that wrote nothing (a resend that found its first run's
	// outcome, on another connection) would leave that at an older write,
	// and WAIT would cover none of the first run's; a PUBLISH (replicated,
	// on a channel nobody needs to hear, touching no key) is a write of
	// the connection's own that follows everything the master ran before.
	// A user that may not publish (ACL) gets NOPERM for it, ignored: its
	// WAIT covers the script's own writes only.
	_ = pipe.Process(ctx, redis.NewIntCmd(ctx, "publish", ackChannel, ""))
	wait := redis.NewIntCmd(ctx, "wait", replicas, timeout.Milliseconds())
	_ = pipe.Process(ctx, wait)
	_, _ = pipe.Exec(ctx)
	return cmd.Val(), wait.Val(), g.named(fromClient(g.dials.settle(cmd.Err()))), g.named(fromClient(wait.Err()))
}

func (g *goRedis) LoadLibrary(ctx context.Context, code string) error {
	one := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, code).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	switch r := g.rdb.(type) {
	case *redis.Client:
		return fromClient(one(ctx, r))
	case *redis.ClusterClient:
		return fromClient(r.ForEachMaster(ctx, one))
	}
	return fmt.Errorf("%w: FUNCTION LOAD on %T", errors.ErrUnsupported, g.rdb)
}

type blmpopper interface {
	BLMPop(ctx context.Context, timeout time.Duration, direction string, count int64, keys ...string) *redis.KeyValuesCmd
}

func (g *goRedis) BlockingPop(ctx context.Context, timeout time.Duration, count int, keys []string) (string, []string, error) {
	if count > 0 {
		mp, ok := g.rdb.(blmpopper)
		if !ok {
			return "", nil, fmt.Errorf("%w: BLMPOP on %T", errors.ErrUnsupported, g.rdb)
		}
		key, vals, err := mp.BLMPop(ctx, timeout, "left", int64(count), keys...).Result()
		if errors.Is(err, redis.Nil) {
			return "", nil, nil
		}
		return key, vals, fromClient(err)
	}
	res, err := g.rdb.BLPop(ctx, timeout, keys...).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", nil, nil
	case err != nil:
		return "", nil, fromClient(err)
	case len(res) != 2:
		return "", nil, fmt.Errorf("%w: BLPOP replied %q", ErrRedis, res)
	}
	return res[0], res[1:], nil
}

type lpopCounter interface {
	LPopCount(ctx context.Context, key string, count int) *redis.StringSliceCmd
}

func (g *goRedis) Pop(ctx context.Context, key string, count int) ([]string, error) {
	lp, ok := g.rdb.(lpopCounter)
	if !ok {
		return nil, fmt.Errorf("%w: LPOP with a count on %T", errors.ErrUnsupported, g.rdb)
	}
	got, err := lp.LPopCount(ctx, key, count).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return got, fromClient(err)
}

// readTimeout returns the ReadTimeout of the go-redis client, or 0 if it
// has none or fairlock cannot see its options (a wrapper of the caller's).
func (g *goRedis) readTimeout() time.Duration {
	switch r := g.rdb.(type) {
	case *redis.Client:
		return r.Options().ReadTimeout
	case *redis.ClusterClient:
		return r.Options().ReadTimeout
	}
	return 0
}

// listenPoolSize bounds the blocking client's connections per node. Each
// listener holds one while it blocks; the bound is far above what a
// process needs (one connection per 512 semaphores, per slot on Cluster).
const listenPoolSize = 4096

// Blocking builds, for a *redis.Client or *redis.ClusterClient, a second
// go-redis client of the same kind from rdb's options: its own pool (up
// to listenPoolSize connections per node, dialed as needed), none of the
// caller's hooks, and no maintenance notifications (a blocking read must
// not be moved or cut by them). Other RedisClients block on themselves.
func (g *goRedis) Blocking() (backend.Backend, func() error, error) {
	type blocking interface {
		RedisClient
		AddHook(redis.Hook)
		Close() error
	}
	var b blocking
	switch r := g.rdb.(type) {
	case *redis.Client:
		o := *r.Options()
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = listenPoolSize, 0, 0, 0
		o.MaintNotificationsConfig, o.PushNotificationProcessor = noMaint(), nil
		b = redis.NewClient(&o)
	case *redis.ClusterClient:
		o := *r.Options()
		o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = listenPoolSize, 0, 0, 0
		o.MaintNotificationsConfig, o.PushNotificationProcessor = noMaint(), nil
		b = redis.NewClusterClient(&o)
	default:
		return g, nil, nil
	}
	for _, h := range g.hooks {
		b.AddHook(h)
	}
	return &goRedis{rdb: b}, b.Close, nil
}

// noMaint turns off go-redis's maintenance notifications (RESP3 push
// messages that hand a connection over during a server's upgrade).
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// fromClient returns err, from go-redis, as the engine reads it: a
// server's error reply as a *ReplyError, go-redis's pool timeout as
// matching fault.ErrPoolTimeout, and the rest (connection errors, a context's)
// as it is. The go-redis error stays in the chain, for a caller who
// matches it.
func fromClient(err error) error {
	if err == nil { // (before rerr, which escapes)
		return nil
	}
	var rerr redis.Error
	switch {
	case errors.As(err, &rerr):
		return &backend.ReplyError{Reply: rerr.Error(), Err: err}
	case errors.Is(err, redis.ErrPoolTimeout):
		return &kindError{err: err, kind: fault.ErrPoolTimeout}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && !errors.Is(err, context.DeadlineExceeded) {
		return &noAnswerError{err: err}
	}
	return err
}

// noAnswerError is a command that Redis did not answer within the
// client's read or write timeout (the connection's deadline, not the
// caller's context): it names the server, where the connection or the
// client's options say which (see goRedis.named), and says what happened
// before go-redis's own words ("i/o timeout"). It matches what it wraps.
type noAnswerError struct {
	err  error
	addr string // the server, if the connection's error does not say
}

func (e *noAnswerError) Error() string {
	var op *net.OpError
	switch {
	case errors.As(e.err, &op) && op.Addr != nil:
		return fmt.Sprintf("Redis at %s did not answer in time: %v", op.Addr, e.err)
	case e.addr != "":
		return fmt.Sprintf("Redis at %s did not answer in time: %v", e.addr, e.err)
	}
	return fmt.Sprintf("Redis did not answer in time: %v", e.err)
}

// named gives a noAnswerError the address of the server, where the client
// has one (a *redis.Client on one server: not a Cluster's, whose nodes
// are many, nor a Sentinel failover client's, whose master changes).
func (g *goRedis) named(err error) error {
	if err == nil {
		return nil // no errors.As target to allocate on the common path
	}
	var na *noAnswerError
	if !errors.As(err, &na) || na.addr != "" {
		return err
	}
	if r, ok := g.rdb.(*redis.Client); ok {
		if o := r.Options(); o.Addr != "FailoverClient" {
			na.addr = o.Addr
		}
	}
	return err
}

func (e *noAnswerError) Unwrap() error { return e.err }

// A kindError is a client's error that also matches kind.
type kindError struct{ err, kind error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.err, e.kind} }
