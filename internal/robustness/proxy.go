package robustness

import (
	"net"
	"sync"
	"time"
)

// A Proxy forwards TCP connections from its loopback port to Redis, and
// injects faults on demand: latency on every chunk it forwards, a stall
// (connections stay open, nothing moves), or a cut (every connection closed
// and new ones refused). Faults are set and healed by the nemesis.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	latency time.Duration
	stalled chan struct{} // closed when no stall is on; replaced by a stall
	cut     bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	closed  bool
	done    chan struct{} // closed by Close
}

// StartProxy starts a proxy to target on a free loopback port.
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{ln: ln, target: target, stalled: open, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's address, for clients.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetLatency delays every chunk forwarded, both ways, by d (0 heals).
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// Stall stops forwarding, keeping the connections open, until the returned
// function is called.
func (p *Proxy) Stall() (heal func()) {
	ch := make(chan struct{})
	p.mu.Lock()
	p.stalled = ch
	p.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// Cut closes every connection and refuses new ones until the returned
// function is called.
func (p *Proxy) Cut() (heal func()) {
	p.mu.Lock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.cut = false
		p.mu.Unlock()
	}
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	close(p.done)
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut || p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(down) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(down)
			up, err := net.DialTimeout("tcp", p.target, time.Second)
			if err != nil {
				return
			}
			if !p.track(up) {
				return
			}
			defer p.untrack(up)
			done := make(chan struct{}, 2)
			go func() { p.pipe(up, down); done <- struct{}{} }()
			go func() { p.pipe(down, up); done <- struct{}{} }()
			<-done
			// One side ended: end both, so the other pipe returns too.
			_ = up.Close()
			_ = down.Close()
			<-done
		}()
	}
}

// pipe copies from src to dst, chunk by chunk, through the faults.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			lat, stalled := p.latency, p.stalled
			p.mu.Unlock()
			select {
			case <-stalled:
			case <-p.done:
				return
			}
			if lat > 0 {
				time.Sleep(lat)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
