package faulttest

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/clients"
	"github.com/fairlock/fairlock/internal/redistest"
)

func TestMain(m *testing.M) {
	if IsWorker() {
		os.Exit(WorkerMain(clients.GoRedis))
	}
	redistest.MainWith(m, clients.Cleanup)
}

// A worker is a running worker process, seen from the test.
type worker struct {
	t      *testing.T
	client string // the Go Redis client it runs
	spec   spec   // what it was told
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
}

// turns counts the workers started on each semaphore (prefix and names),
// so that the workers of one semaphore take turns between the clients;
// each semaphore's first worker takes the turn after the previous
// semaphore's, so that a test's roles (the first holder, the paused one,
// the one that closes) fall to each client over the suite.
var turns = struct {
	sync.Mutex
	n    map[string]int
	sems int
}{n: map[string]int{}}

// start starts a worker process told s, and waits until it has made its
// client. The workers of a semaphore take turns between the Go Redis
// clients (clients.Binaries): go-redis (this binary), rueidis and
// valkey-go, each through its own module's test binary; so the processes
// that compete for one semaphore speak to Redis through different
// clients.
func start(t *testing.T, mode string, s spec) *worker {
	t.Helper()
	bins := clients.Binaries(t)
	turns.Lock()
	turn, ok := turns.n[s.prefix+s.name]
	if !ok {
		turn = turns.sems
		turns.sems++
	}
	turns.n[s.prefix+s.name] = turn + 1
	turns.Unlock()
	bin := bins[turn%len(bins)]
	cmd := exec.Command(bin.Path, "-test.run=^$")
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
	t.Logf("worker %d: %s", cmd.Process.Pid, bin.Client)
	w := &worker{t: t, client: bin.Client, spec: s, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
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
	// A binary whose TestMain ran no worker would exit without a word.
	w.expect("ready", 30*time.Second)
	return w
}

// expect waits for the worker's next line, which must start with prefix,
// and returns the rest of it.
func (w *worker) expect(prefix string, timeout time.Duration) string {
	w.t.Helper()
	select {
	case l, ok := <-w.lines:
		if !ok {
			w.t.Fatalf("worker %d (%s) ended; expected %q", w.cmd.Process.Pid, w.client, prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			w.t.Fatalf("worker %d (%s) said %q; expected %q", w.cmd.Process.Pid, w.client, l, prefix)
		}
		return strings.TrimSpace(strings.TrimPrefix(l, prefix))
	case <-time.After(timeout):
		w.t.Fatalf("worker %d (%s) said nothing for %v; expected %q", w.cmd.Process.Pid, w.client, timeout, prefix)
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
			w.t.Errorf("worker %d (%s): %v", w.cmd.Process.Pid, w.client, err)
		}
	case <-time.After(timeout):
		w.t.Fatalf("worker %d (%s) did not exit within %v of being told to", w.cmd.Process.Pid, w.client, timeout)
	}
}
