package robustness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
)

// A Store is the fenced service the traffic protects: per resource, a value
// and the highest tokens it has seen, over HTTP on loopback.
//
//	GET /read?r=R&tok=T             refused when T is below the highest write token;
//	                                 else raises the highest read token to T and
//	                                 returns the value
//	GET /write?r=R&tok=T&from=F&to=V refused when T is below the highest read or
//	                                 write token; else stores V and raises the
//	                                 highest write token to T
//
// The store does not look at F: it is the value the writer read, which only
// the checker uses (a write whose F is not the value it overwrote is a lost
// update). Readers share: a read does not refuse a lower-token read, so the
// readers of a read-write lock, granted in any order, are not refused by
// each other, while a writer whose lease was lost is refused once anyone
// later has read or written.
type Store struct {
	srv *http.Server
	ln  net.Listener

	mu   sync.Mutex
	regs map[string]*register
}

type register struct {
	value, hw, hr int64
	writes        int64 // writes accepted
	refused       int64
}

// Reply is the store's answer to a read or a write.
type Reply struct {
	Refused bool  `json:"refused"`
	Value   int64 `json:"value"`
}

// StartStore starts a store on a free loopback port.
func StartStore() (*Store, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Store{ln: ln, regs: map[string]*register{}}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve)}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// URL returns the store's base URL.
func (s *Store) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops the store.
func (s *Store) Close() error { return s.srv.Close() }

func (s *Store) serve(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	num := func(k string) (int64, error) { return strconv.ParseInt(q.Get(k), 10, 64) }
	tok, err := num("tok")
	name := q.Get("r")
	if err != nil || name == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var rep Reply
	switch r.URL.Path {
	case "/read":
		rep = s.read(name, tok)
	case "/write":
		from, err1 := num("from")
		to, err2 := num("to")
		if err1 != nil || err2 != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		_ = from
		rep = s.write(name, tok, to)
	default:
		http.NotFound(w, r)
		return
	}
	_ = json.NewEncoder(w).Encode(rep)
}

func (s *Store) reg(name string) *register {
	g := s.regs[name]
	if g == nil {
		g = &register{}
		s.regs[name] = g
	}
	return g
}

func (s *Store) read(name string, tok int64) Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.reg(name)
	if tok < g.hw {
		g.refused++
		return Reply{Refused: true}
	}
	g.hr = max(g.hr, tok)
	return Reply{Value: g.value}
}

func (s *Store) write(name string, tok, to int64) Reply {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.reg(name)
	if tok < max(g.hw, g.hr) {
		g.refused++
		return Reply{Refused: true}
	}
	g.value, g.hw = to, tok
	g.writes++
	return Reply{Value: to}
}

// Final is what the store holds of one resource at the end of a run.
type Final struct {
	Value, Writes, Refused int64
}

// Finals returns every resource's final state.
func (s *Store) Finals() map[string]Final {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Final, len(s.regs))
	for n, g := range s.regs {
		out[n] = Final{Value: g.value, Writes: g.writes, Refused: g.refused}
	}
	return out
}

// A StoreClient talks to a Store.
type StoreClient struct {
	base string
	hc   *http.Client
}

// NewStoreClient returns a client of the store at base.
func NewStoreClient(base string) *StoreClient {
	return &StoreClient{base: base, hc: &http.Client{}}
}

// Read reads resource r with token tok.
func (c *StoreClient) Read(ctx context.Context, r string, tok int64) (Reply, error) {
	return c.get(ctx, c.base+"/read?"+url.Values{"r": {r}, "tok": {fmt.Sprint(tok)}}.Encode())
}

// Write writes to into resource r with token tok, having read from.
func (c *StoreClient) Write(ctx context.Context, r string, tok, from, to int64) (Reply, error) {
	return c.get(ctx, c.base+"/write?"+url.Values{"r": {r}, "tok": {fmt.Sprint(tok)},
		"from": {fmt.Sprint(from)}, "to": {fmt.Sprint(to)}}.Encode())
}

func (c *StoreClient) get(ctx context.Context, u string) (Reply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Reply{}, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return Reply{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return Reply{}, fmt.Errorf("store: %s: %s", resp.Status, b)
	}
	var rep Reply
	err = json.NewDecoder(resp.Body).Decode(&rep)
	return rep, err
}
