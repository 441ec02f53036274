package fairlock

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// durationLimit is one duration a user can give the library: an option
// or a request's field, with the largest value it accepts.
type durationLimit struct {
	// name is how the API spells it, as its errors name it
	// ("WithLeaseTTL", "Request.MaxHold"; another package's with its
	// name: "semaphore.WithMaxHold").
	name  string
	max   time.Duration
	label string // what its refusal names (the option or field)
	// zero is what 0 does: "refused", or "default" (no cap, the
	// client's, or off).
	zero string
	// set returns the options and the request that give the duration d
	// to a client and a mutex on name.
	set func(d time.Duration, name string) ([]Option, Request)
	// noWait says why the end-to-end run cannot give the duration its
	// effect here (and what it checks instead); "" for none.
	noWait string
}

func mutexReq(name string) Request { return Request{Name: name, Capacity: 1, Permits: 1} }

// durationLimits is every duration option and request field, root and
// the packages built on it. TestDurationLimitsListEveryOption fails when
// one is missing.
var durationLimits = []durationLimit{
	{name: "WithLeaseTTL", label: "WithLeaseTTL", max: MaxTTL, zero: "refused",
		set: func(d time.Duration, n string) ([]Option, Request) { return []Option{WithLeaseTTL(d)}, mutexReq(n) }},
	{name: "WithWaiterTTL", label: "WithWaiterTTL", max: MaxTTL, zero: "refused",
		set: func(d time.Duration, n string) ([]Option, Request) { return []Option{WithWaiterTTL(d)}, mutexReq(n) }},
	{name: "WithMaxHold", label: "WithMaxHold", max: MaxHoldLimit, zero: "default",
		set: func(d time.Duration, n string) ([]Option, Request) { return []Option{WithMaxHold(d)}, mutexReq(n) }},
	{name: "WithReplicaAck", label: "WithReplicaAck", max: MaxTTL, zero: "refused",
		set: func(d time.Duration, n string) ([]Option, Request) {
			return []Option{WithReplicaAck(1, d)}, mutexReq(n)
		},
		noWait: "WAIT for a replica this test's server does not have would block for the timeout: the server is checked to accept WAIT with it"},
	{name: "Request.MaxHold", label: "Request.MaxHold", max: MaxHoldLimit, zero: "default",
		set: func(d time.Duration, n string) ([]Option, Request) {
			r := mutexReq(n)
			r.MaxHold = d
			return nil, r
		}},
	{name: "Request.LeaseTTL", label: "Request.LeaseTTL", max: MaxTTL, zero: "default",
		set: func(d time.Duration, n string) ([]Option, Request) {
			r := mutexReq(n)
			r.LeaseTTL = d
			return nil, r
		}},
	// semaphore.WithLeaseTTL sets Request.LeaseTTL on every request (its
	// New validates it through the engine), so its row is that field's.
	{name: "semaphore.WithLeaseTTL", label: "Request.LeaseTTL", max: MaxTTL, zero: "default",
		set: func(d time.Duration, n string) ([]Option, Request) {
			r := mutexReq(n)
			r.LeaseTTL = d
			return nil, r
		}},
	// election.WithLeaseTTL sets Request.LeaseTTL on every campaign (its
	// New validates it through the engine), so its row is that field's.
	{name: "election.WithLeaseTTL", label: "Request.LeaseTTL", max: MaxTTL, zero: "default",
		set: func(d time.Duration, n string) ([]Option, Request) {
			r := mutexReq(n)
			r.LeaseTTL = d
			return nil, r
		}},
	// semaphore.WithMaxHold sets Request.MaxHold on every request (its
	// New validates it through the engine), so its row is that field's.
	{name: "semaphore.WithMaxHold", label: "Request.MaxHold", max: MaxHoldLimit, zero: "default",
		set: func(d time.Duration, n string) ([]Option, Request) {
			r := mutexReq(n)
			r.MaxHold = d
			return nil, r
		}},
}

// refusal returns the error a client with opts and request req meets
// before reaching Redis: from New, or from the request's validation.
func limitRefusal(opts []Option, req Request) error {
	cfg, err := newConfig(opts)
	if err != nil {
		return err
	}
	c := &Client{cfg: cfg}
	return c.validate(req)
}

// Every duration option and request field: the largest value it accepts
// works end to end (a contended waiter hears its grant by its wake-up, the
// lease renews), the next nanosecond up and a negative value are refused
// with ErrInvalidArgument naming the option and the largest value, and 0
// is refused or means the default as documented.
func TestDurationLimits(t *testing.T) {
	for _, dl := range durationLimits {
		t.Run(dl.name, func(t *testing.T) {
			if err := limitRefusal(dl.set(dl.max, "a")); err != nil {
				t.Fatalf("%s(%v) refused: %v", dl.name, dl.max, err)
			}
			err := limitRefusal(dl.set(dl.max+1, "a"))
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), dl.label) || !strings.Contains(err.Error(), dl.max.String()) {
				t.Errorf("%s(%v) = %v, want ErrInvalidArgument naming %s and %v", dl.name, dl.max+1, err, dl.label, dl.max)
			}
			if err := limitRefusal(dl.set(-1, "a")); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), dl.label) {
				t.Errorf("%s(-1ns) = %v, want ErrInvalidArgument naming %s", dl.name, err, dl.label)
			}
			err = limitRefusal(dl.set(0, "a"))
			switch {
			case dl.zero == "refused" && (!errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), dl.label)):
				t.Errorf("%s(0) = %v, want ErrInvalidArgument naming %s", dl.name, err, dl.label)
			case dl.zero == "default" && err != nil:
				t.Errorf("%s(0) = %v, want the default", dl.name, err)
			}
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) { runAtLimit(t, b, dl) })
		})
	}
}

// limitEvents hands a client's events to the test as they happen.
type limitEvents chan Event

func (l limitEvents) Observe(e Event) {
	select {
	case l <- e:
	default: // the test reads the events it waits for; others may drop
	}
}

func (l limitEvents) await(t *testing.T, kind EventKind) Event {
	t.Helper()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		select {
		case e := <-l:
			if e.Kind == kind {
				return e
			}
		case <-timeout.C:
			t.Fatalf("no %v event in a minute", kind)
		}
	}
}

// runAtLimit runs dl at its largest value: one client holds a mutex,
// another queues for it, the holder releases, the waiter hears its grant
// (with waiter TTLs of a day, only its wake-up can tell it soon), renews
// it and releases it.
func runAtLimit(t *testing.T, b *redistest.Backend, dl durationLimit) {
	ctx := context.Background()
	rdb := b.Client(t)
	if dl.noWait != "" {
		t.Log(dl.noWait)
		if b.Real() {
			if err := rdb.Do(ctx, "WAIT", 0, dl.max.Milliseconds()).Err(); err != nil {
				t.Fatalf("WAIT 0 %d: %v", dl.max.Milliseconds(), err)
			}
		}
		return
	}
	opts, req := dl.set(dl.max, "m")
	opts = append(opts, WithPrefix(redistest.Prefix(t)))
	client := func(ev limitEvents) *Client {
		c, err := New(b.Client(t), append(opts, WithObserver(ev))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	evA, evB := make(limitEvents, 64), make(limitEvents, 64)
	a, c := client(evA), client(evB)
	held, err := a.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire = %v", err)
	}
	got := make(chan *Lease, 1)
	errs := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, req)
		if err != nil {
			errs <- err
			return
		}
		got <- l
	}()
	evB.await(t, WaitStarted)
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release = %v", err)
	}
	var l *Lease
	select {
	case l = <-got:
	case err := <-errs:
		t.Fatalf("contended Acquire = %v", err)
	case <-time.After(time.Minute):
		t.Fatalf("contended Acquire not granted a minute after the release (the waiter did not hear its wake-up)")
	}
	l.renew()
	evB.await(t, LeaseRenewed)
	if err := l.Err(); err != nil {
		t.Fatalf("after its renewal, Err() = %v", err)
	}
	st, err := c.Status(ctx, req.Name)
	if err != nil || len(st.Holders) != 1 {
		t.Fatalf("Status = %+v, %v; want one holder", st, err)
	}
	ttl := c.cfg.leaseTTL
	if req.LeaseTTL != 0 {
		ttl = req.LeaseTTL // the request's own
	}
	if in := st.Holders[0].ExpiresIn; in < ttl-time.Minute || in > ttl {
		t.Errorf("renewed lease expires in %v, want about %v", in, ttl)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release of the renewed lease = %v", err)
	}
}

// TestDurationLimitsListEveryOption reads the source of the library's
// packages and fails for any duration option (an exported function that
// returns an Option and takes a time.Duration) or request field (an
// exported time.Duration field of a struct an exported function takes)
// that durationLimits does not list, and for a row naming none.
func TestDurationLimitsListEveryOption(t *testing.T) {
	found := map[string]bool{}
	for _, dir := range []string{".", "semaphore", "multilock", "election", "fairlockotel"} {
		for _, name := range durationInputs(t, dir) {
			found[name] = true
		}
	}
	listed := map[string]bool{}
	for _, dl := range durationLimits {
		listed[dl.name] = true
		if !found[dl.name] {
			t.Errorf("durationLimits lists %s, which the source does not have", dl.name)
		}
	}
	var missing []string
	for name := range found {
		if !listed[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("duration inputs missing from durationLimits (give each a largest value, a bound in New or the request check, and a row): %s", strings.Join(missing, ", "))
	}
	if len(found) < 5 {
		t.Errorf("found only %d duration inputs (%v): the scan is broken", len(found), found)
	}
}

// durationInputs returns the duration options and request fields of the
// package in dir, named as durationLimits names them.
func durationInputs(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s: %v", dir, err)
	}
	fset := token.NewFileSet()
	var decls []ast.Decl
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		decls = append(decls, file.Decls...)
	}
	qual := ""
	if dir != "." {
		qual = filepath.Base(dir) + "."
	}
	isDuration := func(e ast.Expr) bool {
		s, ok := e.(*ast.SelectorExpr)
		return ok && s.Sel.Name == "Duration" && isIdent(s.X, "time")
	}
	structs := map[string]*ast.StructType{}
	for _, d := range decls {
		if g, ok := d.(*ast.GenDecl); ok {
			for _, s := range g.Specs {
				if ts, ok := s.(*ast.TypeSpec); ok {
					if st, ok := ts.Type.(*ast.StructType); ok && ts.Name.IsExported() {
						structs[ts.Name.Name] = st
					}
				}
			}
		}
	}
	var out []string
	taken := map[string]bool{} // structs an exported function takes
	for _, d := range decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || !fd.Name.IsExported() {
			continue
		}
		durationParam := false
		for _, p := range fd.Type.Params.List {
			durationParam = durationParam || isDuration(p.Type)
			typ := p.Type
			if e, ok := typ.(*ast.Ellipsis); ok {
				typ = e.Elt
			}
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			if id, ok := typ.(*ast.Ident); ok && structs[id.Name] != nil {
				taken[id.Name] = true
			}
		}
		returnsOption := fd.Recv == nil && fd.Type.Results != nil && slices.ContainsFunc(fd.Type.Results.List, func(f *ast.Field) bool { return isIdent(f.Type, "Option") })
		if returnsOption && durationParam {
			out = append(out, qual+fd.Name.Name)
		}
	}
	for name := range taken {
		for _, f := range structs[name].Fields.List {
			if !isDuration(f.Type) {
				continue
			}
			for _, n := range f.Names {
				if n.IsExported() {
					out = append(out, qual+name+"."+n.Name)
				}
			}
		}
	}
	return out
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}
