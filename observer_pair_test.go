package fairlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// pairLog is an Observer that pairs each ID's events as an observer that
// counts waits and holders must (fairlockotel's does): a wait begins with
// WaitStarted and ends with Granted or WaitAbandoned; a lease begins with
// Granted and ends with LeaseReleased or LeaseLost (which the client may
// report just before the Granted of a lease lost at once). Anything else,
// an event twice or after its end, is noted as a fault.
type pairLog struct {
	mu     sync.Mutex
	ids    map[uint64]*pairState
	faults []string
}

type pairState struct {
	waiting, granted, abandoned, ended bool
	kinds                              []EventKind
}

func newPairLog() *pairLog { return &pairLog{ids: map[uint64]*pairState{}} }

func (p *pairLog) Observe(e Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e.ID == 0 {
		p.faults = append(p.faults, fmt.Sprintf("%v without an ID", e.Kind))
		return
	}
	s := p.ids[e.ID]
	if s == nil {
		s = &pairState{}
		p.ids[e.ID] = s
	}
	s.kinds = append(s.kinds, e.Kind)
	bad := func(why string) {
		p.faults = append(p.faults, fmt.Sprintf("ID %d: %s (events %v)", e.ID, why, s.kinds))
	}
	switch e.Kind {
	case WaitStarted:
		if s.waiting || s.granted || s.abandoned || s.ended {
			bad("a wait started twice, or after its end")
		}
		s.waiting = true
	case Granted:
		if s.granted || s.abandoned {
			bad("granted twice, or after it was abandoned")
		}
		s.waiting, s.granted = false, true
	case WaitAbandoned:
		if !s.waiting || s.granted || s.ended {
			bad("abandoned without a wait, or after its grant")
		}
		s.waiting, s.abandoned = false, true
	case LeaseRenewed:
		if s.ended || s.abandoned {
			bad("renewed after its end")
		}
	case LeaseReleased, LeaseLost:
		if s.ended || s.abandoned {
			bad("a lease ended twice, or after its wait was abandoned")
		}
		s.ended = true
	}
}

// counts returns the leases held and the waits going on, as the events say.
func (p *pairLog) counts() (holding, waiting int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.ids {
		if s.granted && !s.ended {
			holding++
		}
		if s.waiting {
			waiting++
		}
	}
	return holding, waiting
}

// dump renders each ID's events.
func (p *pairLog) dump() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for id, s := range p.ids {
		out = append(out, fmt.Sprintf("%d: %v", id, s.kinds))
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// check fails t on a fault, or on an ID whose events are not a whole
// acquisition: a wait abandoned, or a lease granted and ended.
func (p *pairLog) check(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	faults := p.faults
	for id, s := range p.ids {
		if !s.abandoned && !(s.granted && s.ended) {
			faults = append(faults, fmt.Sprintf("ID %d: left open (events %v)", id, s.kinds))
		}
	}
	if len(faults) > 0 {
		t.Fatalf("events that do not pair:\n%s", strings.Join(faults, "\n"))
	}
}

// balanced waits until the observer counts as many holders of the mutex
// name as Status does, and as many waits as wait in its queue and on its
// default condition, and those are want; it fails t otherwise.
func (p *pairLog) balanced(t *testing.T, c *Client, rdb redis.Cmdable, name string, wantHeld, wantWaiting int) {
	t.Helper()
	k, err := c.keys(name)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var st Status
	var onCond int64
	var holding, waiting int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		holding, waiting = p.counts()
		st, err = c.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		onCond, err = rdb.ZCard(ctx, condKeys(k, "")[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		if int64(holding) == st.Held && int64(waiting) == st.Queued+onCond && holding == wantHeld && waiting == wantWaiting {
			return
		}
	}
	t.Fatalf("observed %d holders and %d waits; Redis has %d holders, %d queued and %d on the condition; want %d and %d; events by ID:\n%s",
		holding, waiting, st.Held, st.Queued, onCond, wantHeld, wantWaiting, p.dump())
}

type condResult struct {
	l   *Lease
	err error
}

func condWaitAsync(ctx context.Context, l *Lease) <-chan condResult {
	ch := make(chan condResult, 1)
	go func() {
		nl, err := l.condWait(ctx, "")
		ch <- condResult{nl, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan condResult) condResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("CondWait did not return within 10s")
		return condResult{}
	}
}

func granted(t *testing.T, ch <-chan condResult) *Lease {
	t.Helper()
	r := receive(t, ch)
	if r.err != nil {
		t.Fatalf("CondWait: %v", r.err)
	}
	return r.l
}

// Every wait and lease is observed from its start to its end, under an ID
// of its own, through condition waits, signals and broadcasts, a
// cancelled wait, a wait refused by Redis, a lost lease, a wait woken by
// its own process's outage, and Close: an observer that pairs the events
// counts, at each step, the holders and waiters Redis has.
func TestObserverPairsCondWaits(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		pl := newPairLog()
		prefix := WithPrefix(redistest.Prefix(t))
		// A long waiter TTL: a waiter whose refresh a loaded machine holds
		// up past it would come back without a signal, holding the mutex,
		// and the counts below would be other (though still paired).
		client := func(opts ...Option) *Client {
			c, err := New(b.Client(t), append([]Option{prefix, WithObserver(pl), WithWaiterTTL(time.Minute)}, opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		c1, c2 := client(), client()
		raw := b.Client(t)
		const name = "pairs"
		req := Request{Name: name, Capacity: 1, Permits: 1}
		acquire := func(c *Client) *Lease {
			t.Helper()
			l, err := c.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		release := func(l *Lease) {
			t.Helper()
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		signal := func(all bool, want int) {
			t.Helper()
			n, err := c2.signal(ctx, name, "", all)
			if err != nil || n != want {
				t.Fatalf("signal (all %v) = %d, %v; want %d", all, n, err, want)
			}
		}

		l1 := acquire(c1)
		pl.balanced(t, c1, raw, name, 1, 0)
		w1 := condWaitAsync(ctx, l1)
		pl.balanced(t, c1, raw, name, 0, 1)
		w2 := condWaitAsync(ctx, acquire(c2))
		pl.balanced(t, c1, raw, name, 0, 2)

		// A cancelled wait.
		cctx, cancel := context.WithCancel(ctx)
		w3 := condWaitAsync(cctx, acquire(c1))
		pl.balanced(t, c1, raw, name, 0, 3)
		cancel()
		if r := receive(t, w3); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled CondWait = %v", r.err)
		}
		pl.balanced(t, c1, raw, name, 0, 2)

		// A signal while the mutex is held: the woken waiter queues.
		held := acquire(c2)
		signal(false, 1)
		pl.balanced(t, c1, raw, name, 1, 2)
		release(held)
		a := granted(t, w1)
		pl.balanced(t, c1, raw, name, 1, 1)

		// The lease a wait returned waits again; a broadcast wakes both.
		wa := condWaitAsync(ctx, a)
		pl.balanced(t, c1, raw, name, 0, 2)
		signal(true, 2)
		bl := granted(t, w2)
		pl.balanced(t, c1, raw, name, 1, 1)
		release(bl)
		a = granted(t, wa)
		pl.balanced(t, c1, raw, name, 1, 0)
		release(a)
		pl.balanced(t, c1, raw, name, 0, 0)

		// A wait refused by Redis: the lease is released.
		refuse := &failReleases{op: "wait", err: replyError("TRYAGAIN Multiple keys request during rehashing of slot")}
		rrdb := b.Client(t)
		rrdb.AddHook(refuse)
		rc, err := New(rrdb, prefix, WithObserver(pl))
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		l, err := rc.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		refuse.n.Store(1)
		if _, err := l.condWait(ctx, ""); !errors.Is(err, ErrRedis) {
			t.Fatalf("refused CondWait = %v", err)
		}
		pl.balanced(t, c1, raw, name, 0, 0)

		// A lease a wait returned is lost: its process is cut off.
		faults := &redistest.Faults{}
		frdb := b.Client(t)
		faulty := redistest.AddHook[Option](frdb, faults)
		t.Cleanup(faults.Hear)
		fc, err := New(frdb, prefix, faulty, WithObserver(pl), WithLeaseTTL(600*time.Millisecond), WithWaiterTTL(600*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer fc.Close()
		l, err = fc.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		wf := condWaitAsync(ctx, l)
		pl.balanced(t, c1, raw, name, 0, 1)
		signal(false, 1)
		lost := granted(t, wf)
		pl.balanced(t, c1, raw, name, 1, 0)
		faults.Down.Store(true)
		select {
		case <-lost.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the cut-off lease did not end")
		}
		if !errors.Is(lost.Err(), ErrLeaseLost) {
			t.Fatalf("cut-off lease: %v", lost.Err())
		}
		pl.balanced(t, c1, raw, name, 0, 0)

		// A waiter Redis lost (as when the process could not refresh it in
		// time, or Redis lost its data) comes back without a signal,
		// holding the mutex.
		l = acquire(client(WithWaiterTTL(600 * time.Millisecond))) // refreshed often
		ws := condWaitAsync(ctx, l)
		pl.balanced(t, c1, raw, name, 0, 1)
		k, err := c1.keys(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := raw.Del(ctx, append(slices.Clone(k.List()), condKeys(k, "")...)...).Err(); err != nil {
			t.Fatal(err)
		}
		woken := granted(t, ws)
		pl.balanced(t, c1, raw, name, 1, 0)
		release(woken)
		pl.balanced(t, c1, raw, name, 0, 0)

		// Close ends a wait on the condition, and a lease a wait returned.
		c3 := client()
		w4 := condWaitAsync(ctx, acquire(c3))
		pl.balanced(t, c1, raw, name, 0, 1)
		_ = c3.Close()
		if r := receive(t, w4); !errors.Is(r.err, ErrClosed) {
			t.Fatalf("CondWait ended by Close = %v", r.err)
		}
		pl.balanced(t, c1, raw, name, 0, 0)
		c4 := client()
		w5 := condWaitAsync(ctx, acquire(c4))
		pl.balanced(t, c1, raw, name, 0, 1)
		signal(false, 1)
		closed := granted(t, w5)
		pl.balanced(t, c1, raw, name, 1, 0)
		_ = c4.Close() // releases the lease
		if !errors.Is(closed.Err(), ErrClosed) {
			t.Fatalf("lease of a closed client: %v", closed.Err())
		}
		pl.balanced(t, c1, raw, name, 0, 0)
		c5 := client(WithLeaseTTL(600 * time.Millisecond)) // Abandon leaves its lease to expire
		w6 := condWaitAsync(ctx, acquire(c5))
		pl.balanced(t, c1, raw, name, 0, 1)
		signal(false, 1)
		abandoned := granted(t, w6)
		pl.balanced(t, c1, raw, name, 1, 0)
		_ = c5.Abandon()
		if !errors.Is(abandoned.Err(), ErrClosed) {
			t.Fatalf("lease of an abandoned client: %v", abandoned.Err())
		}
		pl.balanced(t, c1, raw, name, 0, 0)
		pl.check(t)
	})
}

// fakeAck is a go-redis hook that answers, in place of Redis, the WAIT
// that WithReplicaAck pipelines after a script: all replicas acknowledged,
// or none after a renewal while refuse is set.
type fakeAck struct{ refuse atomic.Bool }

func (f *fakeAck) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f *fakeAck) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f *fakeAck) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var keep []redis.Cmder
		var waits []*redis.IntCmd
		renew := false
		for _, cmd := range cmds {
			if w, ok := cmd.(*redis.IntCmd); ok && cmd.Name() == "wait" {
				waits = append(waits, w)
				continue
			}
			keep = append(keep, cmd)
			renew = renew || redistest.RunsOp(cmd, "renew")
		}
		err := next(ctx, keep)
		for _, w := range waits {
			if renew && f.refuse.Load() {
				w.SetVal(0)
			} else {
				w.SetVal(1)
			}
		}
		return err
	}
}

// A grant that could not be confirmed on the replicas (WithReplicaAck) is
// never handed to its caller: the observer sees the wait abandoned, and
// nothing of a lease (which the client gives back unreported).
func TestObserverUnconfirmedGrant(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		pl := newPairLog()
		prefix := WithPrefix(redistest.Prefix(t))
		holder, err := New(b.Client(t), prefix)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		ack := &fakeAck{}
		ardb := b.Client(t)
		ardb.AddHook(ack)
		ac, err := New(ardb, prefix, WithObserver(pl), WithReplicaAck(1, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer ac.Close()
		req := Request{Name: "unconfirmed", Capacity: 1, Permits: 1}
		held, err := holder.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			l, err := ac.Acquire(ctx, req)
			if err == nil {
				_ = l.Release(ctx)
			}
			done <- err
		}()
		waitQueued(t, holder, "unconfirmed", 1)
		ack.refuse.Store(true)
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotReplicated) {
				t.Fatalf("Acquire whose grant was not confirmed = %v, want ErrNotReplicated", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Acquire did not return within 10s")
		}
		pl.check(t)
		if h, w := pl.counts(); h != 0 || w != 0 {
			t.Fatalf("observed %d holders and %d waits after the acquisition failed", h, w)
		}
	})
}
