package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/fairlock/fairlock/election"
)

// statusOut runs fairlock status with args and returns its output.
func (c *cli) statusOut(args ...string) string {
	c.t.Helper()
	var out bytes.Buffer
	cmd := c.cmd("status", args...)
	cmd.Stdout = &out
	if got := exit(c.t, cmd); got != 0 {
		c.t.Fatalf("status %v = %d", args, got)
	}
	return out.String()
}

func (c *cli) exists(file string) bool {
	_, err := os.Stat(filepath.Join(c.dir, file))
	return err == nil
}

// elect runs its command only while leading, candidates in arrival order;
// it exits with the command's status and resigns, so the next candidate
// leads at once; status shows the leader, with its term in FAIRLOCK_TOKEN.
func TestElect(t *testing.T) {
	c := newCLI(t)
	a := c.cmd("elect", "-value", "host-a", "sched", "--", "sh", "-c",
		`echo "$FAIRLOCK_TOKEN" > a.term; while [ ! -e a.stop ]; do sleep 0.02; done; exit 3`)
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	c.waitFor("a to lead", func() bool { return c.exists("a.term") })
	b := c.cmd("elect", "-value", "host-b", "sched", "--", "sh", "-c", `touch b.led`)
	if err := b.Start(); err != nil {
		t.Fatal(err)
	}
	c.waitFor("b to queue", func() bool { return len(c.status("sched").Waiters) == 1 })
	raw, _ := os.ReadFile(filepath.Join(c.dir, "a.term"))
	term, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		t.Fatalf("a's FAIRLOCK_TOKEN %q: %v", raw, err)
	}
	if out := c.statusOut("sched"); !strings.Contains(out, "leader host-a, term "+strconv.FormatInt(term, 10)) {
		t.Fatalf("status shows\n%s\nwant leader host-a with term %d", out, term)
	}
	var js []struct {
		Name   string         `json:"name"`
		Leader *election.Info `json:"leader"`
	}
	if err := json.Unmarshal([]byte(c.statusOut("-json", "sched")), &js); err != nil || len(js) != 1 ||
		js[0].Leader == nil || *js[0].Leader != (election.Info{Value: "host-a", Term: term}) {
		t.Fatalf("status -json: %+v, %v", js, err)
	}
	if c.exists("b.led") {
		t.Fatal("b ran its command while a led")
	}
	if err := os.WriteFile(filepath.Join(c.dir, "a.stop"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(); exitOf(err) != 3 {
		t.Fatalf("a exited with %v, want its command's status 3", err)
	}
	// a resigned before it exited: its lease is gone at once.
	for _, h := range c.status("sched").Holders {
		if h.Token == term {
			t.Fatal("a exited still holding its lease: it did not resign")
		}
	}
	if err := b.Wait(); err != nil || !c.exists("b.led") {
		t.Fatalf("b: %v, ran its command: %v", err, c.exists("b.led"))
	}
	if out := c.statusOut("sched"); strings.Contains(out, "leader") {
		t.Fatalf("status after both resigned shows\n%s", out)
	}
	if got := exit(t, c.cmd("elect", "-value", "", "{x}", "--", "true")); got != exitUsage {
		t.Fatalf("elect with a bad name = %d, want %d", got, exitUsage)
	}
	if got := exit(t, c.cmd("elect", "x", "true")); got != exitUsage {
		t.Fatalf("elect without -- = %d, want %d", got, exitUsage)
	}
}

// An elect paused past its lease stops its command when it resumes and
// exits 76; the successor's term is higher.
func TestElectLeadershipLost(t *testing.T) {
	c := newCLI(t)
	var stderr bytes.Buffer
	cmd := c.cmd("elect", "-ttl", "300ms", "-grace", "1s", "-value", "paused", "lost", "--", "sleep", "30")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e, err := election.New(c.lib, "lost")
	if err != nil {
		t.Fatal(err)
	}
	var old election.Info
	c.waitFor("elect to lead", func() bool {
		old, err = e.Leader(context.Background())
		return err == nil
	})
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	l, err := e.Campaign(context.Background(), "next")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Resign(context.Background())
	if l.Term() <= old.Term {
		t.Fatalf("successor's term %d <= paused leader's %d", l.Term(), old.Term)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitLeaseLost {
		t.Fatalf("paused elect exited with %v, want status %d; stderr: %s", err, exitLeaseLost, stderr.String())
	}
}
