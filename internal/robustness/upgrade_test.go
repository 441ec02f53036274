package robustness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// previousRelease is the commit of the build before this one's key
// layout: the last that keeps layout 2. A fleet is upgraded one process
// at a time, so the two share one Redis and the same names:
// TestRollingUpgrade runs them side by side. Move it forward when a build
// lands whose keys or scripts the next one must live beside
// (docs/reliability.md, "Upgrading a fleet").
const previousRelease = "da1ea8a5a7e1fd73ad9fa6cdb599bcedfcd229d3"

// buildPrevious builds this package's test binary from previousRelease
// (its own child code and fairlock's) into dir and returns its path. It
// needs git and the commit in the clone; without them the test fails in
// CI and is skipped elsewhere.
func buildPrevious(t *testing.T, dir string) string {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		missing("the previous release needs git and this repository's history: %v", err)
	}
	root := strings.TrimSpace(string(out))
	if err := exec.Command("git", "-C", root, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		missing("the previous release, commit %s, is not in this clone (a shallow one?): %v", previousRelease, err)
	}
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, previousRelease, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", previousRelease, err, out)
	}
	bin := filepath.Join(dir, "previous.test")
	build := exec.Command("go", "test", "-c", "-o", bin, "./internal/robustness")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off")
	start := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the previous release's test binary: %v\n%s", err, out)
	}
	t.Logf("the previous release (%s) built in %v", previousRelease[:12], time.Since(start).Round(100*time.Millisecond))
	return bin
}

// TestRollingUpgrade runs the traffic with two children on the previous
// release and one on this build, on the same semaphores, mutex,
// read-write mutex and multi-lock, fault-free and under the faults a
// rolling upgrade meets: connections cut (go-redis resends calls whose
// reply it lost), and a process of either release paused past its lease.
// The promises are those of one release: the history is linearizable, no
// update is lost, at most capacity is held, tokens increase. The previous
// release keeps another key layout, so each semaphore is held by the
// release that created its keys and the other's calls on it are refused.
func TestRollingUpgrade(t *testing.T) {
	redistest.Long(t)
	older := buildPrevious(t, t.TempDir())
	for _, tc := range []struct {
		scenario
		allowed []string
	}{
		{scenario: scenario{name: "mixed releases, no fault", promise: promiseKept}},
		{scenario: scenario{name: "mixed releases, proxy cut 1.5s, all clients", promise: promiseBounded, hold: 1500 * time.Millisecond,
			fault: func(t *testing.T, e *env) func() { return all(e, (*Proxy).Cut) }}},
		// The previous release's Lease.Err could read a lease live just
		// after its process resumed, while the lease's renewal timer was
		// ending it (CHANGELOG, Fixed): its paused child may show that,
		// and only that.
		{scenario: scenario{name: "mixed releases, the previous release's client SIGSTOP 1.5s (lease 1s)", promise: promisePaused, hold: 1500 * time.Millisecond,
			fault: func(t *testing.T, e *env) func() { return e.stop(t, 0) }}, allowed: []string{resumedLive}},
		{scenario: scenario{name: "mixed releases, this release's client SIGSTOP 1.5s (lease 1s)", promise: promisePaused, hold: 1500 * time.Millisecond,
			fault: func(t *testing.T, e *env) func() { return e.stop(t, 1) }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := tc.scenario
			sc.older, sc.otherLayout = older, true
			res := run(t, sc)
			// The previous build keeps key layout 2, this one layout 3:
			// a semaphore is held by the build that created its keys, and
			// the other's calls on it are refused (docs/reliability.md,
			// "Upgrading a fleet"). A child that took no lease was refused
			// as another layout's (ErrIncompatible, which both builds
			// class so).
			if (res.ByChild[0] == 0 || res.ByChild[1] == 0 || res.ByChild[2] == 0) && res.ErrorKinds["acquire incompatible"] == 0 {
				t.Errorf("a child took no lease, and none of the calls was refused as another layout's: %v", res.ErrorKinds)
			}
			t.Logf("leases by child (0 and 2: the previous release): %v; errors %v", res.ByChild, res.ErrorKinds)
			for _, v := range res.Violations {
				if anyPart(v, tc.allowed) {
					t.Logf("allowed (the previous release's own): %s", v)
				} else {
					t.Error(v)
				}
			}
			if res.Acquired == 0 || res.StoreOps == 0 {
				t.Errorf("no traffic: %d leases, %d store calls", res.Acquired, res.StoreOps)
			}
		})
	}
}
