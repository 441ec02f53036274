package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/latch"
	"github.com/redis/go-redis/v9"
)

var bin string // the fairlock binary under test

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fairlock-cli")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "fairlock")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	redistest.MainWith(m, func() { os.RemoveAll(dir) })
}

// cli is one test's view: a real Redis, a prefix of its own, a working
// directory, and a library client for comparison.
type cli struct {
	t      *testing.T
	url    string
	prefix string
	dir    string
	lib    *fairlock.Client
}

func newCLI(t *testing.T) *cli {
	return newCLIOn(t, redistest.RealBackend(t).Addr)
}

// newCLIOn is newCLI on the Redis at addr.
func newCLIOn(t *testing.T, addr string) *cli {
	c := &cli{t: t, url: "redis://" + addr, prefix: redistest.Prefix(t), dir: t.TempDir()}
	c.lib = c.client("lib")
	return c
}

func (c *cli) client(owner string, opts ...fairlock.Option) *fairlock.Client {
	rdb := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(c.url, "redis://")})
	c.t.Cleanup(func() { rdb.Close() })
	fc, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(c.prefix), fairlock.WithOwner(owner)}, opts...)...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { fc.Close() })
	return fc
}

// cmd prepares the fairlock binary with a subcommand and its flags.
func (c *cli) cmd(sub string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, append([]string{sub, "-redis", c.url, "-prefix", c.prefix}, args...)...)
	cmd.Dir = c.dir
	return cmd
}

// exit runs cmd and returns its exit status.
func exit(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("%v: %v", cmd.Args, err)
	return -1
}

func (c *cli) status(name string) fairlock.Status {
	st, err := c.lib.Status(context.Background(), name)
	if err != nil {
		c.t.Fatal(err)
	}
	return st
}

func (c *cli) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Three processes started one after another get the lock in that order.
func TestRunInArrivalOrder(t *testing.T) {
	c := newCLI(t)
	first := c.cmd("run", "job", "--", "sh", "-c", "echo 1 >> order; while [ ! -e go ]; do sleep 0.02; done")
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the first to hold", func() bool { return len(c.status("job").Holders) == 1 })
	var rest []*exec.Cmd
	for i := 2; i <= 3; i++ {
		cmd := c.cmd("run", "job", "--", "sh", "-c", fmt.Sprintf("echo %d >> order", i))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		rest = append(rest, cmd)
		c.waitFor(fmt.Sprintf("%d queued", i-1), func() bool { return len(c.status("job").Waiters) == i-1 })
	}
	if err := os.WriteFile(filepath.Join(c.dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range append([]*exec.Cmd{first}, rest...) {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("%v: %v", cmd.Args, err)
		}
	}
	got, _ := os.ReadFile(filepath.Join(c.dir, "order"))
	if string(got) != "1\n2\n3\n" {
		t.Fatalf("commands ran in order %q, want 1 2 3", got)
	}
}

func TestRunExitStatus(t *testing.T) {
	c := newCLI(t)
	if got := exit(t, c.cmd("run", "x", "--", "sh", "-c", "exit 7")); got != 7 {
		t.Fatalf("exit status = %d, want the command's 7", got)
	}
	var out bytes.Buffer
	cmd := c.cmd("run", "-capacity", "3", "-permits", "2", "x3", "--", "sh", "-c", `echo "$FAIRLOCK_NAME $FAIRLOCK_TOKEN"`)
	cmd.Stdout = &out
	if got := exit(t, cmd); got != 0 {
		t.Fatalf("exit status = %d", got)
	}
	if f := strings.Fields(out.String()); len(f) != 2 || f[0] != "x3" || f[1] == "" {
		t.Fatalf("command saw %q, want its lock's name and token", out.String())
	}
	if got := exit(t, c.cmd("run", "x", "--", "/nonexistent/command")); got != exitNoCommand {
		t.Fatalf("exit status for a missing command = %d, want %d", got, exitNoCommand)
	}
	for _, args := range [][]string{
		{"x"}, {"x", "--"}, {"x", "true"}, {"-capacity", "0", "x", "--", "true"}, {"-permits", "2", "x", "--", "true"}, {"", "--", "true"}, {"-grace", "-1s", "x", "--", "true"},
	} {
		if got := exit(t, c.cmd("run", args...)); got != exitUsage {
			t.Fatalf("run %v = %d, want %d", args, got, exitUsage)
		}
	}
	if got := exit(t, exec.Command(bin, "run", "-redis", "not a url", "x", "--", "true")); got != exitUsage {
		t.Fatalf("run with a bad URL = %d, want %d", got, exitUsage)
	}
	if got := exit(t, exec.Command(bin, "run", "-redis", "redis://127.0.0.1:1", "x", "--", "true")); got != exitError {
		t.Fatalf("run with Redis unreachable = %d, want %d", got, exitError)
	}
}

func TestRunBusyAndTimeout(t *testing.T) {
	c := newCLI(t)
	held, err := c.lib.Acquire(context.Background(), fairlock.Request{Name: "busy", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	if got := exit(t, c.cmd("run", "-n", "busy", "--", "true")); got != exitNotGot {
		t.Fatalf("run -n on a held lock = %d, want %d", got, exitNotGot)
	}
	if got := exit(t, c.cmd("run", "-w", "200ms", "busy", "--", "true")); got != exitNotGot {
		t.Fatalf("run -w 200ms on a held lock = %d, want %d", got, exitNotGot)
	}
	if st := c.status("busy"); len(st.Waiters) != 0 {
		t.Fatalf("a timed-out run left %d waiters", len(st.Waiters))
	}
}

// A fairlock process paused past its lease learns it lost the lease when
// it resumes: it stops the command and exits 76, and the holder that took
// over has a higher token.
func TestRunLeaseLost(t *testing.T) {
	c := newCLI(t)
	var stderr bytes.Buffer
	cmd := c.cmd("run", "-ttl", "300ms", "-grace", "1s", "lost", "--", "sleep", "30")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var paused fairlock.Holder
	c.waitFor("the run to hold", func() bool {
		st := c.status("lost")
		if len(st.Holders) == 1 {
			paused = st.Holders[0]
		}
		return len(st.Holders) == 1
	})
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, err := c.lib.Acquire(ctx, fairlock.Request{Name: "lost", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatalf("Acquire while the holder is paused: %v", err)
	}
	defer next.Release(context.Background())
	if next.Token() <= paused.Token {
		t.Fatalf("token after takeover %d <= paused holder's %d", next.Token(), paused.Token)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitLeaseLost {
		t.Fatalf("paused run exited with %v, want status %d; stderr: %s", err, exitLeaseLost, stderr.String())
	}
}

// status -json shows what the library sees.
func TestStatusMatchesLibrary(t *testing.T) {
	c := newCLI(t)
	ctx := context.Background()
	before := time.Now()
	held, err := c.lib.Acquire(ctx, fairlock.Request{Name: "st", Capacity: 3, Permits: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go c.client("waiter").Acquire(wctx, fairlock.Request{Name: "st", Capacity: 3, Permits: 2})
	c.waitFor("a waiter", func() bool { return len(c.status("st").Waiters) == 1 })

	var out bytes.Buffer
	cmd := c.cmd("status", "-json", "st", "idle")
	cmd.Stdout = &out
	if got := exit(t, cmd); got != 0 {
		t.Fatalf("status exited %d", got)
	}
	var got []fairlock.Status
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("status -json printed %q: %v", out.String(), err)
	}
	want := c.status("st")
	if len(got) != 2 || got[1].Name != "idle" || got[1].Capacity != 0 {
		t.Fatalf("status -json = %+v, want st and an idle lock", got)
	}
	g := got[0]
	if g.Capacity != want.Capacity || g.InUse != want.InUse || len(g.Holders) != 1 || len(g.Waiters) != 1 {
		t.Fatalf("status -json = %+v, library %+v", g, want)
	}
	if g.Holders[0].Owner != "lib" || g.Holders[0].Token != held.Token() || g.Holders[0].Permits != 2 {
		t.Fatalf("holder %+v, want lib holding 2 with token %d", g.Holders[0], held.Token())
	}
	if g.Waiters[0] != want.Waiters[0] || g.Waiters[0].Owner != "waiter" {
		t.Fatalf("waiter %+v, library %+v", g.Waiters[0], want.Waiters[0])
	}
	// The ages, by Redis's clock (the same host's): the holder's and the
	// oldest waiter's, each no older than this test's wait began.
	if h := g.Holders[0].HeldFor; h <= 0 || h > time.Since(before)+time.Millisecond {
		t.Fatalf("holder held for %v, acquired %v ago", h, time.Since(before))
	}
	if g.Queued != 1 || g.OldestWait <= 0 || g.OldestWait > g.Holders[0].HeldFor+time.Millisecond || g.Time.IsZero() {
		t.Fatalf("queued %d, oldest wait %v (holder's %v), time %v", g.Queued, g.OldestWait, g.Holders[0].HeldFor, g.Time)
	}
	t.Logf("status -json: held for %v, oldest wait %v", g.Holders[0].HeldFor, g.OldestWait)

	out.Reset()
	cmd = c.cmd("status", "st")
	cmd.Stdout = &out
	if got := exit(t, cmd); got != 0 {
		t.Fatalf("status exited %d", got)
	}
	for _, s := range []string{"st: 2 of 3 permits held, 1 waiting, the oldest for ", "HOLDER", "HELD FOR", "lib", "WAITER", "waiter"} {
		if !strings.Contains(out.String(), s) {
			t.Fatalf("status table lacks %q:\n%s", s, out.String())
		}
	}
}

// status -kind latch and -kind barrier show what latch.Inspect and
// barrier.Inspect read, whatever count or parties the objects were made
// with; a bad -kind is a usage error.
func TestStatusOfLatchAndBarrier(t *testing.T) {
	c := newCLI(t)
	ctx := context.Background()
	l, err := latch.New(c.lib, "phase", 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.CountDown(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b, err := barrier.New(c.client("party"), "phase", 2)
	if err != nil {
		t.Fatal(err)
	}
	go b.Await(wctx)
	c.waitFor("a party", func() bool {
		st, err := barrier.Inspect(ctx, c.lib, "phase")
		return err == nil && len(st.Arrived) == 1
	})
	run := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		cmd := c.cmd("status", args...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if got := exit(t, cmd); got != 0 {
			t.Fatalf("status %q exited %d: %s", args, got, errb.String())
		}
		return out.String()
	}
	var ls []struct {
		Name, Kind string
		latch.Status
	}
	if err := json.Unmarshal([]byte(run("-kind", "latch", "-json", "phase", "none")), &ls); err != nil {
		t.Fatal(err)
	}
	if len(ls) != 2 || ls[0].Name != "phase" || ls[0].Kind != "latch" || ls[0].Status != (latch.Status{Exists: true, Count: 2, Initial: 3}) || ls[1].Exists {
		t.Fatalf("status -kind latch -json = %+v, want phase at 2 of 3 and no latch none", ls)
	}
	var bs []struct {
		Name, Kind string
		barrier.Status
	}
	if err := json.Unmarshal([]byte(run("-kind", "barrier", "-json", "phase")), &bs); err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || bs[0].Kind != "barrier" || bs[0].Parties != 2 || bs[0].Round != 1 || !slices.Equal(bs[0].Arrived, []string{"party"}) {
		t.Fatalf("status -kind barrier -json = %+v, want phase of 2 parties, round 1, [party]", bs)
	}
	for args, want := range map[string][]string{
		"latch":   {"phase: latch at 2 of 3, 0 waiting", "none: no latch"},
		"barrier": {"phase: barrier of 2 parties, round 1, 1 arrived", "INDEX", "party", "none: no barrier"},
	} {
		out := run("-kind", args, "phase", "none")
		for _, s := range want {
			if !strings.Contains(out, s) {
				t.Fatalf("status -kind %s lacks %q:\n%s", args, s, out)
			}
		}
	}
	var errb bytes.Buffer
	cmd := c.cmd("status", "-kind", "queue", "phase")
	cmd.Stderr = &errb
	if got := exit(t, cmd); got != exitUsage || !strings.Contains(errb.String(), "-kind") {
		t.Fatalf("status -kind queue exited %d (%s), want %d naming -kind", got, errb.String(), exitUsage)
	}
}

// With Redis down, each command prints one line of its own to stderr, and
// none of go-redis's pool logs; -v shows those as fairlock's debug logs.
func TestRedisDownOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "redis://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, args := range [][]string{
		{"status", "-redis", down, "x"},
		{"run", "-redis", down, "x", "--", "true"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			redisDown(t, args)
		})
	}
}

// redisDown runs args (a command and its flags, Redis down) without and
// with -v.
func redisDown(t *testing.T, args []string) {
	{
		var stderr bytes.Buffer
		cmd := exec.Command(bin, args...)
		cmd.Stderr = &stderr
		if got := exit(t, cmd); got != exitError {
			t.Fatalf("%s with Redis down exited %d, want %d", args[0], got, exitError)
		}
		lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "fairlock: ") || strings.Count(lines[0], "fairlock: ") != 1 || strings.Contains(lines[0], "pool") {
			t.Fatalf("%s with Redis down printed %d lines, want one of fairlock's own:\n%s", args[0], len(lines), stderr.String())
		}
		t.Logf("%s: %s", args[0], lines[0])

		stderr.Reset()
		cmd = exec.Command(bin, append([]string{args[0], "-v"}, args[1:]...)...)
		cmd.Stderr = &stderr
		if got := exit(t, cmd); got != exitError {
			t.Fatalf("%s -v with Redis down exited %d", args[0], got)
		}
		// The error line, and besides it only logs. (go-redis logs a
		// refused dial only once its own retries end, after the command
		// has exited: TestGoRedisLogsWithV shows where those go.)
		out := stderr.String()
		own := 0
		for _, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
			switch {
			case l == lines[0]:
				own++
			case strings.Contains(l, "level="):
			default:
				t.Fatalf("%s -v with Redis down printed a line that is neither its error nor a log: %q", args[0], l)
			}
		}
		if own != 1 {
			t.Fatalf("%s -v with Redis down printed:\n%s", args[0], out)
		}
	}
}

// The commands hand go-redis's own logs (a dial that failed after its
// retries) to -v's logger at Debug, and drop them without -v.
func TestGoRedisLogsWithV(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "redis://" + ln.Addr().String() + "?max_retries=-1"
	ln.Close()
	defer redis.SetLogger(redisLog{}) // this test binary's go-redis stays quiet
	for _, verbose := range []bool{false, true} {
		var stderr bytes.Buffer
		c := &common{url: down, verbose: verbose, stderr: &stderr}
		rdb, fc, err := c.connect()
		if err != nil {
			t.Fatal(err)
		}
		// go-redis's own call, with its own retries: it logs the failed dial.
		if err := rdb.Ping(context.Background()).Err(); err == nil {
			t.Fatal("PING with Redis down succeeded")
		}
		fc.Close()
		rdb.Close()
		out := stderr.String()
		logged := strings.Contains(out, "level=DEBUG") && strings.Contains(out, "source=go-redis") && strings.Contains(out, "failed to dial")
		if logged != verbose {
			t.Errorf("-v %v: go-redis's failed dial logged %v, want %v:\n%s", verbose, logged, verbose, out)
		}
	}
}

// -v shows fairlock's own logs: a lost lease, at Warn.
func TestVerboseLostLease(t *testing.T) {
	c := newCLI(t)
	var stderr bytes.Buffer
	cmd := c.cmd("run", "-v", "-ttl", "300ms", "-grace", "1s", "vlost", "--", "sleep", "30")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the run to hold", func() bool { return len(c.status("vlost").Holders) == 1 })
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, err := c.lib.Acquire(ctx, fairlock.Request{Name: "vlost", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(context.Background())
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if got := exitOf(cmd.Wait()); got != exitLeaseLost {
		t.Fatalf("exit %d, want %d; stderr:\n%s", got, exitLeaseLost, stderr.String())
	}
	if out := stderr.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "lease lost") || !strings.Contains(out, "semaphores=[vlost]") {
		t.Fatalf("-v stderr lacks the lost lease's log:\n%s", out)
	}
}

func exitOf(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// -max-hold ends the lease at the cap though the command still runs: the
// command is stopped, run exits 76 saying why, and the lock is free.
func TestRunMaxHold(t *testing.T) {
	c := newCLI(t)
	var stderr bytes.Buffer
	cmd := c.cmd("run", "-max-hold", "300ms", "-grace", "1s", "capped", "--", "sleep", "30")
	cmd.Stderr = &stderr
	if got := exit(t, cmd); got != exitLeaseLost {
		t.Fatalf("run -max-hold 300ms -- sleep 30 exited %d, want %d; stderr: %s", got, exitLeaseLost, stderr.String())
	}
	if !strings.Contains(stderr.String(), "maximum hold reached") {
		t.Fatalf("stderr does not say the cap was reached:\n%s", stderr.String())
	}
	next, err := c.lib.TryAcquire(context.Background(), fairlock.Request{Name: "capped", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatalf("TryAcquire after the capped run: %v", err)
	}
	_ = next.Release(context.Background())
	if got := exit(t, c.cmd("run", "-max-hold", "-1s", "capped", "--", "true")); got != exitUsage {
		t.Fatalf("run -max-hold -1s exited %d, want %d", got, exitUsage)
	}
}
