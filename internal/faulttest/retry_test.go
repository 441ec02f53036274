package faulttest

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// lossy is a TCP proxy in front of Redis that, when armed, lets the next
// EVALSHA through and cuts the connection instead of passing its reply
// back: the script ran, and the client does not know. go-redis then sends
// the command again on a new connection.
type lossy struct {
	addr   string
	armed  atomic.Bool
	cut    atomic.Int64 // replies cut so far
	l      net.Listener
	wg     sync.WaitGroup
	target string
}

func newLossy(t *testing.T, target string) *lossy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &lossy{addr: l.Addr().String(), l: l, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
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
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("evalsha")) && p.armed.CompareAndSwap(true, false) {
						drop.Store(true)
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
	// NOSCRIPT error (after which nothing ran).
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
