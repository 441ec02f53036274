package faulttest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv("FAIRLOCK_WORKER"); mode != "" {
		os.Exit(work(mode))
	}
	redistest.Main(m)
}

// spec is what a worker process is told, through its environment.
type spec struct {
	addr, prefix, name string
	capacity, permits  int64
	lease, waiter      time.Duration
	hold               time.Duration // loop: time in the critical section
	log                string        // loop: the occupancy log
}

func (s spec) env(mode string) []string {
	return append(os.Environ(),
		// Under -race, a process sleeps a second before it exits unless
		// told not to.
		"GORACE=atexit_sleep_ms=0",
		"FAIRLOCK_WORKER="+mode,
		"FL_ADDR="+s.addr, "FL_PREFIX="+s.prefix, "FL_NAME="+s.name,
		"FL_CAP="+strconv.FormatInt(s.capacity, 10), "FL_PERMITS="+strconv.FormatInt(s.permits, 10),
		"FL_LEASE="+s.lease.String(), "FL_WAITER="+s.waiter.String(),
		"FL_HOLD="+s.hold.String(), "FL_LOG="+s.log)
}

func specFromEnv() spec {
	d := func(k string) time.Duration { v, _ := time.ParseDuration(os.Getenv(k)); return v }
	n := func(k string) int64 { v, _ := strconv.ParseInt(os.Getenv(k), 10, 64); return v }
	return spec{addr: os.Getenv("FL_ADDR"), prefix: os.Getenv("FL_PREFIX"), name: os.Getenv("FL_NAME"),
		capacity: n("FL_CAP"), permits: n("FL_PERMITS"), lease: d("FL_LEASE"), waiter: d("FL_WAITER"),
		hold: d("FL_HOLD"), log: os.Getenv("FL_LOG")}
}

// work runs a worker process. It stops when its stdin closes.
//
//	loop: acquire (all names at once, for a list), log "enter" for each,
//	      hold, log "exit" for each, release; on errors log "error" and
//	      try again
//	hold: acquire once, print "acquired <token>", and hold until stdin
//	      closes; if the lease ends first, print "done <cause>" and
//	      "release <error>"
//	close, shutdown, abandon: acquire once, print "acquired <token>",
//	      and when stdin closes end the client holding the lease, by
//	      Close, Shutdown (10 s) or Abandon, print "closed <error>" and
//	      "lease <cause>", and exit
func work(mode string) int {
	s := specFromEnv()
	redis.SetLogger(quiet{}) // Redis restarts on purpose; no redial logs
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	c, err := fairlock.New(rdb, fairlock.WithPrefix(s.prefix), fairlock.WithLeaseTTL(s.lease),
		fairlock.WithWaiterTTL(s.waiter), fairlock.WithOwner(fmt.Sprintf("pid%d", os.Getpid())))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	// A name list "a,b" asks for all of them at once (a multi-lock).
	var reqs []fairlock.Request
	names := strings.Split(s.name, ",")
	for _, n := range names {
		reqs = append(reqs, fairlock.Request{Name: n, Capacity: s.capacity, Permits: s.permits})
	}
	switch mode {
	case "loop":
		f, err := os.OpenFile(s.log, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		defer f.Close()
		// One write per line, O_APPEND: lines of all workers land whole
		// and in the order their writes ran.
		logf := func(format string, args ...any) {
			_, _ = fmt.Fprintf(f, "%d %d "+format+"\n", append([]any{time.Now().UnixMicro(), os.Getpid()}, args...)...)
		}
		for ctx.Err() == nil {
			actx, acancel := context.WithTimeout(ctx, 5*time.Second)
			l, err := c.AcquireAll(actx, reqs...)
			acancel()
			if err != nil {
				if ctx.Err() == nil {
					logf("error %q", err.Error())
					time.Sleep(20 * time.Millisecond)
				}
				continue
			}
			for _, p := range l.Parts() {
				logf("enter %d %d %s", p.Token, p.Permits, p.Name)
			}
			time.Sleep(s.hold)
			for _, p := range l.Parts() {
				logf("exit %d %d %s", p.Token, p.Permits, p.Name)
			}
			if err := l.Release(context.Background()); err != nil {
				logf("release %q", err.Error())
			}
		}
		return 0
	case "hold":
		l, err := c.AcquireAll(ctx, reqs...)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("acquired", l.Token())
		select {
		case <-ctx.Done():
			_ = l.Release(context.Background())
		case <-l.Done():
			fmt.Printf("done %v\n", l.Err())
			fmt.Printf("release %v\n", l.Release(context.Background()))
			<-ctx.Done()
		}
		return 0
	case "close", "shutdown", "abandon":
		l, err := c.AcquireAll(ctx, reqs...)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("acquired", l.Token())
		<-ctx.Done()
		switch mode {
		case "close":
			err = c.Close()
		case "shutdown":
			sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = c.Shutdown(sctx)
			scancel()
		case "abandon":
			err = c.Abandon()
		}
		fmt.Printf("closed %v\n", err)
		fmt.Printf("lease %v\n", l.Err())
		return 0
	}
	fmt.Println("error: unknown mode", mode)
	return 1
}

// A worker is a running worker process, seen from the test.
type worker struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func start(t *testing.T, mode string, s spec) *worker {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = s.env(mode)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.lines <- sc.Text()
		}
		close(w.lines)
	}()
	t.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		_ = w.cmd.Wait()
	})
	return w
}

// expect waits for the worker's next line, which must start with prefix,
// and returns the rest of it.
func (w *worker) expect(prefix string, timeout time.Duration) string {
	w.t.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			w.t.Fatalf("worker %d ended; expected %q", w.cmd.Process.Pid, prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			w.t.Fatalf("worker %d said %q; expected %q", w.cmd.Process.Pid, l, prefix)
		}
		return strings.TrimSpace(strings.TrimPrefix(l, prefix))
	case <-time.After(timeout):
		w.t.Fatalf("worker %d said nothing for %v; expected %q", w.cmd.Process.Pid, timeout, prefix)
	}
	return ""
}

func (w *worker) token(timeout time.Duration) int64 {
	w.t.Helper()
	tok, err := strconv.ParseInt(w.expect("acquired ", timeout), 10, 64)
	if err != nil {
		w.t.Fatal(err)
	}
	return tok
}

func (w *worker) signal(sig syscall.Signal) {
	w.t.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		w.t.Fatalf("signal %v: %v", sig, err)
	}
}

// stop closes the worker's stdin and waits for it to exit, failing the
// test if it hangs.
func (w *worker) stop(timeout time.Duration) {
	w.t.Helper()
	_ = w.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- w.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			w.t.Errorf("worker %d: %v", w.cmd.Process.Pid, err)
		}
	case <-time.After(timeout):
		w.t.Fatalf("worker %d did not exit within %v of being told to", w.cmd.Process.Pid, timeout)
	}
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
