package main

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/redis/go-redis/v9"
)

func TestQuantile(t *testing.T) {
	ds := []time.Duration{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5}, {0.99, 10}, {0.1, 1}, {1, 10}} {
		if got := quantile(ds, tc.q); got != tc.want {
			t.Errorf("quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing is not 0")
	}
}

func TestJain(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{{[]float64{3, 3, 3, 3}, 1}, {[]float64{4, 0, 0, 0}, 0.25}, {[]float64{1, 3}, 0.8}} {
		if got := jain(tc.xs); got < tc.want-1e-9 || got > tc.want+1e-9 {
			t.Errorf("jain(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}

func TestKendallDistance(t *testing.T) {
	for _, tc := range []struct {
		order []int
		want  int
	}{{[]int{0, 1, 2, 3}, 0}, {[]int{3, 2, 1, 0}, 6}, {[]int{1, 0, 2, 3}, 1}, {[]int{0, 3, 1, 2}, 2}} {
		if got := kendallDistance(tc.order); got != tc.want {
			t.Errorf("kendallDistance(%v) = %d, want %d", tc.order, got, tc.want)
		}
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-scenarios", "nope"},
		{"-duration", "-1s"},
		{"-impls", "zookeeper"},
		{"-max-queue", "9"},
		{"extra"},
		// Client-side caching: not on the embedded miniredis.
		{"-impls", "rueidislock", "-scenarios", "uncontended"},
	} {
		if err := run(args, io.Discard, io.Discard); err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
}

// The smoke run: every scenario, every implementation, briefly, on the
// embedded Redis, checked through the JSON report.
func TestSmokeEveryScenario(t *testing.T) {
	// This run of the whole harness and TestAutoBackend's mostly wait: on
	// their drains' limits, their wake-ups, their servers. Each has its
	// own server, and neither judges a time: they run side by side.
	// (TestOtherClientsPeers judges its drain by a time limit: it runs
	// alone, before them.)
	t.Parallel()
	svgDir := filepath.Join(t.TempDir(), "img")
	// Its drains stop at drainStop, as the other tests' do: at the bench's
	// own 1 s, a drain of 1,000 waiters under the race detector beside the
	// other packages' tests had not begun (0 drained, through the rueidis
	// and valkey-go adapters).
	rep, report := runJSON(t, "-duration", "60ms", "-drain-stop", drainStop.String(), "-max-queue", "100", "-svg", svgDir)
	checkFigures(t, rep, report, svgDir)
	var names []string
	for _, s := range rep.Scenarios {
		if s.Name == "summary" {
			// The front page's table comes first, drawn from the others:
			// a row per measure the run took.
			if rep.Scenarios[0] != s || len(s.Rows) < 8 {
				t.Errorf("summary: first %v, %d rows; want the first table with at least 8 rows", rep.Scenarios[0] == s, len(s.Rows))
			}
			continue
		}
		names = append(names, s.Name)
		// The floor needs functions, which miniredis lacks: no rows, a
		// note saying so.
		if s.Name == "floor" {
			if len(s.Rows) != 0 || !strings.Contains(s.Note, "-redis auto") {
				t.Errorf("floor on miniredis: %d rows, note %q; want none, and a note naming -redis auto", len(s.Rows), s.Note)
			}
			continue
		}
		if len(s.Rows) == 0 || len(s.Rows) != len(s.Data) {
			t.Errorf("scenario %s: %d rows, %d data", s.Name, len(s.Rows), len(s.Data))
		}
		for _, d := range s.Data {
			// Locks that never expire must never overlap, whoever made them.
			for _, k := range []string{"overlaps", "exceeded"} {
				if v, ok := d[k]; ok && v.(float64) != 0 {
					t.Errorf("scenario %s, %v: %s = %v", s.Name, d["impl"], k, v)
				}
			}
			// fairlock is FIFO on every client it runs on.
			if im, _ := d["impl"].(string); s.Name == "fifo" && strings.HasPrefix(im, "fairlock") && d["inversions"].(float64) != 0 {
				t.Errorf("fairlock granted out of order: %v", d)
			}
			// How many drain in the time limit is speed, not function (the
			// semaphore package's tests check that all are granted).
			if s.Name == "drain" && d["drained"].(float64) <= 0 {
				t.Errorf("nothing drained: %v", d)
			}
			// miniredis has no INFO cpu: no CPU figure may be made up.
			if _, ok := d["redis_cpu_us_per_cycle"]; ok {
				t.Errorf("scenario %s: a Redis CPU figure on miniredis: %v", s.Name, d)
			}
			if strings.HasPrefix(s.Name, "contended") && (d["starved"] == nil || d["jain"] == nil) {
				t.Errorf("scenario %s without starved or Jain: %v", s.Name, d)
			}
			// The queue was as long as the row says, by fairlock's Status.
			if s.Name == "queue" && d["queued"] != d["waiters"] {
				t.Errorf("queue row for %v waiters saw %v queued", d["waiters"], d["queued"])
			}
		}
	}
	if got := tableOf(rep, "queue"); got == nil || len(got.Rows) != 2 {
		t.Errorf("queue scenario with -max-queue 100: want sizes 10 and 100, got %v", got)
	}
	if u := tableOf(rep, "uncontended"); u == nil || !strings.Contains(strings.Join(u.Rows[0], "|"), "n/a (embedded)") {
		t.Errorf("uncontended on miniredis does not say n/a (embedded): %v", u)
	}
	if !slices.Equal(names, allScenarios) {
		t.Errorf("scenarios %v, want %v", names, allScenarios)
	}
	if len(rep.Meta["run id"]) != 8 {
		t.Errorf("run id %q: want the run's 8-character id", rep.Meta["run id"])
	}
	if !strings.HasPrefix(rep.Meta["backend"], "miniredis") {
		t.Errorf("backend %q", rep.Meta["backend"])
	}
	if len(rep.Targets) == 0 {
		t.Error("no targets reported")
	}
	// A newcomer's first run says what it measures: timing targets are
	// not judged on miniredis, and none of them reads "no".
	var md strings.Builder
	if err := run([]string{"-duration", "60ms", "-max-queue", "100", "-scenarios", "uncontended,fifo"}, &md, io.Discard); err != nil {
		t.Fatal(err)
	}
	out := md.String()
	if !strings.Contains(out[:min(len(out), 600)], "-redis auto") {
		t.Errorf("the report's top does not say how to get a real server:\n%s", out[:min(len(out), 600)])
	}
	judged := 0
	for _, line := range strings.Split(out, "\n") {
		for _, tg := range rep.Targets {
			if tg.Timing && strings.Contains(line, "| "+tg.What+" |") {
				judged++
				if !strings.HasSuffix(line, "| not judged (miniredis) |") {
					t.Errorf("timing target judged on miniredis: %s", line)
				}
			}
		}
	}
	if judged == 0 {
		t.Errorf("no timing target in the report:\n%s", out)
	}
}

// -redis auto starts a redis-server from PATH (CI must have one).
func TestAutoBackend(t *testing.T) {
	t.Parallel() // beside TestSmokeEveryScenario: see there
	if testing.Short() {
		t.Skip("long: a real server's run for seconds; runs in the full suite (without -short)")
	}
	if _, err := redisserver.Binary("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no redis-server: %v", err)
		}
		t.Skip(err)
	}
	rep, _ := runJSON(t, "-redis", "auto", "-duration", "60ms", "-drain-stop", drainStop.String(), "-scenarios", "uncontended,handoff,fifo,drain,queue,scale,wake", "-impls", "fairlock,setnx", "-max-queue", "100")
	if !strings.HasPrefix(rep.Meta["backend"], "redis-server started on 127.0.0.1:") || rep.Meta["redis_version"] == "" {
		t.Errorf("meta %v", rep.Meta)
	}
	// The header names the server that ran, as its program names itself.
	want, err := redisserver.Which()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Meta["server"] != want.String() {
		t.Errorf("header names server %q, want %q", rep.Meta["server"], want)
	}
	t.Logf("server: %s", rep.Meta["server"])
	for _, s := range rep.Scenarios {
		if s.Name == "uncontended" {
			for _, d := range s.Data {
				// A real server reports its CPU; SET NX's is the unit.
				cpu, _ := d["redis_cpu_us_per_cycle"].(float64)
				calls, _ := d["server_cmds_per_cycle"].(float64)
				if cpu <= 0 || calls < 2 || d["redis_cpu_per_setnx"] == nil {
					t.Errorf("uncontended without Redis CPU figures: %v", d)
				}
				t.Logf("%v: %.1f µs of Redis CPU and %.2f server commands per acquire+release", d["impl"], cpu, calls)
			}
		}
		if s.Name == "drain" {
			for _, d := range s.Data {
				// A real server reports its connections and commands.
				if d["server_cmds"].(float64) <= 0 || d["peak_connections"].(float64) <= 0 || d["redis_cpu_us_per_acq"] == nil {
					t.Errorf("drain without server figures: %v", d)
				}
			}
		}
		// The handoff's release call beside the best peer's, and Redis's
		// cost per handoff.
		if s.Name == "handoff" {
			for _, d := range s.Data {
				if d["release_call_p50_us"] == nil || d["release_call_per_best_peer"] == nil || d["server_cmds_per_handoff"] == nil || d["redis_cpu_us_per_handoff"] == nil {
					t.Errorf("handoff without the release call's figures or Redis's cost: %v", d)
				}
			}
		}
		// At scale and over many names: Redis CPU, commands, memory and
		// connections per implementation.
		if s.Name == "scale" || s.Name == "wake" {
			for _, d := range s.Data {
				cpu, _ := d["redis_cpu_us_per_acq"].(float64)
				if cpu <= 0 || d["server_cmds"].(float64) <= 0 || d["peak_connections"].(float64) <= 0 {
					t.Errorf("%s without Redis CPU, commands or connections: %v", s.Name, d)
				}
				if s.Name == "scale" && d["used_memory_delta"] == nil {
					t.Errorf("scale without used_memory: %v", d)
				}
				// fairlock's listener's blocking reads are seen, and Redis's
				// time for them.
				if s.Name == "wake" && d["impl"] == "fairlock" && (d["blocking_read_keys_mean"] == nil || d["blocking_reads"].(float64) <= 0) {
					t.Errorf("wake without fairlock's blocking reads: %v", d)
				}
			}
		}
		if s.Name == "wake-read" && len(s.Rows) != len(bareBLPOPKeys) {
			t.Errorf("the bare blocking read: %d rows, want %d", len(s.Rows), len(bareBLPOPKeys))
		}
	}
}

// drainStop is how long the tests' drains wait for their 1,000 waiters:
// far below the locks' TTL (leaseTTL), so a drain that ends by it was
// woken, not left to the TTL; and far above the bench's own stop (1 s),
// which a drain under the race detector on two busy cores can pass (876
// of 1,000 drained at 1 s beside two busy loops), as can a rueidislock or
// valkeylock waiter whose wake-up was lost (999 of 1,000: its wait begins
// again after rewaitAfter, 1 s).
const drainStop = 5 * time.Second

// The peers on rueidis and valkey-go run every scenario on a real server:
// their locks exclude (no overlap), their commands are counted through
// their own clients, and a waiter is woken (drain, wake), not left to its
// lock's TTL.
func TestOtherClientsPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a real server's run for seconds; runs in the full suite (without -short)")
	}
	if _, err := redisserver.Binary("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no redis-server: %v", err)
		}
		t.Skip(err)
	}
	rep, _ := runJSON(t, "-redis", "auto", "-duration", "100ms", "-drain-stop", drainStop.String(), "-scenarios", "uncontended,handoff,contended,drain,dining,wake", "-impls", "rueidislock,valkeylock,fairlock-rueidis,fairlock-valkey", "-max-queue", "100")
	seen := map[string]bool{}
	for _, s := range rep.Scenarios {
		for _, d := range s.Data {
			im, _ := d["impl"].(string)
			seen[s.Name+" "+im] = true
			if o, ok := d["overlaps"].(float64); ok && o != 0 {
				t.Errorf("%s, %s: %v overlaps", s.Name, im, o)
			}
			if c, ok := d["client_cmds"].(float64); ok && c <= 0 {
				t.Errorf("%s, %s: %v client commands counted", s.Name, im, c)
			}
			if s.Name == "drain" && d["drained"] != nil && d["drained"] != d["waiters"] {
				t.Errorf("drain, %s: %v", im, d)
			}
		}
	}
	for _, sc := range []string{"uncontended", "handoff", "contended", "drain", "wake"} {
		for _, im := range []string{"rueidislock", "valkeylock", "fairlock-rueidis", "fairlock-valkey"} {
			if !seen[sc+" "+im] {
				t.Errorf("%s has no row of %s", sc, im)
			}
		}
	}
}

func tableOf(rep Report, name string) *Table {
	for _, s := range rep.Scenarios {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// INFO cpu: the main thread's figures where the server has them, the
// process's otherwise, nothing from a reply without either.
func TestParseCPU(t *testing.T) {
	redis7 := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:0.000000\r\n" +
		"used_cpu_user_children:0.000000\r\nused_cpu_sys_main_thread:0.750000\r\nused_cpu_user_main_thread:1.125000\r\n"
	redis6 := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:0.010000\r\nused_cpu_user_children:0.020000\r\n"
	for _, tc := range []struct {
		name, info string
		want       cpuTime
		ok         bool
	}{
		{"main thread", redis7, cpuTime{seconds: 1.875, mainThread: true}, true},
		{"process", redis6, cpuTime{seconds: 3.75}, true},
		{"one main-thread field", redis6 + "used_cpu_user_main_thread:1.0\r\n", cpuTime{seconds: 3.75}, true},
		{"embedded", "# Clients\r\nconnected_clients:3\r\n", cpuTime{}, false},
		{"not a number", "used_cpu_sys:x\r\nused_cpu_user:1\r\n", cpuTime{}, false},
		{"empty", "", cpuTime{}, false},
	} {
		got, ok := parseCPU(tc.info)
		if ok != tc.ok || got.mainThread != tc.want.mainThread || math.Abs(got.seconds-tc.want.seconds) > 1e-9 {
			t.Errorf("%s: parseCPU = %+v, %v; want %+v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

func runJSON(t *testing.T, args ...string) (Report, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "bench.json")
	var out strings.Builder
	if err := run(append(args, "-json", file), &out, io.Discard); err != nil {
		t.Fatalf("run: %v", err)
	}
	if !strings.Contains(out.String(), "| implementation |") {
		t.Errorf("no markdown table in the output:\n%s", out.String())
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, out.String()
}

// checkFigures checks that every table that draws has its figures in dir,
// each well-formed SVG with a title and its text, and linked from the
// report.
func checkFigures(t *testing.T, rep Report, md, dir string) {
	t.Helper()
	want := map[string][]string{
		"uncontended": {"uncontended"}, "handoff": {"handoff"}, "drain": {"drain"}, "semaphore": {"semaphore"},
		"dining": {"dining"}, "queue": {"queue"}, "scale": {"scale"}, "wake": {"wake"},
		"contended": {"contended-n4", "contended-n16", "contended-n64"}, "contended-100us": {"contended-100us-n16", "contended-100us-n64"},
	}
	for _, s := range rep.Scenarios {
		for _, name := range want[s.Name] {
			file := filepath.Join(dir, name+".svg")
			b, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("scenario %s: %v", s.Name, err)
				continue
			}
			checkSVG(t, name, b)
			if link := "](" + filepath.ToSlash(file) + ")"; !strings.Contains(md, link) {
				t.Errorf("the report does not link %s", file)
			}
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, names := range want {
		n += len(names)
	}
	if len(entries) != n {
		t.Errorf("%d files in %s, want %d", len(entries), dir, n)
	}
}

// checkSVG decodes b as XML: an svg root with a size, a title and some
// text, and nothing that is not well-formed.
func checkSVG(t *testing.T, name string, b []byte) {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(string(b)))
	depth, root, titled, texts, paths := 0, "", false, 0, 0
	inTitle := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Errorf("%s.svg is not well-formed XML: %v", name, err)
			return
		}
		switch x := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				root = x.Name.Local
				size := 0
				for _, a := range x.Attr {
					if a.Name.Local == "width" || a.Name.Local == "height" || a.Name.Local == "viewBox" {
						size++
					}
				}
				if x.Name.Space != "http://www.w3.org/2000/svg" || size != 3 {
					t.Errorf("%s.svg: root %v without the SVG namespace, width, height and viewBox", name, x.Name)
				}
			}
			inTitle = depth == 1 && x.Name.Local == "title"
			switch x.Name.Local {
			case "text":
				texts++
			case "path", "rect":
				paths++
			}
			depth++
		case xml.EndElement:
			depth--
			inTitle = false
		case xml.CharData:
			if inTitle && strings.TrimSpace(string(x)) != "" {
				titled = true
			}
		}
	}
	if root != "svg" || !titled || texts < 5 || paths < 2 {
		t.Errorf("%s.svg: root %q, title %v, %d texts, %d paths and rects", name, root, titled, texts, paths)
	}
}

// Text that XML must escape stays text.
func TestFigureEscapes(t *testing.T) {
	hostile := `a < b & "c" > 'd'`
	fg := &figure{name: "x", title: hostile, subtitle: hostile, cols: 2, legend: []string{hostile, "fairlock"},
		panels: []*panel{
			{title: hostile, x: axis{label: hostile, log: true, format: durUS}, y: axis{label: hostile, min: 0, max: 1},
				lines: []series{cdf(hostile, []float64{3, 40, 500, 6000})}, vlines: []marker{{50, hostile}}},
			{title: hostile, x: axis{label: hostile}, y: axis{label: hostile, zero: true},
				bars: &bars{groups: []string{hostile, "b"}, series: []string{"fairlock", hostile}, vals: [][]float64{{1, 0}, {2, math.NaN()}}, labels: true, zeroMark: true}},
			{title: hostile, empty: hostile},
		}}
	checkSVG(t, "escapes", fg.svg())
	if strings.Count(string(fg.svg()), "a &lt; b &amp; &quot;c&quot; &gt; &#39;d&#39;") < 8 {
		t.Errorf("the hostile text is not in the figure, escaped, in every place:\n%s", fg.svg())
	}
}

func TestScales(t *testing.T) {
	s := newScale(axis{log: true}, []float64{3, 4000, math.NaN(), -1}, 0, 100)
	if !slices.Equal(s.ticks, []float64{1, 10, 100, 1000, 10000}) || s.px(1) != 0 || s.px(10000) != 100 || s.px(100) != 50 {
		t.Errorf("log scale of 3..4000: ticks %v, px(1) %v, px(100) %v, px(10000) %v", s.ticks, s.px(1), s.px(100), s.px(10000))
	}
	s = newScale(axis{zero: true}, []float64{1203, 8558}, 100, 0)
	if s.lo != 0 || s.hi != 10000 || s.ticks[1] != 2000 || s.px(0) != 100 || s.px(10000) != 0 {
		t.Errorf("linear scale of 1203..8558 from zero: %v..%v, ticks %v", s.lo, s.hi, s.ticks)
	}
	if s := newScale(axis{}, nil, 0, 1); s.ok {
		t.Error("a scale of nothing is drawn")
	}
	for _, tc := range []struct {
		v    float64
		want string
	}{{8558, "8,558"}, {39.27, "39.3"}, {0.421, "0.42"}, {123456, "123k"}, {0, "0"}, {2.5e6, "2.5M"}} {
		if got := compact(tc.v); got != tc.want {
			t.Errorf("compact(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
	for _, tc := range []struct {
		v    float64
		want string
	}{{50, "50 µs"}, {2000, "2 ms"}, {1e6, "1 s"}, {250, "250 µs"}} {
		if got := durUS(tc.v); got != tc.want {
			t.Errorf("durUS(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// A CDF climbs from 0 to 1 over the samples, at most 300 points.
func TestCDF(t *testing.T) {
	var xs []float64
	for i := range 5000 {
		xs = append(xs, float64(5000-i))
	}
	c := cdf("x", xs)
	first, last := c.pts[0], c.pts[len(c.pts)-1]
	if first != (pt{1, 0}) || last != (pt{5000, 1}) || len(c.pts) > 301 {
		t.Errorf("cdf: first %v, last %v, %d points", first, last, len(c.pts))
	}
	for i := 1; i < len(c.pts); i++ {
		if c.pts[i].x < c.pts[i-1].x || c.pts[i].y < c.pts[i-1].y {
			t.Fatalf("cdf goes back at %d: %v, %v", i, c.pts[i-1], c.pts[i])
		}
	}
}

// A rueidislock or valkeylock wait whose wake-up is lost begins again
// after rewaitAfter rather than hanging the run; a lock taken lasts until
// unlock, and the caller's context still bounds the wait.
func TestLockUntilUnlockBeginsALostWaitAgain(t *testing.T) {
	attempts := 0
	var held context.Context
	take := func(ctx context.Context) (func(), error) {
		attempts++
		if attempts == 1 {
			<-ctx.Done() // a wake-up that never comes
			return nil, ctx.Err()
		}
		held = ctx
		return func() {}, nil
	}
	start := time.Now()
	unlock, err := lockUntilUnlock(context.Background(), take)
	if err != nil || attempts != 2 {
		t.Fatalf("lockUntilUnlock: %v after %d attempts", err, attempts)
	}
	if d := time.Since(start); d < rewaitAfter || d > 3*rewaitAfter {
		t.Errorf("taken after %v; want about %v", d, rewaitAfter)
	}
	time.Sleep(rewaitAfter + 100*time.Millisecond)
	if held.Err() != nil {
		t.Fatalf("the lock's context ended before unlock: %v", held.Err())
	}
	_ = unlock(context.Background())
	if held.Err() == nil {
		t.Error("the lock's context lives on after unlock")
	}
	// The caller's context ends a wait that never wakes.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	never := func(ctx context.Context) (func(), error) { <-ctx.Done(); return nil, ctx.Err() }
	if _, err := lockUntilUnlock(ctx, never); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a wait past its context: %v", err)
	}
}

// A figure that could not be measured (NaN) or a ratio to zero (an
// infinity) leaves the JSON report valid: null in its place. (The smoke
// run failed with "json: unsupported value: NaN" on a busy machine.)
func TestJSONReportHoldsUnmeasuredFigures(t *testing.T) {
	rep := &Report{Scenarios: []*Table{{Name: "x", Data: []map[string]any{
		{"impl": "fairlock", "cpu": math.NaN(), "ratio": math.Inf(1), "low": math.Inf(-1), "ok": 1.5},
	}}}}
	jsonSafe(rep)
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	d := back.Scenarios[0].Data[0]
	if d["cpu"] != nil || d["ratio"] != nil || d["low"] != nil || d["ok"] != 1.5 || d["impl"] != "fairlock" {
		t.Errorf("after the round trip: %v", d)
	}
}

// The clock watch reports a step of Redis's clock against the harness's,
// and nothing for a clock that keeps pace within the readings' round
// trips.
func TestClockWatchSeesAStep(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	w := watchClock(rdb, 10*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	if s := w.report(); s != "" {
		t.Fatalf("a clock that keeps pace: %s", s)
	}
	m.SetTime(time.Now().Add(5 * time.Second))
	time.Sleep(100 * time.Millisecond)
	s := w.end()
	// (miniredis then holds its clock still: the readings that follow
	// fall behind by one period each, far less than a step.)
	w.mu.Lock()
	steps := w.steps
	w.mu.Unlock()
	if len(steps) != 1 || steps[0].by < 4900*time.Millisecond || steps[0].by > 5100*time.Millisecond || !strings.Contains(s, "stepped") {
		t.Errorf("Redis's clock set 5 s ahead: the watch saw %v and says %q", steps, s)
	}
}
