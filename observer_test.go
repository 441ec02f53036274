package fairlock

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// eventLog is an Observer that keeps every event.
type eventLog struct {
	mu     sync.Mutex
	events []Event
}

func (r *eventLog) Observe(e Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// has reports whether an event of kind k has been seen.
func (r *eventLog) has(k EventKind) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.ContainsFunc(r.events, func(e Event) bool { return e.Kind == k })
}

// take returns the events so far, in order, and forgets them.
func (r *eventLog) take() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

func kinds(es []Event) []EventKind {
	out := make([]EventKind, len(es))
	for i, e := range es {
		out[i] = e.Kind
	}
	return out
}

// The observer sees each wait and each lease from start to end, with the
// durations and the reasons.
func TestObserverEvents(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		rec := &eventLog{}
		prefix := WithPrefix(redistest.Prefix(t))
		const ttl = 300 * time.Millisecond
		c, err := New(b.Client(t), prefix, WithObserver(rec), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		other, err := New(b.Client(t), prefix)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		req := Request{Name: "obs", Capacity: 1, Permits: 1}

		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// Past the first renewal (due at a third of the TTL; a busy
		// machine may answer it late).
		time.Sleep(ttl/renewDivisor + 50*time.Millisecond)
		for deadline := time.Now().Add(5 * time.Second); !rec.has(LeaseRenewed) && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		es := rec.take()
		if ks := kinds(es); ks[0] != Granted || ks[len(ks)-1] != LeaseReleased || !slices.Contains(ks, LeaseRenewed) {
			t.Fatalf("acquire, hold, release: events %v", ks)
		}
		if es[0].Wait != 0 || !slices.Equal(es[0].Names, []string{"obs"}) || !slices.Equal(es[0].Permits, []int64{1}) {
			t.Fatalf("immediate grant: %+v", es[0])
		}
		if h := es[len(es)-1].Held; h < 150*time.Millisecond {
			t.Fatalf("released after >= 150ms, Held = %v", h)
		}

		// A wait that is granted.
		held, err := other.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan *Lease)
		go func() {
			l, err := c.Acquire(ctx, req)
			if err != nil {
				t.Error(err)
			}
			done <- l
		}()
		waitFor(t, func() bool { return slices.Contains(kinds(rec.snapshot()), WaitStarted) })
		time.Sleep(50 * time.Millisecond)
		_ = held.Release(ctx)
		l = <-done
		// The grant was announced: its first renewal confirms it.
		es = slices.DeleteFunc(rec.take(), func(e Event) bool { return e.Kind == LeaseRenewed })
		if ks := kinds(es); !slices.Equal(ks, []EventKind{WaitStarted, Granted}) || es[1].Wait < 50*time.Millisecond {
			t.Fatalf("a wait granted: %v, %+v", ks, es)
		}

		// A wait that gives up (l, held meanwhile, renews on).
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = c.Acquire(cctx, req)
		cancel()
		es = slices.DeleteFunc(rec.take(), func(e Event) bool { return e.Kind == LeaseRenewed })
		if ks := kinds(es); !slices.Equal(ks, []EventKind{WaitStarted, WaitAbandoned}) || !errors.Is(es[1].Err, context.DeadlineExceeded) {
			t.Fatalf("a wait abandoned (%v): %v, %+v", err, ks, es)
		}

		// A lease its client's Close releases: lost to its holder, with
		// ErrClosed.
		_ = c.Close()
		es = slices.DeleteFunc(rec.take(), func(e Event) bool { return e.Kind == LeaseRenewed })
		if len(es) != 1 || es[0].Kind != LeaseLost || !errors.Is(es[0].Err, ErrClosed) {
			t.Fatalf("lease released by Close: %+v", es)
		}
		_ = l.Release(ctx)
		if es := rec.take(); len(es) != 0 {
			t.Fatalf("events after the lease ended: %+v", es)
		}
	})
}

func (r *eventLog) snapshot() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A lost lease is logged once, at Warn, with its semaphore, owner and
// token; a quiet life logs nothing.
func TestLoggerReportsLostLease(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLogger(log), WithOwner("host:1"), WithLeaseTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	l, err := c.Acquire(ctx, Request{Name: "logged", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err = c.Acquire(ctx, Request{Name: "logged", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	quiet := buf.String()
	mu.Unlock()
	if quiet != "" {
		t.Fatalf("logged on the hot path: %s", quiet)
	}
	b.Advance(t, 2*time.Second) // the lease expires by Redis's clock
	<-l.Done()
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{"level=WARN", "lease lost", "semaphores=[logged]", "owner=host:1", "token=" + strconvI(l.Token())} {
		if !strings.Contains(out, want) {
			t.Fatalf("log %q lacks %q", out, want)
		}
	}
	if strings.Count(out, `msg="fairlock: lease lost"`) != 1 {
		t.Fatalf("lost lease logged more than once: %s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func strconvI(v int64) string { return strconv.FormatInt(v, 10) }

// Each acquisition's events carry one ID of their own, distinct from a
// concurrent wait's on the same semaphore, and its lease's events carry it
// too, so an observer can pair starts with ends.
func TestObserverEventIDs(t *testing.T) {
	b := redistest.Mini(t)
	ctx := context.Background()
	rec := &eventLog{}
	c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := Request{Name: "ids", Capacity: 1, Permits: 1}
	held, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	got := make(chan *Lease, n)
	for range n {
		go func() {
			l, err := c.Acquire(ctx, req)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
	}
	waitFor(t, func() bool {
		return len(slices.DeleteFunc(kinds(rec.snapshot()), func(k EventKind) bool { return k != WaitStarted })) == n
	})
	_ = held.Release(ctx)
	for range n {
		l := <-got
		if l != nil {
			_ = l.Release(ctx)
		}
	}
	// Per ID: the kinds in order, renewals left out.
	byID := map[uint64][]EventKind{}
	for _, e := range rec.take() {
		if e.ID == 0 {
			t.Fatalf("event without an ID: %+v", e)
		}
		if e.Kind != LeaseRenewed {
			byID[e.ID] = append(byID[e.ID], e.Kind)
		}
	}
	if len(byID) != n+1 {
		t.Fatalf("%d IDs for %d acquisitions: %v", len(byID), n+1, byID)
	}
	waited := 0
	for id, ks := range byID {
		switch {
		case slices.Equal(ks, []EventKind{Granted, LeaseReleased}):
		case slices.Equal(ks, []EventKind{WaitStarted, Granted, LeaseReleased}):
			waited++
		default:
			t.Fatalf("ID %d: events %v", id, ks)
		}
	}
	if waited != n {
		t.Fatalf("%d of %d waits paired by ID: %v", waited, n, byID)
	}
}

// A waiting client's blocking read that loses Redis logs once at Warn,
// and once at Info when it is back.
func TestLoggerReportsListenerOutage(t *testing.T) {
	redistest.Long(t)        // waits on real time for seconds: the full suite
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	srv, err := redisserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	rdb := func() *redis.Client {
		r := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	holder, err := New(rdb())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	c, err := New(rdb(), WithLogger(log), WithWaiterTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	req := Request{Name: "outage", Capacity: 1, Permits: 1}
	if _, err := holder.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(wctx, req)
		done <- err
	}()
	waitFor(t, func() bool { st, _ := holder.Status(ctx, "outage"); return st.Queued == 1 })
	logged := func(s string) bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(buf.String(), s)
	}
	srv.Kill()
	waitFor(t, func() bool { return logged(`level=WARN msg="fairlock: blocking read failed`) })
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return logged(`level=INFO msg="fairlock: blocking read recovered"`) })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(buf.String(), "blocking read failed"); n != 1 {
		t.Fatalf("outage logged %d times, want once:\n%s", n, buf.String())
	}
}
