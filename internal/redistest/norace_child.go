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

// RunWithoutRace runs the top-level test t again (the subtests of it that
// the parent's -run picks) in a test binary of the current package built
// without the race detector, and fails t if that fails. It is for tests
// whose cost is all in Lua and whose Go code other tests run under -race:
// the detector slows them several times over and finds nothing new.
//
// t is marked parallel: it runs once the package's serial tests are done,
// beside its other parallel tests (each child a process of its own, with
// a redis-server of its own), so that those children share the machine's
// cores. The binary is built once per process by the go command on PATH
// (go test started the parent, so it is there); a child gets the flags
// given to the parent other than go test's; its output is logged under
// -v, and shown whole if it fails.
func RunWithoutRace(t *testing.T) {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		t.Fatal("redistest: RunWithoutRace's child was built with -race (GOFLAGS?)")
	}
	t.Parallel()
	norace.once.Do(func() {
		gobin, err := exec.LookPath("go")
		if err != nil {
			norace.err = fmt.Errorf("running tests without -race needs the go command: %w", err)
			return
		}
		if norace.dir, norace.err = os.MkdirTemp("", "fairlock-norace-"); norace.err != nil {
			return
		}
		norace.path = filepath.Join(norace.dir, "norace.test")
		cmd := exec.Command(gobin, "test", "-c", "-race=false", "-o", norace.path, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			norace.err = fmt.Errorf("building the package's tests without -race: %v\n%s", err, out)
		}
	})
	if norace.err != nil {
		t.Fatalf("redistest: %s: %v", t.Name(), norace.err)
	}
	// The parent's -run may pick subtests (TestX/sub); the child runs
	// those of this test only.
	run := "^" + regexp.QuoteMeta(t.Name()) + "$"
	if f := flag.Lookup("test.run"); f != nil {
		if _, sub, ok := strings.Cut(f.Value.String(), "/"); ok {
			run += "/" + sub
		}
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
	if testing.Verbose() {
		t.Log(out.String())
	}
	t.Logf("%s passed without -race in %v (%s)", t.Name(), time.Since(start).Round(time.Second), strings.Join(args, " "))
}

// cleanupNorace removes the binary RunWithoutRace built (MainWith calls it
// once the tests have run).
func cleanupNorace() {
	if norace.dir != "" {
		os.RemoveAll(norace.dir)
	}
}
