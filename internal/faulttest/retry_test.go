package faulttest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/redis/go-redis/v9"
)

// lossy is a TCP proxy in front of Redis that, when armed, lets the next
// script call (EVALSHA or FCALL) through and cuts the connection instead of passing its reply
// back: the script ran, and the client does not know. go-redis then sends
// the command again on a new connection. With cutAndHold, that resent
// command is also held back until the test lets it go, as if it had been
// delayed in the network.
type lossy struct {
	addr    string
	armed   atomic.Bool
	cut     atomic.Int64 // replies cut so far
	hold    atomic.Pointer[chan struct{}]
	holding atomic.Int64 // commands held back so far
	quit    chan struct{}
	l       net.Listener
	wg      sync.WaitGroup
	target  string
}

func newLossy(t *testing.T, target string) *lossy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossy{addr: l.Addr().String(), l: l, target: target, quit: make(chan struct{})}
	p.wg.Go(p.serve)
	t.Cleanup(func() { close(p.quit); l.Close(); p.wg.Wait() })
	return p
}

// cutAndHold arms p to cut the reply of the next script call and to hold
// back the one after it (go-redis's resend) until resume is called (also
// called when the test ends).
func (p *lossy) cutAndHold(t *testing.T) (resume func()) {
	ch := make(chan struct{})
	p.hold.Store(&ch)
	p.armed.Store(true)
	var once sync.Once
	resume = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(resume)
	return resume
}

// waitHeld waits until a reply was cut since before and the resent
// command is held back.
func (p *lossy) waitHeld(t *testing.T, before int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.cut.Load() == before || p.holding.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d replies cut, %d resends held: the test proves nothing", p.cut.Load()-before, p.holding.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

func (p *lossy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		var drop atomic.Bool
		closeBoth := func() { c.Close(); s.Close() }
		p.wg.Go(func() { // client to server
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if low := bytes.ToLower(buf[:n]); bytes.Contains(low, []byte("evalsha")) || bytes.Contains(low, []byte("fcall")) {
						if p.armed.CompareAndSwap(true, false) {
							drop.Store(true)
						} else if h := p.hold.Swap(nil); h != nil {
							p.holding.Add(1)
							select {
							case <-*h:
							case <-p.quit:
								return
							}
						}
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		p.wg.Go(func() { // server to client
			defer closeBoth()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if drop.Load() {
						p.cut.Add(1)
						return // the reply is lost with the connection
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

// An acquire whose reply is lost is sent again by go-redis; the second run
// finds the first one's grant or queue place instead of making another, so
// no permit is held twice and no waiter is queued twice.
func TestAcquireReplyLost(t *testing.T) {
	b := redistest.RealBackend(t)
	p := newLossy(t, b.Addr)
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	newClient := func(addr string) *fairlock.Client {
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); rdb.Close() })
		return c
	}
	viaProxy, direct := newClient(p.addr), newClient(b.Addr)
	mutex := fairlock.Request{Name: "lost", Capacity: 1, Permits: 1}
	// Load the scripts first, so that the cut reply is a script's, not a
	// NOSCRIPT or function-not-found error (after which nothing ran).
	warm, err := viaProxy.Acquire(ctx, mutex)
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Release(ctx); err != nil {
		t.Fatal(err)
	}

	t.Run("granted at once", func(t *testing.T) {
		p.armed.Store(true)
		before := p.cut.Load()
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := viaProxy.Acquire(actx, mutex)
		if err != nil {
			t.Fatalf("Acquire with a lost reply: %v", err)
		}
		if p.cut.Load() == before {
			t.Fatal("no reply was cut; the test proved nothing")
		}
		st, err := direct.Status(ctx, "lost")
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Holders) != 1 || st.Holders[0].Token != l.Token() {
			t.Fatalf("holders after a retried acquire: %+v; want one, token %d", st.Holders, l.Token())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		free, err := direct.TryAcquire(ctx, mutex)
		if err != nil {
			t.Fatalf("after the release: %v (a second grant was left behind)", err)
		}
		_ = free.Release(ctx)
	})

	t.Run("queued", func(t *testing.T) {
		held, err := direct.Acquire(ctx, mutex)
		if err != nil {
			t.Fatal(err)
		}
		p.armed.Store(true)
		before := p.cut.Load()
		got := make(chan error, 1)
		go func() {
			l, err := viaProxy.Acquire(ctx, mutex)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		deadline := time.Now().Add(5 * time.Second)
		for p.cut.Load() == before {
			if time.Now().After(deadline) {
				t.Fatal("no reply was cut; the test proved nothing")
			}
			time.Sleep(time.Millisecond)
		}
		waitWaiters(t, direct, spec{name: "lost"}, 1)
		rdb := redis.NewClient(&redis.Options{Addr: b.Addr})
		defer rdb.Close()
		if nq, _ := rdb.HGet(ctx, prefix+"{lost}:s", "nq").Result(); nq != "1" {
			t.Fatalf("waiter count %q after a retried enqueue, want 1", nq)
		}
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the retried waiter was not granted")
		}
		free, err := direct.TryAcquire(ctx, mutex)
		if err != nil {
			t.Fatalf("after all released: %v", err)
		}
		_ = free.Release(ctx)
	})
}

// grant is one member of a semaphore's holder set, as queue.lua writes it
// ("ticket permits client token", scored by expiry).
type grant struct {
	ticket string
	token  int64
}

// grantsIn reads the holder set of name, live or not yet dropped.
func grantsIn(t *testing.T, e *fltest.Env, name string) []grant {
	t.Helper()
	zs, err := statecheck.Holders(context.Background(), e.RDB, e.Prefix+"{"+name+"}")
	if err != nil {
		t.Fatal(err)
	}
	var gs []grant
	for _, z := range zs {
		m := z.Member.(string)
		f := strings.Fields(m)
		if len(f) != 4 {
			t.Fatalf("holder member %q: not ticket, permits, client, token", m)
		}
		tok, err := strconv.ParseInt(f[3], 10, 64)
		if err != nil {
			t.Fatalf("holder member %q: %v", m, err)
		}
		gs = append(gs, grant{ticket: f[0], token: tok})
	}
	return gs
}

// proxied returns a fairlock client that reaches b through p, with a read
// timeout long enough for the commands p holds back.
func proxied(e *fltest.Env, p *lossy, opts ...fairlock.Option) *fairlock.Client {
	e.T.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: p.addr, ReadTimeout: 20 * time.Second})
	e.T.Cleanup(func() { rdb.Close() })
	return e.ClientOn(rdb, opts...)
}

// warm loads the scripts through c, so that the next cut reply is a
// script's, not a NOSCRIPT error (after which nothing ran).
func warm(t *testing.T, c *fairlock.Client, req fairlock.Request) {
	t.Helper()
	l, err := c.Acquire(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A queued acquire whose reply is lost is resent by
// go-redis; here the resend arrives late, after the grant the queue
// announced to its ticket has expired, and (in "taken meanwhile") after
// another caller has taken the permits, dropping the expired grant, and
// given them back. The resent call must not grant the ticket a second
// time: a request gets exactly one grant, and a lease Acquire returns is
// one Redis holds when it returns (an error is allowed).
func TestAcquireResentAfterGrantExpired(t *testing.T) {
	t.Run("taken meanwhile", func(t *testing.T) { acquireResentLate(t, true) })
	t.Run("untouched", func(t *testing.T) { acquireResentLate(t, false) })
}

func acquireResentLate(t *testing.T, taken bool) {
	const wait = 200 * time.Millisecond
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		if !b.Real() {
			b.Freeze(t)
		}
		ctx := context.Background()
		const name = "resent"
		mutex := fairlock.Request{Name: name, Capacity: 1, Permits: 1}
		p := newLossy(t, b.Addr)
		viaProxy := proxied(e, p, fairlock.WithWaiterTTL(wait), fairlock.WithLeaseTTL(time.Minute))
		direct := e.Client()
		warm(t, viaProxy, mutex)

		held, err := direct.Acquire(ctx, mutex)
		if err != nil {
			t.Fatal(err)
		}
		before := p.cut.Load()
		resume := p.cutAndHold(t)
		type result struct {
			lease   *fairlock.Lease
			err     error
			holders []grant // Redis's holder set when Acquire returned
			live    []int64 // tokens of the live leases then
		}
		got := make(chan result, 1)
		go func() {
			actx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			var r result
			r.lease, r.err = viaProxy.Acquire(actx, mutex)
			if r.err == nil {
				r.holders = grantsIn(t, e, name)
				st, err := direct.Status(ctx, name)
				if err != nil {
					r.err = fmt.Errorf("status: %w", err)
				}
				for _, h := range st.Holders {
					r.live = append(r.live, h.Token)
				}
			}
			got <- r
		}()
		p.waitHeld(t, before)
		// The first run queued the ticket.
		q, err := e.RDB.ZRange(ctx, e.Prefix+"{"+name+"}:q", 0, -1).Result()
		if err != nil || len(q) != 1 {
			t.Fatalf("queue %q (%v); want the one ticket whose reply was cut", q, err)
		}
		ticket := strings.Fields(q[0])[0]

		// The queue grants it; its process never hears (the call is still
		// out), so the announced grant expires.
		e.Release(held)
		var first int64
		for _, g := range grantsIn(t, e, name) {
			if g.ticket == ticket {
				first = g.token
			}
		}
		if first == 0 {
			t.Fatal("the queued ticket was not granted through the queue: the test proves nothing")
		}
		pass(e, wait+time.Millisecond, "the announced grant to expire", idle(direct, name))
		if taken {
			// Another caller takes the permits, which drops the expired
			// grant, and gives them back.
			other, err := direct.Acquire(ctx, mutex)
			if err != nil {
				t.Fatal(err)
			}
			e.Release(other)
		}

		resume() // the resent acquire runs now
		var r result
		select {
		case r = <-got:
		case <-time.After(20 * time.Second):
			t.Fatal("the resent Acquire did not return")
		}
		if r.err != nil {
			t.Logf("Acquire after the late resend: %v (allowed)", r.err)
			return
		}
		defer r.lease.Release(ctx)
		tok := r.lease.Token()
		for _, g := range r.holders {
			if g.token == tok && g.ticket == ticket && tok != first {
				t.Fatalf("ticket %s granted twice: token %d through the queue, then token %d by its resent acquire", ticket, first, tok)
			}
		}
		if !slices.Contains(r.live, tok) {
			t.Fatalf("Acquire returned token %d, which Redis does not hold (live holders %v, first grant %d)", tok, r.live, first)
		}
	})
}

// A release whose reply is lost is resent by go-redis;
// the resent call finds the lease gone, because the first run released it.
// Release must return nil, not ErrLeaseLost, and the permits must be freed
// exactly once: a lease granted in between keeps its permits.
func TestReleaseReplyLost(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const name = "unsaid"
		sem := fairlock.Request{Name: name, Capacity: 2, Permits: 1}
		p := newLossy(t, b.Addr)
		viaProxy := proxied(e, p, fairlock.WithLeaseTTL(time.Minute))
		direct := e.Client()
		warm(t, viaProxy, sem)

		l, err := viaProxy.Acquire(ctx, sem)
		if err != nil {
			t.Fatal(err)
		}
		o, err := direct.Acquire(ctx, sem)
		if err != nil {
			t.Fatal(err)
		}
		before := p.cut.Load()
		resume := p.cutAndHold(t)
		released := make(chan error, 1)
		go func() { released <- l.Release(ctx) }()
		p.waitHeld(t, before)
		// The first run freed the permit: another caller takes it before
		// the resend lands.
		x, err := direct.TryAcquire(ctx, sem)
		if err != nil {
			t.Fatalf("the permit after a release whose reply was cut: %v", err)
		}
		resume()
		select {
		case err = <-released:
		case <-time.After(20 * time.Second):
			t.Fatal("Release did not return")
		}
		if err != nil {
			t.Errorf("Release whose reply was lost and resent = %v, want nil", err)
		}
		// Freed once: the two other leases hold the whole capacity.
		st, err := direct.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		var toks []int64
		for _, h := range st.Holders {
			toks = append(toks, h.Token)
		}
		slices.Sort(toks)
		want := []int64{o.Token(), x.Token()}
		slices.Sort(want)
		if !slices.Equal(toks, want) || st.InUse != 2 {
			t.Fatalf("holders %v, %d permits in use; want %v and 2", toks, st.InUse, want)
		}
		_, err = direct.TryAcquire(ctx, sem)
		fltest.IsErr(t, "TryAcquire with the capacity held", err, fairlock.ErrNotAcquired)
		e.Release(o)
		e.Release(x)
	})
}
