package fairlockotel_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockotel"
	"github.com/fairlock/fairlock/internal/redistest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// rig is one test's observer with in-memory readers, and a client on a
// fresh miniredis reporting to it.
type rig struct {
	t      *testing.T
	b      *redistest.Backend
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	obs    *fairlockotel.Observer
	prefix string
}

func newRig(t *testing.T, opts ...fairlockotel.Option) *rig {
	r := &rig{t: t, b: redistest.Mini(t), reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder(), prefix: redistest.Prefix(t)}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	obs, err := fairlockotel.New(append([]fairlockotel.Option{fairlockotel.WithMeterProvider(mp), fairlockotel.WithTracerProvider(tp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	r.obs = obs
	return r
}

// client returns a client reporting to the rig's observer.
func (r *rig) client(opts ...fairlock.Option) *fairlock.Client {
	c, err := fairlock.New(r.b.Client(r.t), append([]fairlock.Option{fairlock.WithPrefix(r.prefix), fairlock.WithObserver(r.obs)}, opts...)...)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { c.Close() })
	return c
}

// metrics collects and indexes the metrics by name.
func (r *rig) metrics() map[string]metricdata.Aggregation {
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		r.t.Fatal(err)
	}
	out := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != fairlockotel.ScopeName {
			r.t.Fatalf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// key renders an attribute set as "k=v,k=v" in key order ("" for none).
func key(s attribute.Set) string {
	var parts []string
	for _, kv := range s.ToSlice() {
		parts = append(parts, string(kv.Key)+"="+kv.Value.String())
	}
	return strings.Join(parts, ",")
}

// sums returns a counter's values by attribute set.
func sums(t *testing.T, a metricdata.Aggregation) map[string]int64 {
	t.Helper()
	s, ok := a.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("not an int64 sum: %T", a)
	}
	out := map[string]int64{}
	for _, dp := range s.DataPoints {
		out[key(dp.Attributes)] = dp.Value
	}
	return out
}

// hists returns a histogram's points by attribute set.
func hists(t *testing.T, a metricdata.Aggregation) map[string]metricdata.HistogramDataPoint[float64] {
	t.Helper()
	h, ok := a.(metricdata.Histogram[float64])
	if !ok {
		t.Fatalf("not a float64 histogram: %T", a)
	}
	out := map[string]metricdata.HistogramDataPoint[float64]{}
	for _, dp := range h.DataPoints {
		out[key(dp.Attributes)] = dp
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// observedWaiting waits until the observer counts n waiters in all: the
// event follows the acquire script's reply, which Status may overtake.
func (r *rig) observedWaiting(t *testing.T, n int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d waiters observed", n), func() bool {
		s, ok := r.metrics()["fairlock.waiters"].(metricdata.Sum[int64])
		if !ok {
			return false
		}
		var sum int64
		for _, dp := range s.DataPoints {
			sum += dp.Value
		}
		return sum == n
	})
}

func waiting(t *testing.T, c *fairlock.Client, name string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d waiting for %s", n, name), func() bool {
		st, err := c.Status(context.Background(), name)
		return err == nil && len(st.Waiters) == n
	})
}

// A scripted run: one immediate grant, one wait granted after >= 100ms, a
// wait that runs out, one cancelled, one ended by Close, a multi-lock, and
// a lease lost to Close. The metrics and spans say exactly that.
func TestMetricsAndSpans(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c := r.client()
	mu := fairlock.Request{Name: "m", Capacity: 1, Permits: 1}

	// 1. Granted at once, held >= 50ms, released.
	l, err := c.Acquire(ctx, mu)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// 2. A wait granted after >= 100ms.
	held, err := c.Acquire(ctx, mu)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *fairlock.Lease)
	go func() {
		l, err := c.Acquire(ctx, mu)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waiting(t, c, "m", 1)
	r.observedWaiting(t, 1)
	// While it waits: one waiter and one holder on "m".
	m := r.metrics()
	if w, h := sums(t, m["fairlock.waiters"]), sums(t, m["fairlock.holders"]); w["fairlock.semaphore=m"] != 1 || h["fairlock.semaphore=m"] != 1 {
		t.Fatalf("during a wait: waiters %v, holders %v; want 1 and 1", w, h)
	}
	time.Sleep(100 * time.Millisecond)
	_ = held.Release(ctx)
	l = <-got

	// 3. A wait that runs out (l holds "m"), 4. one cancelled.
	dctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	if _, err := c.Acquire(dctx, mu); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a deadline: %v", err)
	}
	cancel()
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		waiting(t, c, "m", 1)
		r.observedWaiting(t, 1)
		cancel()
	}()
	if _, err := c.Acquire(cctx, mu); !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire cancelled: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// 5. A multi-lock, granted at once and released.
	ml, err := c.AcquireAll(ctx, fairlock.Request{Name: "y", Capacity: 1, Permits: 1}, fairlock.Request{Name: "x", Capacity: 2, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := ml.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// 6. A second client: its lease is lost when it closes, and its waiter
	// abandoned.
	c2 := r.client()
	lost, err := c2.Acquire(ctx, mu)
	if err != nil {
		t.Fatal(err)
	}
	closedWait := make(chan error)
	go func() {
		_, err := c2.Acquire(ctx, mu)
		closedWait <- err
	}()
	waiting(t, c, "m", 1)
	r.observedWaiting(t, 1)
	_ = c2.Close()
	if err := <-closedWait; !errors.Is(err, fairlock.ErrClosed) {
		t.Fatalf("wait ended by Close: %v", err)
	}
	<-lost.Done()

	m = r.metrics()
	acq := sums(t, m["fairlock.acquisitions"])
	wantAcq := map[string]int64{
		"fairlock.outcome=granted,fairlock.semaphore=m":                            4,
		"fairlock.outcome=granted,fairlock.semaphore=x,y":                          1,
		"fairlock.outcome=abandoned,fairlock.reason=deadline,fairlock.semaphore=m": 1,
		"fairlock.outcome=abandoned,fairlock.reason=canceled,fairlock.semaphore=m": 1,
		"fairlock.outcome=abandoned,fairlock.reason=closed,fairlock.semaphore=m":   1,
	}
	if !mapsEqual(acq, wantAcq) {
		t.Fatalf("fairlock.acquisitions = %v, want %v", acq, wantAcq)
	}
	if lostN := sums(t, m["fairlock.leases.lost"]); !mapsEqual(lostN, map[string]int64{"fairlock.reason=closed,fairlock.semaphore=m": 1}) {
		t.Fatalf("fairlock.leases.lost = %v", lostN)
	}
	for _, name := range []string{"fairlock.waiters", "fairlock.holders"} {
		for k, v := range sums(t, m[name]) {
			if v != 0 {
				t.Fatalf("%s{%s} = %d after every wait and lease ended, want 0", name, k, v)
			}
		}
	}
	if len(sums(t, m["fairlock.holders"])) != 2 {
		t.Fatalf("fairlock.holders series: %v, want m and x,y", sums(t, m["fairlock.holders"]))
	}

	wait := hists(t, m["fairlock.wait.duration"])
	g := wait["fairlock.outcome=granted,fairlock.semaphore=m"]
	// Three immediate grants (0) and one after >= 100ms.
	if g.Count != 4 || g.Sum < 0.1 || g.Sum > 5 || !defined(g.Min) || mustMin(g) != 0 {
		t.Fatalf("granted waits on m: count %d sum %v min %v", g.Count, g.Sum, g.Min)
	}
	a := wait["fairlock.outcome=abandoned,fairlock.semaphore=m"]
	if a.Count != 3 || a.Sum < 0.03 || a.Sum > 5 {
		t.Fatalf("abandoned waits on m: count %d sum %v", a.Count, a.Sum)
	}
	hold := hists(t, m["fairlock.hold.duration"])
	if h := hold["fairlock.outcome=released,fairlock.semaphore=m"]; h.Count != 3 || h.Sum < 0.05+0.1 || h.Sum > 5 {
		t.Fatalf("released holds on m: count %d sum %v", h.Count, h.Sum)
	}
	if h := hold["fairlock.outcome=lost,fairlock.semaphore=m"]; h.Count != 1 {
		t.Fatalf("lost holds on m: count %d", h.Count)
	}
	if h := hold["fairlock.outcome=released,fairlock.semaphore=x,y"]; h.Count != 1 {
		t.Fatalf("released holds on x,y: count %d", h.Count)
	}
	t.Logf("wait granted m: count %d sum %.3fs; abandoned: count %d sum %.3fs; hold released m: sum %.3fs",
		g.Count, g.Sum, a.Count, a.Sum, hold["fairlock.outcome=released,fairlock.semaphore=m"].Sum)

	// Spans: a wait span per queued request (4), a lease span per grant (5).
	type row struct{ name, sem, status, reason string }
	var rows []string
	var grantedWait sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		var rw row
		rw.name, rw.status = s.Name(), s.Status().Code.String()
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case fairlockotel.SemaphoreKey:
				rw.sem = kv.Value.AsString()
			case fairlockotel.ReasonKey:
				rw.reason = kv.Value.AsString()
			}
		}
		if s.Status().Code == codes.Error && s.Status().Description == "" {
			t.Fatalf("span %s: error status without a description", s.Name())
		}
		if rw.name == "fairlock.wait" && rw.status == "Unset" {
			grantedWait = s
		}
		rows = append(rows, fmt.Sprintf("%s %s %s %s", rw.name, rw.sem, rw.status, rw.reason))
	}
	sort.Strings(rows)
	want := []string{
		"fairlock.lease m Error closed",
		"fairlock.lease m Unset ",
		"fairlock.lease m Unset ",
		"fairlock.lease m Unset ",
		"fairlock.lease x,y Unset ",
		"fairlock.wait m Error canceled",
		"fairlock.wait m Error closed",
		"fairlock.wait m Error deadline",
		"fairlock.wait m Unset ",
	}
	if !slices.Equal(rows, want) {
		t.Fatalf("spans:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	if d := grantedWait.EndTime().Sub(grantedWait.StartTime()); d < 100*time.Millisecond {
		t.Fatalf("the granted wait's span lasted %v, want >= 100ms", d)
	}
	if n := len(r.spans.Started()) - len(r.spans.Ended()); n != 0 {
		t.Fatalf("%d spans never ended", n)
	}
}

func mustMin(dp metricdata.HistogramDataPoint[float64]) float64 {
	v, _ := dp.Min.Value()
	return v
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// WithoutNameAttribute leaves the name out: one series for all semaphores.
func TestWithoutNameAttribute(t *testing.T) {
	r := newRig(t, fairlockotel.WithoutNameAttribute())
	ctx := context.Background()
	c := r.client()
	for _, name := range []string{"a", "b", "c"} {
		l, err := c.Acquire(ctx, fairlock.Request{Name: name, Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Release(ctx)
	}
	m := r.metrics()
	if acq := sums(t, m["fairlock.acquisitions"]); !mapsEqual(acq, map[string]int64{"fairlock.outcome=granted": 3}) {
		t.Fatalf("fairlock.acquisitions = %v, want 3 granted without a name", acq)
	}
	if h := sums(t, m["fairlock.holders"]); !mapsEqual(h, map[string]int64{"": 0}) {
		t.Fatalf("fairlock.holders = %v", h)
	}
	for _, s := range r.spans.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == fairlockotel.SemaphoreKey {
				t.Fatalf("span %s has %v", s.Name(), kv)
			}
		}
	}
}

// Events the client can report out of the usual order, and the reasons of
// errors the client rarely produces, driven by hand: a lease lost before
// its grant is reported, a lease lost to Redis, a wait abandoned on a
// Redis error, a request queued twice.
func TestOddEvents(t *testing.T) {
	r := newRig(t)
	names := []string{"o"}
	redisErr := fmt.Errorf("fairlock: renew o: %w: not renewed in time: %w: i/o timeout", fairlock.ErrLeaseLost, fairlock.ErrRedis)
	for _, e := range []fairlock.Event{
		// ID 1: queued, queued again, lease lost before Granted is reported.
		{Kind: fairlock.WaitStarted, Names: names, ID: 1},
		{Kind: fairlock.WaitStarted, Names: names, ID: 1},
		{Kind: fairlock.LeaseRenewed, Names: names, ID: 1},
		{Kind: fairlock.LeaseLost, Names: names, ID: 1, Held: time.Second, Err: fmt.Errorf("fairlock: renew o: %w: expired", fairlock.ErrLeaseLost)},
		{Kind: fairlock.Granted, Names: names, ID: 1, Wait: 2 * time.Second},
		// ID 2: granted at once, lost to Redis.
		{Kind: fairlock.Granted, Names: names, ID: 2},
		{Kind: fairlock.LeaseLost, Names: names, ID: 2, Held: 3 * time.Second, Err: redisErr},
		// ID 3: abandoned on a Redis error.
		{Kind: fairlock.WaitStarted, Names: names, ID: 3},
		{Kind: fairlock.WaitAbandoned, Names: names, ID: 3, Wait: time.Second, Err: fmt.Errorf("fairlock: acquire o: %w: EOF", fairlock.ErrRedis)},
		// ID 4: a lease ending with no grant reported at all, then the
		// acquisition abandoned (the client reports an unconfirmed grant
		// as the wait abandoned alone; the observer copes either way).
		{Kind: fairlock.WaitStarted, Names: names, ID: 4},
		{Kind: fairlock.LeaseLost, Names: names, ID: 4, Err: errors.New("odd")},
		{Kind: fairlock.WaitAbandoned, Names: names, ID: 4, Err: errors.New("odd")},
	} {
		r.obs.Observe(e)
	}
	m := r.metrics()
	wantAcq := map[string]int64{
		"fairlock.outcome=granted,fairlock.semaphore=o":                         2,
		"fairlock.outcome=abandoned,fairlock.reason=redis,fairlock.semaphore=o": 1,
		"fairlock.outcome=abandoned,fairlock.reason=other,fairlock.semaphore=o": 1,
	}
	if acq := sums(t, m["fairlock.acquisitions"]); !mapsEqual(acq, wantAcq) {
		t.Fatalf("fairlock.acquisitions = %v, want %v", acq, wantAcq)
	}
	wantLost := map[string]int64{
		"fairlock.reason=expired,fairlock.semaphore=o": 1,
		"fairlock.reason=redis,fairlock.semaphore=o":   1,
		"fairlock.reason=other,fairlock.semaphore=o":   1,
	}
	if lost := sums(t, m["fairlock.leases.lost"]); !mapsEqual(lost, wantLost) {
		t.Fatalf("fairlock.leases.lost = %v, want %v", lost, wantLost)
	}
	for _, name := range []string{"fairlock.waiters", "fairlock.holders"} {
		if v := sums(t, m[name])["fairlock.semaphore=o"]; v != 0 {
			t.Fatalf("%s = %d, want 0", name, v)
		}
	}
	if n := len(r.spans.Started()) - len(r.spans.Ended()); n != 0 {
		t.Fatalf("%d spans never ended", n)
	}
	if h := hists(t, m["fairlock.hold.duration"])["fairlock.outcome=lost,fairlock.semaphore=o"]; h.Count != 3 || h.Sum != 4 {
		t.Fatalf("lost holds: count %d sum %v, want 3 and 4s", h.Count, h.Sum)
	}
}

// A contended run: 8 goroutines share a capacity-2 semaphore for 300
// acquisitions. Every count adds up; the gauges return to 0. The collected
// metrics are logged (go test -v) as an example of the exporter's output.
func TestContended(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c := r.client()
	const workers, each = 8, 40
	req := fairlock.Request{Name: "pool", Capacity: 2, Permits: 1}
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for range each {
				l, err := c.Acquire(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Millisecond)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	m := r.metrics()
	const total = workers * each
	if acq := sums(t, m["fairlock.acquisitions"]); !mapsEqual(acq, map[string]int64{"fairlock.outcome=granted,fairlock.semaphore=pool": total}) {
		t.Fatalf("fairlock.acquisitions = %v, want %d granted", acq, total)
	}
	hold := hists(t, m["fairlock.hold.duration"])["fairlock.outcome=released,fairlock.semaphore=pool"]
	wait := hists(t, m["fairlock.wait.duration"])["fairlock.outcome=granted,fairlock.semaphore=pool"]
	if hold.Count != total || wait.Count != total || hold.Sum < total*0.001 {
		t.Fatalf("hold count %d sum %v, wait count %d", hold.Count, hold.Sum, wait.Count)
	}
	for _, name := range []string{"fairlock.waiters", "fairlock.holders"} {
		if v := sums(t, m[name])["fairlock.semaphore=pool"]; v != 0 {
			t.Fatalf("%s = %d, want 0", name, v)
		}
	}
	waitSpans := 0
	for _, s := range r.spans.Ended() {
		if s.Name() == "fairlock.wait" {
			waitSpans++
		}
	}
	if n := len(r.spans.Started()) - len(r.spans.Ended()); n != 0 {
		t.Fatalf("%d spans never ended", n)
	}
	t.Logf("%d acquisitions by %d goroutines, capacity 2, 1ms hold, miniredis: %v; %d wait spans, %d lease spans",
		total, workers, elapsed.Round(time.Millisecond), waitSpans, len(r.spans.Ended())-waitSpans)
	t.Logf("fairlock.acquisitions %v", sums(t, m["fairlock.acquisitions"]))
	for _, h := range []struct {
		name string
		dp   metricdata.HistogramDataPoint[float64]
	}{{"fairlock.wait.duration", wait}, {"fairlock.hold.duration", hold}} {
		mn, _ := h.dp.Min.Value()
		mx, _ := h.dp.Max.Value()
		t.Logf("%s{pool} count=%d sum=%.3fs mean=%.2fms min=%.2fms max=%.2fms buckets %s", h.name, h.dp.Count, h.dp.Sum,
			1000*h.dp.Sum/float64(h.dp.Count), 1000*mn, 1000*mx, buckets(h.dp))
	}
	t.Logf("fairlock.waiters %v fairlock.holders %v", sums(t, m["fairlock.waiters"]), sums(t, m["fairlock.holders"]))
}

// buckets renders a histogram's non-empty buckets as "<=bound:count".
func buckets(dp metricdata.HistogramDataPoint[float64]) string {
	var out []string
	for i, n := range dp.BucketCounts {
		if n == 0 {
			continue
		}
		if i < len(dp.Bounds) {
			out = append(out, fmt.Sprintf("<=%gs:%d", dp.Bounds[i], n))
		} else {
			out = append(out, fmt.Sprintf(">%gs:%d", dp.Bounds[len(dp.Bounds)-1], n))
		}
	}
	return strings.Join(out, " ")
}

func defined(e metricdata.Extrema[float64]) bool {
	_, ok := e.Value()
	return ok
}

// The cost of one acquisition's events (granted at once, then released) in
// the observer with the SDK behind it; figures only.
func BenchmarkObserveGrantRelease(b *testing.B) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tp := sdktrace.NewTracerProvider()
	defer mp.Shutdown(context.Background())
	defer tp.Shutdown(context.Background())
	obs, err := fairlockotel.New(fairlockotel.WithMeterProvider(mp), fairlockotel.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	names, permits := []string{"bench"}, []int64{1}
	b.ReportAllocs()
	for i := range uint64(b.N) {
		obs.Observe(fairlock.Event{Kind: fairlock.Granted, Names: names, Permits: permits, ID: i + 1})
		obs.Observe(fairlock.Event{Kind: fairlock.LeaseReleased, Names: names, Permits: permits, Held: time.Millisecond, ID: i + 1})
	}
}
