package fairlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/renew"
	"github.com/fairlock/fairlock/internal/sched"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// MaxCapacity is the largest semaphore capacity. Scripts count permits in
// Lua numbers, which are exact integers only up to 2^53.
const MaxCapacity = 1 << 50

// Request asks for Permits of the semaphore Name, whose capacity is
// Capacity. Every user of one semaphore must give the same capacity while
// it is in use (see [ErrCapacityMismatch]).
type Request struct {
	Name     string
	Capacity int64
	Permits  int64

	// MaxHold caps how long the lease may hold these permits, as
	// [WithMaxHold] does for every lease of a client: at MaxHold from the
	// grant the lease ends with [ErrMaxHold]. 0 takes the client's cap
	// (none by default); a positive MaxHold replaces it, shorter or
	// longer. A lease over several semaphores ends at the earliest cap of
	// its parts. A negative MaxHold, or one over [MaxHoldLimit] (365
	// days), fails with [ErrInvalidArgument].
	MaxHold time.Duration

	// LeaseTTL is how long this lease lasts without renewal, in place of
	// the client's [WithLeaseTTL] for this request alone: the lease is
	// renewed every third of it while held, its [Lease.Expiry] and the
	// expiry [Client.Status] shows follow it, and it bounds how long the
	// permits stay taken once the holder's process dies or is cut off
	// (Redis frees them LeaseTTL after the last renewal). 0 takes the
	// client's TTL (10s by default). A lease over several semaphores
	// ([Client.AcquireAll]) is one lease renewed as one: it takes the
	// shortest TTL its parts give (a part's 0 counts as the client's).
	// A negative LeaseTTL, a TTL under 10ms or one over [MaxTTL] (24h)
	// fails with [ErrInvalidArgument] before anything is sent.
	LeaseTTL time.Duration
}

// Client grants fair, first-in first-out permits of semaphores stored in
// Redis. One Client stands for one process in the queues: its waiters on
// one semaphore share one liveness refresh, and its waiters on all
// semaphores share a few blocking reads.
//
// Connections: scripts (acquire, renew, release, refresh) run on the
// go-redis client given to [New], one short command at a time. Blocking
// reads (BLPOP on the wake lists where grants arrive) never do, so waiting
// on any number of semaphores cannot starve renewals or releases of that
// client's pool: they run on a second go-redis client of the same kind that
// the Client builds from the caller's options on its first wait and closes
// in [Client.Close]. One BLPOP covers up to 512 semaphores: on a single
// node or Sentinel a Client blocks on one connection per 512 semaphores it
// waits on; on Cluster on one per hash slot in which it waits (per 512).
// That client has its own pool (up to 4,096 connections per node, dialed
// as needed) and none of the caller's hooks. For a RedisClient other than
// *redis.Client and *redis.ClusterClient, blocking reads use the given
// client itself, one BLPOP per semaphore waited on, each holding one of its
// connections.
//
// A Client is safe for concurrent use. It holds no per-acquisition state;
// each grant is a [Lease].
type Client struct {
	b     backend.Backend // where the scripts run (through calls) and listeners block
	info  backend.Info    // b's
	cfg   config
	calls *callpath.Caller // the script call path
	plans plans            // the plans of single requests made so far
	renew *renew.Batcher   // batches the leases' renewals
	waits *wait.Waits      // where acquisitions wait for their grants
	id    string           // identifies this client's wake lists; unguessable
	// The lease and waiter TTLs as script arguments, rendered once.
	leaseMs, waiterMs string
	// The id and the TTLs as script arguments boxed (see opCall.argv).
	idArg, leaseArg, waiterArg any
	// closing ends at Close (closeAll ends it): the context of the
	// blocking reads; done is its Done channel.
	closing  context.Context
	closeAll context.CancelFunc
	done     <-chan struct{}
	// renewing ends when a close ends the leases the client still holds
	// (at once for Close and Abandon; for Shutdown, once their holders
	// have released them or its context ended): the renewal batcher takes no
	// renewal after it.
	renewing  context.Context
	endRenews context.CancelFunc
	// closeEnds and renewEnds end the calls bounded by closing and by
	// renewing (see boundBy).
	closeEnds, renewEnds *callpath.Ends

	mu      sync.Mutex
	closed  bool
	shut    *shutdownState // the close that closed set; see close.go
	leases  map[*Lease]struct{}
	pumping map[string]bool // keyspace.Keys.Base of semaphores a background pump serves

	wg workGroup // goroutines the client starts (renewal timers are
	// stopped through each lease instead)
	sched sched.Scheduler // runs the leases' renewals

	// Guarded by mu: tasks of spawn's and acquisitions under way (see
	// hold) that have not ended, and the signal that either count fell to
	// zero.
	tasks     int
	acquiring int
	// answerWait is how long past its bound a close waits for calls
	// already sent (see answerWait).
	answerWait time.Duration
	tasksDone  *sync.Cond
	idle       chan func()  // spawn's workers waiting for a task take it here
	workers    atomic.Int32 // spawn's workers: running a task or waiting for one
}

// workGroup is a sync.WaitGroup that also counts its goroutines, so that a
// close can tell a client with no background work at all.
type workGroup struct {
	wg sync.WaitGroup
	n  atomic.Int64
}

func (g *workGroup) Add(d int) { g.n.Add(int64(d)); g.wg.Add(d) }
func (g *workGroup) Done()     { g.n.Add(-1); g.wg.Done() }
func (g *workGroup) Wait()     { g.wg.Wait() }

// idle reports whether no goroutine of the group is running.
func (g *workGroup) idle() bool { return g.n.Load() == 0 }

// hold counts an acquisition (Acquire and its kin, a condition's wait) as
// work a close waits for, from before its ticket can be queued until it
// returns: a blocked acquisition that a close wakes has left its queue (or
// handed its withdrawal to a goroutine the close waits for) before the
// close returns. It reports false, counting nothing, once the client is
// closed; otherwise the caller calls unhold when it returns.
func (c *Client) hold() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.acquiring++
	return true
}

// unhold ends what hold began.
func (c *Client) unhold() {
	c.mu.Lock()
	if c.acquiring--; c.acquiring == 0 {
		c.tasksDone.Broadcast()
	}
	c.mu.Unlock()
}

// spawn runs f on a goroutine that Close waits for. Unlike wg, it may be
// used after Close (by Release, or by an acquisition that raced Close);
// such a goroutine is bounded like every other (see letGo) but Close,
// having returned, no longer waits for it.
//
// The goroutine is a worker parked after an earlier task, if one is, or a
// new one: a call bounded by its context runs its script on such a
// goroutine (see caller.call), so a busy client would otherwise start a
// goroutine per call, and grow its stack to go-redis's depth each time.
func (c *Client) spawn(f func()) {
	c.mu.Lock()
	c.tasks++
	c.mu.Unlock()
	select {
	case c.idle <- f:
	default:
		go c.work(f)
	}
}

// workerIdle is how long a worker that ran a task of spawn's waits for the
// next before it ends (a variable for tests).
var workerIdle atomic.Int64 // a time.Duration; atomic: a test sets it while other clients' workers may read it

func init() { workerIdle.Store(int64(time.Second)) }

// work runs f, then the tasks spawn hands it while it waits, until none
// comes for workerIdle or the client closes.
func (c *Client) work(f func()) {
	c.workers.Add(1)
	defer c.workers.Add(-1)
	var idle *time.Timer
	for {
		c.runTask(f)
		if idle == nil {
			idle = time.NewTimer(time.Duration(workerIdle.Load()))
			defer idle.Stop()
		} else {
			idle.Reset(time.Duration(workerIdle.Load()))
		}
		select {
		case f = <-c.idle:
		case <-idle.C:
			return
		case <-c.done:
			return
		}
	}
}

// runTask runs f, a task of spawn's, and counts it done.
func (c *Client) runTask(f func()) {
	defer func() {
		c.mu.Lock()
		if c.tasks--; c.tasks == 0 {
			c.tasksDone.Broadcast()
		}
		c.mu.Unlock()
	}()
	f()
}

// newClient returns a Client on b. rdb is the go-redis client b wraps,
// or nil: it names the client in WithReplicaAck's refusal.
func newClient(b backend.Backend, rdb RedisClient, opts []Option) (*Client, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, opError("new", nil, err)
	}
	info := b.Info()
	if cfg.ackReplicas > 0 && !info.Wait {
		if rdb != nil {
			return nil, opError("new", nil, fmt.Errorf("%w: WithReplicaAck needs a *redis.Client (single node or Sentinel failover), not %T", ErrInvalidArgument, rdb))
		}
		return nil, opError("new", nil, fmt.Errorf("%w: WithReplicaAck needs a backend that can send WAIT after a script on one connection; %T cannot", ErrInvalidArgument, b))
	}
	id := rand.Text()
	if cfg.owner != "" {
		id = cfg.owner + "/" + id
	}
	if info.Layout == backend.Single {
		// One wake list for all the client's waiters (keyspace.Keys.Wake).
		id = keyspace.ProcessListMark(cfg.prefix) + id
	}
	c := &Client{
		b:        b,
		info:     info,
		cfg:      cfg,
		id:       id,
		leaseMs:  ops.MsArg(cfg.leaseTTL),
		waiterMs: ops.MsArg(cfg.waiterTTL),
		leases:   make(map[*Lease]struct{}),
		pumping:  make(map[string]bool),
	}
	c.calls = &callpath.Caller{B: b, Info: info, Scripts: script.NewSet(cfg.transform, cfg.transformKey),
		AckReplicas: cfg.ackReplicas, AckTimeout: cfg.ackTimeout, Spawn: c.spawn}
	c.closing, c.closeAll = context.WithCancel(context.Background())
	if cfg.batch > 1 && info.Layout != backend.Other {
		c.calls.Batch = callpath.NewBatcher(c.calls, cfg.batch, c.closing)
	}
	c.done = c.closing.Done()
	c.renewing, c.endRenews = context.WithCancel(context.Background())
	c.closeEnds, c.renewEnds = callpath.NewEnds(c.closing), callpath.NewEnds(c.renewing)
	c.waits = &wait.Waits{Mu: &c.mu, Wg: &c.wg, Closing: c.closing, Done: c.done, Calls: c.calls, B: b, Info: info,
		WaiterTTL: cfg.waiterTTL, Prefix: cfg.prefix, ID: id, LeaseMs: c.leaseMs, WaiterMs: c.waiterMs, Logf: c.logf,
		Rooms: make(map[string]*wait.Room), Tickets: make(map[string]*wait.Room), Listeners: make(map[string][]*wait.Listener)}
	c.renew = renew.New(c.calls, c.renewing, id, cfg.leaseTTL, c.pump)
	c.tasksDone = sync.NewCond(&c.mu)
	c.answerWait = answerWait(b, info)
	c.idle = make(chan func())
	c.idArg, c.leaseArg, c.waiterArg = c.id, c.leaseMs, c.waiterMs
	return c, nil
}

func isNilPointer(v any) bool {
	rv := reflect.ValueOf(v)
	return rv.Kind() == reflect.Pointer && rv.IsNil()
}

// Close closes the client now: it releases the leases the client holds at
// once, so that the next waiters are granted at once rather than when the
// leases' TTL runs out, and returns within a bound. Its blocked Acquire
// calls (and condition waits) return [ErrClosed] after leaving their
// queues, and later calls fail with ErrClosed.
//
// Close does not wait for the code holding the leases: it takes no context
// and must return within its bound whatever that code does, as io.Closer
// callers (a deferred Close) expect. Call it once the work under the
// leases is over (cancel the workers and wait for them, as you would
// finish writing before closing a file), or when the work must end now;
// to let running work finish first, within a time limit, call
// [Client.Shutdown], which waits for the holders' own releases. Each lease
// still held ends first, its Done channel closing (and its LeaseContexts
// ending) with a cause matching ErrClosed, then its release is sent. Work
// that keeps running should watch Done or a [LeaseContext]: it may
// overlap the next holder's, which the fencing token guards against. A
// [Lease.Release] after Close returns an error matching ErrClosed; one that
// raced Close releases the lease once, whichever came first. Leases are
// released in parallel (a few at a time), each sent again after an error
// that passes, as [Lease.Release] does, until it lands, for at most one
// waiter TTL ([WithWaiterTTL]) from Close.
//
// Close returns nil once every lease is released (a lease already lost or
// expired counts), every blocked Acquire has left its queue, and every
// goroutine the client started has ended: the clean-up that calls whose
// context ended left running (withdrawing a ticket, finishing a release)
// and the releases and withdrawals being sent again after an error that
// passes (see [Lease.Release]). Every deadline of that work is counted
// from the Close call: one waiter TTL, plus, through go-redis, its
// ReadTimeout for a command already sent (or a new connection's
// handshake) to a Redis that does not answer, which go-redis bounds by
// that timeout rather than by the context. So Close returns within one
// waiter TTL plus the ReadTimeout of its call, Redis up, down or stalled
// (through rueidis and valkey-go, which honour deadlines, within one
// waiter TTL and a second: those clients end a blocking read only at its
// deadline, and the listener's, a one-second BLMPOP, has its deadline one
// waiter TTL past its timeout, so that a read begun just before Close on
// a Redis that stopped answering ends up to a waiter TTL and a second
// after it). A withdrawal that Redis refuses a connection
// for ends at once (see [New]) and is not sent again (the ticket ends at
// its deadline). If some leases could not be released in that time (Redis
// down), Close returns an error matching [ErrRedis] that says how many;
// Redis ends them when their TTL runs out. So it does if some of the
// blocked Acquire calls (and condition waits) it ended could not leave
// their queues in that time, or a grant that raced it could not be given
// back (Redis down, refusing the connection, or failing the script): the
// error says how many of how many, and the last failure; Redis drops
// their tickets at their deadlines (a waiter's within the waiter TTL),
// and each of those calls still returns ErrClosed. So it does if a
// release or withdrawal being sent again in the background (after an
// error that passes, see [Lease.Release]) had not landed by its bound:
// Close cuts it short there and counts it. With [WithReplicaAck], a
// release the master ran but its replicas did not acknowledge is not sent
// again; Close's error counts those too, and matches [ErrNotReplicated].
//
// Every call of the client's on its way to Redis when Close begins ends
// at the close: an Acquire's or a condition wait's script call, a
// Release's, a signal's (and a renewal, which the close stops). The call
// returns an error matching
// ErrClosed (a Release's lease counts as released, and its release goes
// on in the background within the bound, counted as above if it does not
// land), unless its context ends within one waiter TTL anyway (it returns
// by then), or it runs through go-redis under a context that cannot end
// (go-redis bounds each try by its ReadTimeout, which Close waits for
// past its bound, as for a command already sent). Through rueidis and
// valkey-go, which return by their context's end, nothing else bounds a
// call to a Redis that does not answer, so every call ends at the close,
// whatever its context. Close stops waiting at its bound whatever the
// Redis client does (a go-redis Cluster client tries a command up to four
// times, each try waiting out the ReadTimeout; where fairlock cannot see
// the client's ReadTimeout, or it has none, it counts 5 s): a call still
// unanswered then (an Acquire, a condition wait, a Release or a release
// of Close's own) goes on in the background until the Redis client gives
// it up, and Close returns an error matching ErrRedis that says what it
// left. The ticket an acquisition's script may have queued is withdrawn
// once its call returns, within the bound (past it, the ticket ends at its
// deadline). [Client.Abandon] closes without releasing, for leases that
// must outlive the process. Close, Shutdown and Abandon may be called many
// times and concurrently (see Shutdown); a Close during a Shutdown ends
// that Shutdown's wait for the holders.
//
// Close closes the go-redis client it built for its blocking reads, which
// ends them at once; on another RedisClient it pushes an empty entry to
// each blocked read's control list instead, all at once, each bounded by
// one second from Close (if Redis cannot be reached, such a read ends at
// its one-second timeout). It never closes the client given to [New]; the
// hook New added stays on it.
func (c *Client) Close() error {
	return c.shutdown(context.Background(), closeNow)
}

// Acquire waits in first-in first-out order for req.Permits permits of the
// semaphore req.Name and returns the lease that holds them. When ctx ends
// first, Acquire returns within 60 ms (it waits up to 30 ms for an answer
// already on its way, then as long again for its withdrawal), whatever state Redis
// is in (unreachable, stalled, restarting), with an error for which
// errors.Is(err, ctx.Err()) holds; leaving the queue (handing on a grant
// that raced the cancellation) goes on in the background for up to one
// waiter TTL (see [Client.Close]). A Redis that cannot be reached is
// reported with an error matching [ErrRedis]: at once when it refuses the
// connection or its name does not resolve (see [New]), otherwise when
// go-redis gives up on it. A request that can never be granted
// (permits above the capacity) fails at once with [ErrInvalidArgument].
//
// Most programs use the semaphore package instead.
//
// Under a context that owns a live lease ([LeaseContext]) holding permits
// of req's semaphore, a request for more than its capacity minus those
// permits fails at once with [ErrDeadlock] (it could be granted only once
// that lease ends), and nothing is sent to Redis.
func (c *Client) Acquire(ctx context.Context, req Request) (*Lease, error) {
	return c.acquire(ctx, []Request{req}, true)
}

// TryAcquire takes req.Permits permits if they are free now and nobody is
// queued for the semaphore, and otherwise returns an error matching
// [ErrNotAcquired]. It never queues, so it never barges either.
func (c *Client) TryAcquire(ctx context.Context, req Request) (*Lease, error) {
	return c.acquire(ctx, []Request{req}, false)
}

// AcquireAll waits for all of reqs at once (at most [MaxResources]
// semaphores, each named once) and returns one lease over all of them. The
// request joins every semaphore's queue in one atomic step and is granted
// only when it heads every queue and fits in every semaphore at once; it
// never holds some while it waits for the rest. Since all queues order
// requests the same way, by arrival, nothing ever waits in a cycle:
// AcquireAll cannot deadlock with other AcquireAll or Acquire calls, and
// shares each semaphore's first-in first-out order with them.
//
// On Redis Cluster the semaphores of one request must share a hash slot:
// give their names one hash tag ("{acct}:1", "{acct}:2"); otherwise
// AcquireAll fails with [ErrCrossSlot] before anything is sent. A wrapper
// around a ClusterClient is not recognised, and gets no such check (a
// CROSSSLOT reply from Redis maps to ErrCrossSlot too). Context and
// errors are as for [Client.Acquire]. Package multilock offers the same
// call.
func (c *Client) AcquireAll(ctx context.Context, reqs ...Request) (*Lease, error) {
	return c.acquire(ctx, reqs, true)
}

// TryAcquireAll takes all of reqs at once if they are free now and nobody
// is queued for any of them, and otherwise returns an error matching
// [ErrNotAcquired] and takes nothing.
func (c *Client) TryAcquireAll(ctx context.Context, reqs ...Request) (*Lease, error) {
	return c.acquire(ctx, reqs, false)
}

// check validates a request and returns its semaphore's keys.
func (c *Client) check(req Request) (keyspace.Keys, error) {
	k, err := c.keys(req.Name)
	switch {
	case err != nil:
		return k, err
	case req.Capacity <= 0 || req.Capacity > MaxCapacity:
		return k, fmt.Errorf("%w: capacity %d of %q is not in [1, %d]", ErrInvalidArgument, req.Capacity, req.Name, int64(MaxCapacity))
	case req.Permits <= 0:
		return k, fmt.Errorf("%w: %d permits of %q", ErrInvalidArgument, req.Permits, req.Name)
	case req.Permits > req.Capacity:
		return k, fmt.Errorf("%w: %d permits of %q exceed its capacity %d", ErrInvalidArgument, req.Permits, req.Name, req.Capacity)
	case req.MaxHold < 0:
		return k, fmt.Errorf("%w: Request.MaxHold %v of %q is negative", ErrInvalidArgument, req.MaxHold, req.Name)
	case req.MaxHold > MaxHoldLimit:
		return k, fmt.Errorf("%w: Request.MaxHold %v of %q is longer than the largest accepted, %v", ErrInvalidArgument, req.MaxHold, req.Name, MaxHoldLimit)
	case req.LeaseTTL != 0:
		if err := checkLeaseTTL(fmt.Sprintf("Request.LeaseTTL of %q", req.Name), req.LeaseTTL); err != nil {
			return k, err
		}
	}
	return k, nil
}

// validate reports whether req is a request c can serve: a valid name, a
// capacity in [1, MaxCapacity], permits in [1, capacity], a MaxHold
// in [0, MaxHoldLimit] and a LeaseTTL of 0 or one checkLeaseTTL accepts.
// It contacts no server.
func (c *Client) validate(req Request) error {
	_, err := c.check(req)
	return err
}

// isClosed reports whether Close has begun.
func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// keys returns the keys of the semaphore name under the client's prefix
// (see keyspace.For).
func (c *Client) keys(name string) (keyspace.Keys, error) { return keyspace.For(c.cfg.prefix, name) }

// observe reports an event, if the client has an observer.
func (c *Client) observe(e Event) {
	if c.cfg.observer != nil {
		c.cfg.observer.Observe(e)
	}
}

// observeFor is observe for an event of plan p's semaphores, with their
// permits, which it builds only for an observer (a slice a call).
func (c *Client) observeFor(p plan, e Event) {
	if c.cfg.observer != nil {
		e.Permits = p.permits()
		c.cfg.observer.Observe(e)
	}
}

// logf logs msg at level with the semaphore names, the client's owner label
// and, if not "", the ticket's token, when the client has a logger.
func (c *Client) logf(level slog.Level, msg string, names []string, token string, attrs ...slog.Attr) {
	l := c.cfg.logger
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	if names != nil {
		attrs = append(attrs, slog.Any("semaphores", names))
	}
	if c.cfg.owner != "" {
		attrs = append(attrs, slog.String("owner", c.cfg.owner))
	}
	if token != "" {
		attrs = append(attrs, slog.String("token", token))
	}
	l.LogAttrs(context.Background(), level, msg, attrs...)
}

// subscribe returns a subscription to channel through c's Backend, or an
// error matching errors.ErrUnsupported when it cannot subscribe.
func (c *Client) subscribe(ctx context.Context, channel string) (backend.Subscription, error) {
	s, ok := c.b.(backend.Subscriber)
	if !ok || !c.canSubscribe() {
		return nil, fmt.Errorf("%w: %T cannot subscribe", errors.ErrUnsupported, c.client())
	}
	return s.Subscribe(ctx, channel)
}
