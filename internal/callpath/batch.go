package callpath

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyslot"
	"github.com/fairlock/fairlock/internal/script"
)

// A Batcher sends a client's concurrent calls of one entry to one server
// (or one Cluster slot) as one script call when they arrive together (see
// WithBatching): the first call of a group goes at once, alone; calls that
// come while it, or a batch, is on its way queue up, and when it returns
// they go together, on a goroutine of the client's, as one call of the
// entry's batch form (lua/batch.lua), which runs each as its own script
// would and answers each apart.
type Batcher struct {
	c   *Caller
	max int // calls per batch at most
	// cluster: calls group by the hash slot of their keys too.
	cluster bool
	// closing ends when the client's close begins: acquisitions still
	// queued then are answered ErrClosed without being sent, and a batch
	// of acquisitions on its way is given up (see send).
	closing context.Context

	mu     sync.Mutex
	groups map[batchKey]*batchGroup

	// sent counts the batches sent and the calls in them (tests read it).
	sent, sentCalls atomic.Int64
}

// batchKey names a group: the calls of one entry to one slot (0 on one
// server).
type batchKey struct {
	entry, slot int
}

// A batchGroup is the calls of one batchKey: whether one (or a batch) is
// on its way, and those that wait for it.
type batchGroup struct {
	busy  bool
	queue []*batchCall
}

// A batchCall is one call waiting in a group's queue.
type batchCall struct {
	ctx  context.Context
	oc   script.Call
	done chan script.Result // its result, once
	// taken: the call left the queue (sent in a batch, or withdrawn by
	// its caller); under the batcher's lock.
	taken bool
}

func NewBatcher(c *Caller, max int, closing context.Context) *Batcher {
	return &Batcher{c: c, max: max, cluster: c.Info.Layout == backend.Cluster, closing: closing, groups: map[batchKey]*batchGroup{}}
}

// batches reports whether oc, under ctx, may go in a batch. Through a
// Backend that returns by its context's end, a call whose caller's context
// cannot end (ctx, or oc.endless: ctx is then the caller's ended only by
// the close, see boundBy) is sent alone, on its caller's goroutine, as
// without batching: a batch holding it could stay out for good (a Redis
// that never answers), and with it its group, until the close. (Through
// go-redis, every call returns within its read timeout.)
func (b *Batcher) batches(ctx context.Context, oc script.Call) bool {
	return b != nil && script.Entries[oc.Op.EntryIndex].Batch && len(oc.Keys) > 0 && (ctx.Done() != nil && !oc.Endless || !b.c.Info.Deadlines)
}

// do runs oc, in a batch if others of its group are on their way, and
// returns its result. Through a Backend that returns by its context's end
// (backend.Info.Deadlines), so does do: a call still queued then is not
// sent; one already sent may run, as a call the Backend stopped waiting
// for may.
func (b *Batcher) do(ctx context.Context, oc script.Call) script.Result {
	k := batchKey{entry: oc.Op.EntryIndex}
	if b.cluster {
		k.slot = keyslot.Of(oc.Keys[0])
	}
	b.mu.Lock()
	g := b.groups[k]
	if g == nil {
		g = &batchGroup{}
		b.groups[k] = g
	}
	if !g.busy {
		g.busy = true
		b.mu.Unlock()
		r := b.c.Alone(ctx, b.c.Scripts.ForOp(oc.Op), oc.Keys, oc.Args, oc.Argv)
		b.next(k, g)
		return r
	}
	bc := &batchCall{ctx: ctx, oc: oc, done: make(chan script.Result, 1)}
	g.queue = append(g.queue, bc)
	b.mu.Unlock()
	if !b.c.Info.Deadlines || ctx.Done() == nil {
		return <-bc.done
	}
	select {
	case r := <-bc.done:
		return r
	case <-ctx.Done():
	}
	b.mu.Lock()
	queued := !bc.taken
	if queued {
		bc.taken = true
		for i, q := range g.queue {
			if q == bc {
				g.queue = append(g.queue[:i], g.queue[i+1:]...)
				break
			}
		}
	}
	b.mu.Unlock()
	if !queued {
		select {
		case r := <-bc.done: // it came as ctx ended
			return r
		default:
		}
	}
	return script.Result{Err: ctx.Err()}
}

// next is called when the call or batch on its way for g has returned:
// the calls that queued meanwhile go next, on a goroutine of the
// client's; with none, g is free.
func (b *Batcher) next(k batchKey, g *batchGroup) {
	b.mu.Lock()
	if len(g.queue) == 0 {
		g.busy = false
		delete(b.groups, k)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.c.Spawn(func() { b.drain(k, g) })
}

// drain sends g's queued calls, up to max at a time, until none is left.
func (b *Batcher) drain(k batchKey, g *batchGroup) {
	for {
		b.mu.Lock()
		n := min(len(g.queue), b.max)
		calls := make([]*batchCall, 0, n)
		closing := k.entry == script.OpAcquire.EntryIndex && b.closing.Err() != nil
		for _, bc := range g.queue[:n] {
			bc.taken = true
			if err := bc.ctx.Err(); err != nil {
				bc.done <- script.Result{Err: err} // its caller gave up: it is not sent
				continue
			}
			if closing {
				// The close ends every acquisition: one not sent yet
				// need not be.
				bc.done <- script.Result{Err: fmt.Errorf("%w: the acquisition was not sent", fault.ErrClosed)}
				continue
			}
			calls = append(calls, bc)
		}
		g.queue = append(g.queue[:0], g.queue[n:]...)
		b.mu.Unlock()
		if n == 0 {
			b.next(k, g)
			return
		}
		if len(calls) > 0 {
			b.send(calls)
		}
	}
}

// send runs calls, of one group, as one call of their entry's batch form
// (a single call as itself), under batchContext's context, and hands each
// its own result.
func (b *Batcher) send(calls []*batchCall) {
	var also context.Context // a batch of acquisitions ends at the close, too
	if calls[0].oc.Op.EntryIndex == script.OpAcquire.EntryIndex {
		also = b.closing
	}
	ctx, cancel := BatchContext(calls, also)
	defer cancel()
	if len(calls) == 1 {
		bc := calls[0]
		bc.done <- b.c.Alone(ctx, b.c.Scripts.ForOp(bc.oc.Op), bc.oc.Keys, bc.oc.Args, bc.oc.Argv)
		return
	}
	var nkeys, nargs int
	for _, bc := range calls {
		nkeys += len(bc.oc.Keys)
		nargs += len(bc.oc.Args)
	}
	keys := make([]string, 0, nkeys)
	args := make([]string, 1, 1+2*len(calls)+nargs)
	args[0] = strconv.Itoa(len(calls))
	for _, bc := range calls {
		keys = append(keys, bc.oc.Keys...)
		args = append(args, strconv.Itoa(len(bc.oc.Keys)), strconv.Itoa(len(bc.oc.Args)))
	}
	for _, bc := range calls {
		args = append(args, bc.oc.Args...)
	}
	b.sent.Add(1)
	b.sentCalls.Add(int64(len(calls)))
	c := b.c
	s := c.Scripts.ForOp(calls[0].oc.Op)
	r := s.Batch.Run(ctx, c.Scripts, c.B, c.Info.Functions, func(sc backend.Script) script.Result {
		v, err := c.B.Script(ctx, sc)
		return script.Result{Val: v, Err: err}
	}, keys, args)
	for i, bc := range calls {
		bc.done <- BatchResult(r, i, len(calls))
	}
}

// BatchContext returns the context a batch is sent under, and its cancel
// function: the values of its first call's context; the latest deadline of
// its calls' (none if one has none); when every call's context can end,
// an end once they all have: a caller whose context ends stops waiting
// for the batch on its own (see do), and once nobody waits, the batch is
// given up as a lone call would be (a Backend that returns by its
// context's end returns then; go-redis within its read timeout); and an
// end when also (if not nil) ends.
func BatchContext(calls []*batchCall, also context.Context) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(calls[0].ctx)
	var latest time.Time
	bounded, ending := true, true
	for _, bc := range calls {
		dl, ok := bc.ctx.Deadline()
		bounded = bounded && ok
		if ok && dl.After(latest) {
			latest = dl
		}
		ending = ending && bc.ctx.Done() != nil
	}
	ctx, cancel := context.WithCancel(base)
	if bounded {
		ctx, cancel = context.WithDeadline(base, latest)
	}
	var stops []func() bool
	if also != nil {
		stops = append(stops, context.AfterFunc(also, cancel))
	}
	if ending {
		var left atomic.Int64
		left.Store(int64(len(calls)))
		for _, bc := range calls {
			stops = append(stops, context.AfterFunc(bc.ctx, func() {
				if left.Add(-1) == 0 {
					cancel()
				}
			}))
		}
	}
	if len(stops) == 0 {
		return ctx, cancel
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

// BatchResult returns the result of the ith of n calls sent as one batch
// whose result is r (see lua/batch.lua's reply): the batch's error, if it
// failed as a whole, is each call's.
func BatchResult(r script.Result, i, n int) script.Result {
	if r.Err != nil {
		return script.Result{Err: r.Err}
	}
	all, ok := r.Val.([]any)
	if !ok || len(all) != n {
		return script.Result{Err: fmt.Errorf("%w: a batch of %d calls was answered %v", fault.ErrRedis, n, r.Val)}
	}
	one, _ := all[i].([]any)
	code := int64(-1)
	if len(one) > 0 {
		code, _ = one[0].(int64)
	}
	switch {
	case code == 0 && len(one) == 2:
		return script.Result{Val: one[1]}
	case code == 1 && len(one) == 1:
		return script.Result{}
	case code == 2 && len(one) == 2:
		if msg, ok := one[1].(string); ok {
			return script.Result{Err: &backend.ReplyError{Reply: msg}}
		}
	}
	return script.Result{Err: fmt.Errorf("%w: call %d of a batch of %d was answered %v", fault.ErrRedis, i+1, n, all[i])}
}

// Sent returns how many batches b sent, and how many calls they held
// (tests read it).
func (b *Batcher) Sent() (batches, calls int64) { return b.sent.Load(), b.sentCalls.Load() }

// Queued returns how many calls of the entry named entry wait in b's
// queues (tests read it).
func (b *Batcher) Queued(entry string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for k, g := range b.groups {
		if script.Entries[k.entry].Name == entry {
			n += len(g.queue)
		}
	}
	return n
}

// Caller returns the call path b sends its batches through, and Max the
// most calls it sends in one (tests read them).
func (b *Batcher) Caller() *Caller { return b.c }

// Max returns the most calls b sends in one batch.
func (b *Batcher) Max() int { return b.max }
