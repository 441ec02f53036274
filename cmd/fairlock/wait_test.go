package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/redisserver"
)

// lines collects a running command's stderr, line by line.
type lines struct {
	mu   sync.Mutex
	all  []string
	done chan struct{}
}

// stderrLines starts cmd with its stderr collected.
func stderrLines(t *testing.T, cmd *exec.Cmd) *lines {
	t.Helper()
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	l := &lines{done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			l.mu.Lock()
			l.all = append(l.all, sc.Text())
			l.mu.Unlock()
		}
	}()
	return l
}

func (l *lines) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.all...)
}

// matching returns the lines that match re.
func (l *lines) matching(re *regexp.Regexp) []string {
	var m []string
	for _, s := range l.get() {
		if re.MatchString(s) {
			m = append(m, s)
		}
	}
	return m
}

// await waits up to 15s for n lines matching re.
func (l *lines) await(t *testing.T, n int, re *regexp.Regexp) []string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		if m := l.matching(re); len(m) >= n {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d lines matching %s in 15s; stderr:\n%s", n, re, strings.Join(l.get(), "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// run -v says when it starts waiting and where it is in line, then again
// as it waits and when its place changes, and when it got the lock.
func TestRunVerboseWaiting(t *testing.T) {
	c := newCLI(t)
	ctx := context.Background()
	req := fairlock.Request{Name: "q", Capacity: 1, Permits: 1}
	held, err := c.lib.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ahead := make(chan *fairlock.Lease, 1)
	go func() {
		l, err := c.client("ahead").Acquire(ctx, req)
		if err != nil {
			t.Error(err)
		}
		ahead <- l
	}()
	c.waitFor("a waiter ahead", func() bool { return len(c.status("q").Waiters) == 1 })

	cmd := c.cmd("run", "-v", "q", "--", "true")
	start := time.Now()
	out := stderrLines(t, cmd)
	waiting := regexp.MustCompile(`^fairlock: waiting for "q" \((\w+) in line\), (\d+\.\ds)$`)
	first := out.await(t, 1, waiting)[0]
	if m := waiting.FindStringSubmatch(first); m[1] != "2nd" {
		t.Fatalf("first line %q, want 2nd in line", first)
	}
	// Again while it waits, with the time it has waited.
	again := out.await(t, 2, waiting)[1]
	secondAt, _ := time.ParseDuration(waiting.FindStringSubmatch(again)[2])
	if secondAt < time.Second || secondAt > time.Since(start) {
		t.Fatalf("second line %q, %v after the start", again, time.Since(start))
	}
	// Its place changes: the waiter ahead takes the lock.
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-ahead
	// A line says so at its next look (every second), before the next
	// line that only says it still waits (4s after the last).
	moved := regexp.MustCompile(`^fairlock: waiting for "q" \(1st in line\), (\d+\.\ds)$`)
	m := out.await(t, 1, moved)[0]
	if d, _ := time.ParseDuration(moved.FindStringSubmatch(m)[1]); d >= secondAt+3900*time.Millisecond {
		t.Fatalf("the line for the new place, %q, came %v after the last", m, d-secondAt)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-out.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("run -v still runs 15s after the lock was free; stderr:\n%s", strings.Join(out.get(), "\n"))
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run -v: %v; stderr:\n%s", err, strings.Join(out.get(), "\n"))
	}
	got := regexp.MustCompile(`^fairlock: got "q" after \d+\.\ds \(token \d+\)$`)
	all := out.get()
	if !got.MatchString(all[len(all)-1]) {
		t.Fatalf("run -v's last line %q, want that it got the lock; stderr:\n%s", all[len(all)-1], strings.Join(all, "\n"))
	}
	t.Logf("run -v:\n%s", strings.Join(all, "\n"))
}

// run -v on a free lock says it got it, and nothing of waiting.
func TestRunVerboseFree(t *testing.T) {
	c := newCLI(t)
	r := runBin(t, nil, "run", "-v", "-redis", c.url, "-prefix", c.prefix, "free", "--", "true")
	if r.code != 0 || !regexp.MustCompile(`(?m)^fairlock: got "free" after \d+\.\ds \(token \d+\)$`).MatchString(r.stderr) || strings.Contains(r.stderr, "waiting") {
		t.Fatalf("run -v on a free lock: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

// run -n and run -w say on stderr why they exit 75, naming the holders.
func TestRunNotGotSaysWhy(t *testing.T) {
	c := newCLI(t)
	ctx := context.Background()
	held, err := c.lib.Acquire(ctx, fairlock.Request{Name: "busy", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	do := func(args ...string) result {
		return runBin(t, nil, append([]string{"run", "-redis", c.url, "-prefix", c.prefix}, args...)...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "busy", "--", "true"}, `fairlock: "busy" is held (by lib); not waiting (-n)` + "\n"},
		{[]string{"-w", "200ms", "busy", "--", "true"}, `fairlock: waited 200ms for "busy" (held by lib); giving up (-w)` + "\n"},
		{[]string{"-w", "0.2", "busy", "--", "true"}, `fairlock: waited 200ms for "busy" (held by lib); giving up (-w)` + "\n"},
	} {
		if r := do(tc.args...); r.code != exitNotGot || r.stderr != tc.want {
			t.Errorf("run %q: exit %d, stderr %q; want %d, %q", tc.args, r.code, r.stderr, exitNotGot, tc.want)
		}
	}
	// A waiter queued ahead is counted; another holder is named.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go c.client("w1").Acquire(wctx, fairlock.Request{Name: "busy", Capacity: 1, Permits: 1})
	c.waitFor("a waiter", func() bool { return len(c.status("busy").Waiters) == 1 })
	want := `fairlock: "busy" is held (by lib), 1 waiting; not waiting (-n)` + "\n"
	if r := do("-n", "busy", "--", "true"); r.code != exitNotGot || r.stderr != want {
		t.Errorf("run -n with a waiter: exit %d, stderr %q; want %q", r.code, r.stderr, want)
	}
	// elect -w names the leader.
	e, err := election.New(c.lib, "sched")
	if err != nil {
		t.Fatal(err)
	}
	l, err := e.Campaign(ctx, "host-a:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Resign(ctx)
	want = `fairlock: waited 200ms to lead "sched" (led by host-a:8080); giving up (-w)` + "\n"
	r := runBin(t, nil, "elect", "-redis", c.url, "-prefix", c.prefix, "-w", "200ms", "sched", "--", "true")
	if r.code != exitNotGot || r.stderr != want {
		t.Fatalf("elect -w: exit %d, stderr %q; want %q", r.code, r.stderr, want)
	}
}

// elect -value ” is refused as the election refuses an empty value.
func TestElectEmptyValue(t *testing.T) {
	c := newCLI(t)
	r := runBin(t, nil, "elect", "-redis", c.url, "-prefix", c.prefix, "-value", "", "e", "--", "true")
	if r.code != exitUsage || !strings.Contains(r.stderr, "value of 0 bytes") {
		t.Fatalf("elect -value '': exit %d, stderr %q; want %d and the election's refusal", r.code, r.stderr, exitUsage)
	}
}

// status shows each process once, recognisably: fairlock's own as
// host:pid (elect's default value too), a library client without a label
// by a short form of its id, the same in every row; -json keeps the id
// whole. Waiters show how long they have waited.
func TestStatusIdentity(t *testing.T) {
	c := newCLI(t)
	ctx := context.Background()
	cmd := c.cmd("elect", "e", "--", "sh", "-c", "while [ ! -e stop ]; do sleep 0.02; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		os.WriteFile(c.dir+"/stop", nil, 0o644)
		cmd.Wait()
	}()
	c.waitFor("elect to lead", func() bool { return strings.Contains(c.statusOut("e"), "leader") })
	host, _ := os.Hostname()
	label := fmt.Sprintf("%s:%d", host, cmd.Process.Pid)
	anon := c.client("") // no label
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 2 {
		go anon.Acquire(wctx, fairlock.Request{Name: "e", Capacity: 1, Permits: 1})
	}
	c.waitFor("two waiters", func() bool { return len(c.status("e").Waiters) == 2 })

	var js []status
	if err := json.Unmarshal([]byte(c.statusOut("-json", "e")), &js); err != nil {
		t.Fatal(err)
	}
	id := js[0].Waiters[0].Owner
	if len(js[0].Holders) != 1 || js[0].Holders[0].Owner != label || js[0].Leader == nil || js[0].Leader.Value != label || len(id) != 26 || js[0].Waiters[1].Owner != id {
		t.Fatalf("status -json: %+v; want %s holding and leading, and a client id twice waiting", js, label)
	}
	table := c.statusOut("e")
	rows := regexp.MustCompile(`(?m)^  \d+\s+`+id[:8]+`…\s+1\s+\d+(\.\d+)?(ms|s)\s*$`).FindAllString(table, -1)
	if !strings.Contains(table, "  leader "+label+", term ") || !strings.Contains(table, "\n  "+label+" ") ||
		strings.Contains(table, id) || len(rows) != 2 || !strings.Contains(table, "WAITING FOR") {
		t.Fatalf("status table:\n%s\nwant %s as holder and leader, and two waiters shown as %s… with the time they waited", table, label, id[:8])
	}
	t.Logf("status:\n%s", table)

	// A NAME that starts with '-' comes after --.
	if out := c.statusOut("--", "-odd"); out != "-odd: idle\n" {
		t.Fatalf("status -- -odd printed %q", out)
	}
}

// run -w gives up on time against a Redis that does not answer: it exits
// 70, saying Redis did not answer, soon after -w, not once its client's
// clean-up (or a probe of Redis) has waited out go-redis's timeouts.
func TestRunGivesUpOnTime(t *testing.T) {
	srv, err := redisserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	for _, args := range [][]string{
		{"run", "-w", "1s", "-redis", "redis://" + srv.Addr, "x", "--", "true"},
		{"elect", "-w", "1s", "-redis", "redis://" + srv.Addr, "x", "--", "true"},
	} {
		start := time.Now()
		r := runBin(t, nil, args...)
		took := time.Since(start)
		t.Logf("%s -w 1s against a paused Redis: exit %d after %v: %s", args[0], r.code, took.Round(time.Millisecond), strings.TrimSpace(r.stderr))
		if r.code != exitError || !strings.Contains(r.stderr, "waited 1s ") || !strings.Contains(r.stderr, "did not answer") {
			t.Errorf("%s -w 1s against a paused Redis: exit %d, stderr:\n%s", args[0], r.code, r.stderr)
		}
		if took > 4*time.Second {
			t.Errorf("%s -w 1s against a paused Redis exited after %v", args[0], took)
		}
	}
}
