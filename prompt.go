package fairlock

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"weak"

	"github.com/fairlock/fairlock/internal/fault"
	"github.com/redis/go-redis/v9"
)

// Prompt errors for a Redis that cannot be reached.
//
// go-redis retries a connection it cannot open: five dials 100 ms apart,
// then the command up to three times more, each with as many dials: a
// command that waits for a connection to a Redis that refuses it learns so
// after seconds. fairlock adds a hook, once, to every go-redis client that
// dials for it: a *redis.Client (also a Sentinel failover client) and each
// node client of a *redis.ClusterClient. Client.run marks the context of
// each script call (watched). The hook's ProcessHook gives each marked
// command a context of its own that the hook may cancel, and lists it
// while it is in go-redis's hands; when a dial of that client is refused
// or its name does not resolve, the DialHook cancels the commands listed
// before the dial began, with the dial's error as cause.
//
// Cancelling is what picks the commands the refusal concerns: go-redis
// looks at a command's context only while the command waits (for a pool
// turn, for a dial, between its retries), never while it is sent or its
// answer read. A command already sent on a working connection is not
// touched and gets Redis's answer; one that waits for a connection ends at
// once. (go-redis dials on a goroutine of its own, under a context that
// carries none of the command's values, so the hook cannot tell which
// waiting command a dial was for: every command listed before the dial
// began and still waiting on that go-redis client ends, as it would a
// moment later at its own refusal. A command listed after it waits for a
// dial of its own.)
// The command ends with a refusal, an error go-redis does not retry (a
// Cluster client would try the node again, then others), which Client.run
// turns into a dialError.

// watchKey marks the context of a script call that the dial hooks watch.
type watchKey struct{}

// dials is what a Client needs to have its script calls watched: nothing
// on a *redis.Client, which New hooks; on a *redis.ClusterClient, the node
// clients already known to be hooked. New hooks the nodes a Cluster client
// makes from then on; nodes it made before are hooked as calls reach them
// (see mark).
type dials struct {
	cluster *redis.ClusterClient
	reached atomic.Bool // a call reached the Cluster: its slot map is loaded
	nodes   sync.Map    // *redis.Client → struct{}: node clients hooked
	known   atomic.Int32
}

// maxKnownNodes bounds the node clients a Client remembers as hooked; past
// it, it forgets them all (a Cluster that replaces its nodes again and
// again makes new node clients).
const maxKnownNodes = 1024

// watchDials hooks rdb's dials (once per go-redis client, whatever the
// number of Clients made on it) and returns what run needs to have its
// calls watched, or nil when rdb is another RedisClient (a wrapper of the
// caller's), whose dials fairlock does not see.
func watchDials(rdb RedisClient) *dials {
	switch r := rdb.(type) {
	case *redis.Client:
		watchClient(r)
		return &dials{}
	case *redis.ClusterClient:
		watchCluster(r)
		return &dials{cluster: r}
	}
	return nil
}

// mark returns ctx marked for the dial hooks, for a script call on keys.
// On a Cluster whose slot map is loaded, it first makes sure the node
// client serving keys is hooked: a node client made before New has no
// hook until then. (Before a call has reached the Cluster, mark does not
// ask: the slot map may not be loaded, and asking would load it.)
func (d *dials) mark(ctx context.Context, keys []string) context.Context {
	if d == nil {
		return ctx
	}
	ctx = context.WithValue(ctx, watchKey{}, watchKey{})
	if d.cluster != nil && len(keys) > 0 && d.reached.Load() {
		if node, err := d.cluster.MasterForKey(ctx, keys[0]); err == nil {
			if _, ok := d.nodes.Load(node); !ok {
				watchClient(node)
				if d.known.Add(1) > maxKnownNodes {
					d.nodes.Clear()
					d.known.Store(0)
				}
				d.nodes.Store(node, struct{}{})
			}
		}
	}
	return ctx
}

// settle returns the error a watched call's command ended with, the
// call's dialError in place of a refusal, and notes, on a Cluster, that a
// call reached it.
func (d *dials) settle(err error) error {
	if d == nil {
		return err
	}
	if err != nil {
		var r refusal // (a hook of the caller's may have wrapped it)
		if errors.As(err, &r) {
			return r.d
		}
	}
	if d.cluster != nil && !d.reached.Load() && answered(err) {
		d.reached.Store(true)
	}
	return err
}

// answered reports whether err, a command's, says Redis answered it.
func answered(err error) bool {
	if err == nil {
		return true
	}
	var rerr redis.Error // (declared after the nil check: it escapes)
	return errors.As(err, &rerr)
}

// The hooked go-redis clients, process-wide, by weak pointer: an entry
// goes when its client is collected.
var hooked = struct {
	mu       sync.Mutex
	clients  map[weak.Pointer[redis.Client]]struct{}
	clusters map[weak.Pointer[redis.ClusterClient]]*sync.Once
}{
	clients:  make(map[weak.Pointer[redis.Client]]struct{}),
	clusters: make(map[weak.Pointer[redis.ClusterClient]]*sync.Once),
}

// watchClient adds a dialWatch to rdb, unless it has one.
func watchClient(rdb *redis.Client) {
	wp := weak.Make(rdb)
	hooked.mu.Lock()
	defer hooked.mu.Unlock()
	if _, ok := hooked.clients[wp]; ok {
		return
	}
	hooked.clients[wp] = struct{}{}
	rdb.AddHook(&dialWatch{waiting: make(map[uint64]context.CancelCauseFunc)})
	runtime.AddCleanup(rdb, func(wp weak.Pointer[redis.Client]) {
		hooked.mu.Lock()
		delete(hooked.clients, wp)
		hooked.mu.Unlock()
	}, wp)
}

// watchCluster has every node client cc makes from now on hooked, unless
// that is arranged already.
func watchCluster(cc *redis.ClusterClient) {
	wp := weak.Make(cc)
	hooked.mu.Lock()
	once, ok := hooked.clusters[wp]
	if !ok {
		once = new(sync.Once)
		hooked.clusters[wp] = once
		runtime.AddCleanup(cc, func(wp weak.Pointer[redis.ClusterClient]) {
			hooked.mu.Lock()
			delete(hooked.clusters, wp)
			hooked.mu.Unlock()
		}, wp)
	}
	hooked.mu.Unlock()
	// go-redis calls the function under its node table's lock, and
	// watchClient takes hooked.mu: OnNewNode is called without it.
	once.Do(func() { cc.OnNewNode(watchClient) })
}

// dialWatch is the hook on one go-redis client that dials.
type dialWatch struct {
	mu      sync.Mutex
	last    uint64                             // the id of the latest command listed
	waiting map[uint64]context.CancelCauseFunc // the marked commands in go-redis's hands, by id
}

// unreachable reports whether a dial's error says Redis cannot be reached
// now: the connection was refused, or the name did not resolve. (A dial
// that times out may be a slow network; go-redis's own deadline covers it.)
func unreachable(err error) bool {
	var dns *net.DNSError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &dns) && !dns.IsTimeout)
}

func (w *dialWatch) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		// A dial serves a command that was listed before it began.
		w.mu.Lock()
		upTo := w.last
		w.mu.Unlock()
		conn, err := next(ctx, network, addr)
		if err != nil && unreachable(err) {
			w.refused(upTo, &fault.DialError{Err: err})
		}
		return conn, err
	}
}

// refused cancels the commands listed up to id upTo, with cause.
func (w *dialWatch) refused(upTo uint64, cause *fault.DialError) {
	var cut []context.CancelCauseFunc
	w.mu.Lock()
	for id, cancel := range w.waiting {
		if id <= upTo {
			cut = append(cut, cancel)
		}
	}
	w.mu.Unlock()
	for _, cancel := range cut {
		cancel(cause)
	}
}

func (w *dialWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Value(watchKey{}) == nil {
			return next(ctx, cmd)
		}
		return w.watch(ctx, func(ctx context.Context) error { return next(ctx, cmd) })
	}
}

func (w *dialWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Value(watchKey{}) == nil {
			return next(ctx, cmds)
		}
		err := w.watch(ctx, func(ctx context.Context) error { return next(ctx, cmds) })
		if r, ok := err.(refusal); ok {
			for _, cmd := range cmds {
				if e := cmd.Err(); e != nil && (errors.Is(e, context.Canceled) || unreachable(e)) {
					cmd.SetErr(r)
				}
			}
		}
		return err
	}
}

// watch runs do, a marked command, under a context of its own that a
// refused dial cancels while do runs, and returns do's error: a refusal if
// a refused dial cut it short, or if go-redis itself gave up on a
// connection it could not open (it stops dialing for a while after many
// refusals in a row, and fails commands at once, after its retries).
func (w *dialWatch) watch(ctx context.Context, do func(context.Context) error) error {
	cctx, cancel := context.WithCancelCause(ctx)
	w.mu.Lock()
	w.last++
	id := w.last
	w.waiting[id] = cancel
	w.mu.Unlock()

	err := do(cctx)

	w.mu.Lock()
	delete(w.waiting, id)
	w.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		if d, ok := context.Cause(cctx).(*fault.DialError); ok && errors.Is(err, context.Canceled) {
			err = refusal{d}
		} else if unreachable(err) {
			err = refusal{&fault.DialError{Err: err}}
		}
	}
	cancel(nil)
	return err
}

// refusal is how a watched command cut short by a refused dial ends in
// go-redis: an error it does not retry (not a net.Error, not a context's
// error), which Client.run turns into d.
type refusal struct{ d *fault.DialError }

func (r refusal) Error() string { return r.d.Error() }
