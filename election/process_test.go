package election_test

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
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// These tests run candidates as processes (the test binary re-executed,
// as in internal/faulttest) and kill or pause them.

const workerEnv = "FAIRLOCK_ELECTION_WORKER"

func mainWithWorkers(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(candidate())
	}
	redistest.Main(m)
}

// candidate campaigns with the value in its environment, prints "leader
// <term>" once it leads, and then either "lost <cause>" if leadership
// ends, or resigns when its stdin closes.
func candidate() int {
	lease, _ := time.ParseDuration(os.Getenv("FL_LEASE"))
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv("FL_ADDR")})
	defer rdb.Close()
	c, err := fairlock.New(rdb, fairlock.WithPrefix(os.Getenv("FL_PREFIX")), fairlock.WithLeaseTTL(lease),
		fairlock.WithWaiterTTL(time.Second))
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
	e, err := election.New(c, os.Getenv("FL_NAME"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	l, err := e.Campaign(ctx, os.Getenv("FL_VALUE"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Println("leader", l.Term())
	select {
	case <-ctx.Done():
		_ = l.Resign(context.Background())
	case <-l.Done():
		fmt.Printf("lost %v\n", l.Err())
		<-ctx.Done()
	}
	return 0
}

type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startCandidate(t *testing.T, addr, prefix, name, value string, lease time.Duration) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GORACE=atexit_sleep_ms=0", workerEnv+"=1", "FL_ADDR="+addr,
		"FL_PREFIX="+prefix, "FL_NAME="+name, "FL_VALUE="+value, "FL_LEASE="+lease.String())
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
	p := &proc{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return p
}

func (p *proc) expect(prefix string, timeout time.Duration) string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok || !strings.HasPrefix(l, prefix) {
			p.t.Fatalf("candidate %d said %q (open %v); expected %q", p.cmd.Process.Pid, l, ok, prefix)
		}
		return strings.TrimSpace(strings.TrimPrefix(l, prefix))
	case <-time.After(timeout):
		p.t.Fatalf("candidate %d said nothing for %v; expected %q", p.cmd.Process.Pid, timeout, prefix)
	}
	return ""
}

func (p *proc) term(timeout time.Duration) int64 {
	p.t.Helper()
	n, err := strconv.ParseInt(p.expect("leader ", timeout), 10, 64)
	if err != nil {
		p.t.Fatal(err)
	}
	return n
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// A leader process killed (SIGKILL) with a candidate queued: the candidate
// takes office, and an observer sees it, within the lease TTL of the kill
// (plus a margin for a loaded machine). The failover times are logged.
func TestLeaderKilled(t *testing.T) {
	b := redistest.RealBackend(t)
	e := newEnv(t, b)
	// Long enough that a loaded machine does not lose leases by itself.
	const lease = 2 * time.Second
	obs := e.election(e.Client(), "killed")
	for round := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		ch := obs.Observe(ctx)
		leader := startCandidate(t, b.Addr, e.Prefix, "killed", fmt.Sprintf("a%d", round), lease)
		ta := leader.term(10 * time.Second)
		if got := e.next(ch); got.Term != ta {
			t.Fatalf("observed %+v, want term %d", got, ta)
		}
		next := startCandidate(t, b.Addr, e.Prefix, "killed", fmt.Sprintf("b%d", round), lease)
		fltest.WaitWaiters(t, e.Client(), "killed", 1)
		killed := time.Now()
		leader.signal(syscall.SIGKILL)
		got := e.next(ch)
		if got.Term == 0 {
			// The observer read the leader as its lease expired, before
			// the successor took office.
			got = e.next(ch)
		}
		took := time.Since(killed)
		tb := next.term(10 * time.Second)
		t.Logf("round %d: the successor took office, as its observer saw, %v after the leader was killed (lease TTL %v)", round, took.Round(time.Millisecond), lease)
		if got.Term != tb || got.Value != fmt.Sprintf("b%d", round) || tb <= ta {
			t.Fatalf("observed %+v after the kill; successor's term %d, killed leader's %d", got, tb, ta)
		}
		if took > lease+2*time.Second {
			t.Errorf("failover took %v; lease TTL %v", took, lease)
		}
		_ = next.stdin.Close()
		if got := e.next(ch); got.Term != 0 {
			t.Fatalf("after the successor resigned: %+v, want the zero Info", got)
		}
		cancel()
		_ = next.cmd.Wait()
	}
}

// A leader process paused (SIGSTOP) past its lease: a queued candidate
// takes office; resumed, the old leader learns it lost (its Done closes,
// with ErrLeaseLost), and its term is below its successor's.
func TestLeaderPaused(t *testing.T) {
	b := redistest.RealBackend(t)
	e := newEnv(t, b)
	const lease = 2 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	obs := e.election(e.Client(), "paused")
	ch := obs.Observe(ctx)
	leader := startCandidate(t, b.Addr, e.Prefix, "paused", "a", lease)
	ta := leader.term(10 * time.Second)
	e.next(ch)
	next := startCandidate(t, b.Addr, e.Prefix, "paused", "b", lease)
	fltest.WaitWaiters(t, e.Client(), "paused", 1)
	paused := time.Now()
	leader.signal(syscall.SIGSTOP)
	tb := next.term(10 * time.Second)
	t.Logf("the successor took office %v after the leader was paused (lease TTL %v)", time.Since(paused).Round(time.Millisecond), lease)
	got := e.next(ch)
	if got.Term == 0 { // read as the lease expired, before b took office
		got = e.next(ch)
	}
	if got != (election.Info{Value: "b", Term: tb}) {
		t.Fatalf("observed %+v, want b (term %d)", got, tb)
	}
	leader.signal(syscall.SIGCONT)
	cause := leader.expect("lost ", 10*time.Second)
	// The cause crossed a process boundary as text: an *Error names
	// fairlock once, so the sentinel appears without its prefix.
	if !strings.Contains(cause, strings.TrimPrefix(fairlock.ErrLeaseLost.Error(), "fairlock: ")) {
		t.Fatalf("the resumed leader lost with %q, want %v", cause, fairlock.ErrLeaseLost)
	}
	if ta >= tb {
		t.Fatalf("paused leader's term %d, successor's %d: want lower", ta, tb)
	}
	info, err := obs.Leader(ctx)
	if err != nil || info.Term != tb {
		t.Fatalf("Leader() = %+v, %v; want the successor", info, err)
	}
}
