package redistest

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// childEnv marks a test binary started by RunWithoutRace, so that a child
// that was built with the race detector after all (GOFLAGS) fails rather
// than starting another.
const childEnv = "FAIRLOCK_NORACE_CHILD"

// The package's test binary without the race detector, built once per
// process for every RunWithoutRace of it.
var norace struct {
	once      sync.Once
	dir, path string
	err       error
}

// RunWithoutRace runs the test or subtest t again (the subtests of it
// that the parent's -run picks) in a test binary of the current package built
// without the race detector, and fails t if that fails. It is for tests
// whose cost is all in Lua and whose Go code other tests run under -race:
// the detector slows them several times over and finds nothing new.
//
// t is marked parallel: a test runs once the package's serial tests are
// done, beside its other parallel tests (each child a process of its own,
// with a redis-server of its own), so that those children share the
// machine's cores; a subtest once its parent's function has returned. The
// binary is built once per process (from the start with
// BuildWithoutRaceEarly) by the go command on PATH (go test started the
// parent, so it is there); a child gets the flags
// given to the parent other than go test's; its output is logged under
// -v, and shown whole if it fails.
func RunWithoutRace(t *testing.T) {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		t.Fatal("redistest: RunWithoutRace's child was built with -race (GOFLAGS?)")
	}
	t.Parallel()
	norace.once.Do(buildNorace)
	if norace.err != nil {
		t.Fatalf("redistest: %s: %v", t.Name(), norace.err)
	}
	// The parent's -run may pick subtests below t (TestX/sub/...); the
	// child runs those of t only.
	run := childRun(t.Name(), "")
	if f := flag.Lookup("test.run"); f != nil {
		run = childRun(t.Name(), f.Value.String())
	}
	args := []string{"-test.run=" + run}
	if d, ok := t.Deadline(); ok {
		// Leave the parent time to report a child that overruns.
		args = append(args, "-test.timeout="+(time.Until(d)*9/10).Truncate(time.Second).String())
	}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	// The test's own flags given to the parent (rapid's, say), not go
	// test's.
	flag.Visit(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Name, "test.") {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	cmd := exec.CommandContext(t.Context(), norace.path, args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s without -race (%s): %v after %v:\n%s", t.Name(), strings.Join(args, " "), err,
			time.Since(start).Round(time.Second), out.Bytes())
	}
	if bytes.Contains(out.Bytes(), []byte("no tests to run")) {
		t.Fatalf("%s without -race (%s) ran no test:\n%s", t.Name(), strings.Join(args, " "), out.Bytes())
	}
	if testing.Verbose() {
		t.Log(out.String())
	}
	t.Logf("%s passed without -race in %v (%s)", t.Name(), time.Since(start).Round(time.Second), strings.Join(args, " "))
}

// cleanupNorace removes the binary RunWithoutRace built (MainWith calls it
// once the tests have run).
func cleanupNorace() {
	norace.once.Do(func() {}) // waits for a build BuildWithoutRaceEarly began
	if norace.dir != "" {
		os.RemoveAll(norace.dir)
	}
}

// childRun is the -test.run pattern that picks the test or subtest name
// (as t.Name gives it) and, of the parent's pattern run, the elements
// that go below it: TestX/a with run "TestX/a/b" gives ^TestX$/^a$/b.
func childRun(name, run string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	if run != "" {
		if below := strings.Split(run, "/"); len(below) > len(parts) {
			parts = append(parts, below[len(parts):]...)
		}
	}
	return strings.Join(parts, "/")
}

// OffRace runs t in the package's test binary built without the race
// detector (RunWithoutRace) and reports true when this binary has the
// detector and the run is not -short; the caller then returns. It is for
// a test whose cost is Lua or pure computation that the detector only
// slows (miniredis interprets Lua in Go: under -race, several times
// slower than a real server), while the Go code it calls runs under the
// detector elsewhere: in the test's real-server half, or in other tests.
// With -short it reports false: the quick tier's smaller sizes run here.
func OffRace(t *testing.T) bool {
	t.Helper()
	if !Race || testing.Short() {
		return false
	}
	RunWithoutRace(t)
	return true
}

// EachOffRace is Each for a test whose miniredis half is the cost
// OffRace is for: that half runs without the race detector (outside
// -short), the real server's half under it.
func EachOffRace(t *testing.T, f func(t *testing.T, b *Backend)) {
	t.Helper()
	t.Run("miniredis", func(t *testing.T) {
		skipMini(t)
		if OffRace(t) {
			return
		}
		f(t, Mini(t))
	})
	t.Run("redis", func(t *testing.T) {
		f(t, RealBackend(t))
	})
}

// BuildWithoutRaceEarly starts building, in the background, the binary
// that RunWithoutRace runs, when this binary has the race detector and runs
// the whole package's long tier (no -short, no -run): RunWithoutRace's
// tests run once the serial tests are done, and would otherwise wait for
// the build then, minutes into the run. The build runs at a lower CPU
// priority where nice(1) is found. Call it from TestMain after
// flag.Parse.
func BuildWithoutRaceEarly() {
	if !Race || testing.Short() || os.Getenv(childEnv) != "" {
		return
	}
	if f := flag.Lookup("test.run"); f == nil || f.Value.String() != "" {
		return
	}
	go norace.once.Do(buildNorace)
}

// buildNorace builds the package's test binary without the race detector
// into a temporary directory (norace.path), or sets norace.err.
func buildNorace() {
	gobin, err := exec.LookPath("go")
	if err != nil {
		norace.err = fmt.Errorf("running tests without -race needs the go command: %w", err)
		return
	}
	if norace.dir, norace.err = os.MkdirTemp("", "fairlock-norace-"); norace.err != nil {
		return
	}
	norace.path = filepath.Join(norace.dir, "norace.test")
	args := []string{gobin, "test", "-c", "-race=false", "-o", norace.path, "."}
	if nice, err := exec.LookPath("nice"); err == nil {
		args = append([]string{nice, "-n", "10"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	if out, err := cmd.CombinedOutput(); err != nil {
		norace.err = fmt.Errorf("building the package's tests without -race: %v\n%s", err, out)
	}
}
