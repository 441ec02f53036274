package election_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// env is one test's view of a backend (see fltest.Env).
type env struct {
	*fltest.Env
	t *testing.T
}

func newEnv(t *testing.T, b *redistest.Backend) *env {
	return &env{Env: fltest.New(t, b), t: t}
}

// election returns the election name on c.
func (e *env) election(c *fairlock.Client, name string) *election.Election {
	e.t.Helper()
	el, err := election.New(c, name)
	if err != nil {
		e.t.Fatalf("election.New(%q): %v", name, err)
	}
	return el
}

// campaign runs Campaign in a goroutine; the result arrives on the channel.
type won struct {
	l   *election.Leadership
	err error
}

func campaignAsync(ctx context.Context, el *election.Election, value string) <-chan won {
	ch := make(chan won, 1)
	go func() {
		l, err := el.Campaign(ctx, value)
		ch <- won{l, err}
	}()
	return ch
}

func (e *env) receive(ch <-chan won) *election.Leadership {
	e.t.Helper()
	select {
	case w := <-ch:
		if w.err != nil {
			e.t.Fatalf("Campaign: %v", w.err)
		}
		return w.l
	case <-time.After(10 * time.Second):
		e.t.Fatal("Campaign did not return within 10s")
		return nil
	}
}

// next returns the next change an observer delivers, failing after 10s.
func (e *env) next(ch <-chan election.Info) election.Info {
	e.t.Helper()
	select {
	case info, ok := <-ch:
		if !ok {
			e.t.Fatal("Observe's channel closed")
		}
		return info
	case <-time.After(10 * time.Second):
		e.t.Fatal("Observe delivered nothing within 10s")
		return election.Info{}
	}
}

// quiet fails if ch delivers anything within d.
func (e *env) quiet(ch <-chan election.Info, d time.Duration) {
	e.t.Helper()
	select {
	case info := <-ch:
		e.t.Fatalf("Observe delivered %+v, want nothing", info)
	case <-time.After(d):
	}
}

func (e *env) resign(l *election.Leadership) {
	e.t.Helper()
	if err := l.Resign(context.Background()); err != nil {
		e.t.Fatalf("Resign: %v", err)
	}
}

// leaderIs fails unless Leader reports want.
func (e *env) leaderIs(el *election.Election, want election.Info) {
	e.t.Helper()
	got, err := el.Leader(context.Background())
	if want.Term == 0 {
		if !errors.Is(err, election.ErrNoLeader) {
			e.t.Fatalf("Leader() = %+v, %v; want ErrNoLeader", got, err)
		}
		return
	}
	if err != nil || got != want {
		e.t.Fatalf("Leader() = %+v, %v; want %+v", got, err, want)
	}
}

// proxy is a TCP proxy to Redis that a test can cut: while cut, it
// closes every connection through it and refuses new ones.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.setCut(true)
		p.wg.Wait()
	})
	return p
}

func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(c, s)
		go pipe(s, c)
	}
}

// setCut cuts the proxy (closing its connections) or lets it serve again.
func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}
