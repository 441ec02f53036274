package redistest

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// childEnv marks a test binary started by RunWithoutRace, so that a child
// that was built with the race detector after all (GOFLAGS) fails rather
// than starting another.
const childEnv = "FAIRLOCK_NORACE_CHILD"

// RunWithoutRace runs the top-level test t again (the subtests of it that
// the parent's -run picks) in a test binary of the current package built
// without the race detector, and fails t if that fails. It is for tests
// whose cost is all in Lua and whose Go code other tests run under -race:
// the detector slows them several times over and finds nothing new. The
// child is built and run by the go command on PATH (go test started the
// parent, so it is there), with the flags given to the parent other than
// go test's; its output is logged under -v, and shown whole if it fails.
func RunWithoutRace(t *testing.T) {
	t.Helper()
	if os.Getenv(childEnv) != "" {
		t.Fatal("redistest: RunWithoutRace's child was built with -race (GOFLAGS?)")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("redistest: running %s without -race needs the go command: %v", t.Name(), err)
	}
	// The parent's -run may pick subtests (TestX/sub); the child runs
	// those of this test only.
	run := "^" + regexp.QuoteMeta(t.Name()) + "$"
	if f := flag.Lookup("test.run"); f != nil {
		if _, sub, ok := strings.Cut(f.Value.String(), "/"); ok {
			run += "/" + sub
		}
	}
	args := []string{"test", "-race=false", "-count=1", "-run", run}
	if d, ok := t.Deadline(); ok {
		// Leave the parent time to report a child that overruns.
		args = append(args, "-timeout", (time.Until(d) * 9 / 10).Truncate(time.Second).String())
	}
	if testing.Verbose() {
		args = append(args, "-v")
	}
	// The test's own flags given to the parent (rapid's, say), not go
	// test's.
	flag.Visit(func(f *flag.Flag) {
		if !strings.HasPrefix(f.Name, "test.") {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	cmd := exec.CommandContext(t.Context(), gobin, append(args, ".")...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	if err != nil {
		t.Fatalf("%s without -race (go %s .): %v after %v:\n%s", t.Name(), strings.Join(args, " "), err,
			time.Since(start).Round(time.Second), out.Bytes())
	}
	if testing.Verbose() {
		t.Log(out.String())
	}
	t.Logf("%s passed without -race in %v (go %s .)", t.Name(), time.Since(start).Round(time.Second), strings.Join(args, " "))
}
