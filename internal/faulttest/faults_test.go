package faulttest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func newSpec(t *testing.T, addr, name string, capacity int64) spec {
	return spec{addr: addr, prefix: redistest.Prefix(t), name: name, capacity: capacity, permits: 1,
		lease: time.Second, waiter: 500 * time.Millisecond, hold: 2 * time.Millisecond,
		log: filepath.Join(t.TempDir(), "occupancy.log")}
}

func client(t *testing.T, s spec, opts ...fairlock.Option) *fairlock.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	t.Cleanup(func() { rdb.Close() })
	c, err := fairlock.New(rdb, append([]fairlock.Option{fairlock.WithPrefix(s.prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (s spec) req() fairlock.Request {
	return fairlock.Request{Name: s.name, Capacity: s.capacity, Permits: s.permits}
}

// waitWaiters waits until n requests wait for s's semaphore.
func waitWaiters(t *testing.T, c *fairlock.Client, s spec, n int) {
	t.Helper()
	fltest.WaitWaiters(t, c, s.name, n)
}

// occupancy reads a loop log: the acquisitions (per semaphore), the times
// a semaphore held more than its capacity, the errors callers saw, and
// when (µs) each acquisition began.
type occupancy struct {
	enters, violations, errors int
	releaseErrors              int      // Release returned an error
	errorLines                 []string // the first errors' log lines
	closeErrors                []string // Close's errors (a clean-up that did not land)
	entersAt                   []int64
	byPid                      map[int64][]int64 // each process's enters (µs)
	// releaseLost are the releases that found their lease lost, and
	// stalls each process's own stalls (the host did not run it; see
	// worker's "stall" line).
	releaseLost []logLine
	stalls      map[int64][][2]int64
}

// logLine is a log line's time and process (µs, pid) and text.
type logLine struct {
	at, pid int64
	text    string
}

// stalledReleases counts the releases that found their lease lost after
// their process stalled for at least a third of the lease TTL, in a stall
// that ended within the TTL before the release: a process the host did not
// run that long may miss its lease's renewal, as one stopped by SIGSTOP
// would. Other lost leases are the library's to explain.
func (o occupancy) stalledReleases(ttl time.Duration) int {
	n := 0
	for _, l := range o.releaseLost {
		for _, st := range o.stalls[l.pid] {
			if st[1]-st[0] >= ttl.Microseconds()/3 && st[1] > l.at-ttl.Microseconds() && st[0] <= l.at {
				n++
				break
			}
		}
	}
	return n
}

// idle names the workers of ws that entered no critical section at or
// after since (µs): each one's client must serve it.
func (o occupancy) idle(ws []*worker, since int64) []string {
	var out []string
	for _, w := range ws {
		if !slices.ContainsFunc(o.byPid[int64(w.cmd.Process.Pid)], func(at int64) bool { return at >= since }) {
			out = append(out, fmt.Sprintf("worker %d (%s)", w.cmd.Process.Pid, w.client))
		}
	}
	return out
}

// noteError keeps one of the first errors' log lines.
func (o *occupancy) noteError(line string) {
	if len(o.errorLines) < 5 {
		o.errorLines = append(o.errorLines, line)
	}
}

func readLog(t *testing.T, path string, capacity int64) occupancy {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o := occupancy{byPid: map[int64][]int64{}, stalls: map[int64][][2]int64{}}
	inUse := map[string]int64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var at, pid, token, n int64
		var what, name string
		if _, err := fmt.Sscanf(sc.Text(), "%d %d %s %d %d %s", &at, &pid, &what, &token, &n, &name); err != nil {
			// (Close's error first, by its word, which Sscanf read:
			// its text may hold " error ".)
			if what == "closed" {
				o.closeErrors = append(o.closeErrors, sc.Text())
				continue
			}
			if strings.Contains(sc.Text(), " error ") {
				o.errors++
				o.noteError(sc.Text())
				continue
			}
			if what == "stall" { // "<at> <pid> stall <from> <till>"
				o.stalls[pid] = append(o.stalls[pid], [2]int64{token, n})
				continue
			}
			if strings.Contains(sc.Text(), " release ") {
				o.releaseErrors++
				o.noteError(sc.Text())
				if strings.Contains(sc.Text(), "lease lost") {
					o.releaseLost = append(o.releaseLost, logLine{at, pid, sc.Text()})
				}
				continue
			}
			t.Fatalf("bad log line %q: %v", sc.Text(), err)
		}
		switch what {
		case "enter":
			inUse[name] += n
			o.enters++
			o.entersAt = append(o.entersAt, at)
			o.byPid[pid] = append(o.byPid[pid], at)
			if inUse[name] > capacity {
				o.violations++
			}
		case "exit":
			inUse[name] -= n
		}
	}
	return o
}

// 1. Mutual exclusion under churn: 8 processes on a mutex, 8 on a
// semaphore of capacity 3, and 8 on two mutexes x and y: 4 of them lock
// both at once (multi-lock), 4 lock x alone.
func TestChurn(t *testing.T) {
	redistest.Long(t)
	b := redistest.RealBackend(t)
	const procs = 8
	mutex := newSpec(t, b.Addr, "mutex", 1)
	sem := newSpec(t, b.Addr, "sem", 3)
	multi := newSpec(t, b.Addr, "{t}:x,{t}:y", 1)
	single := multi
	single.name, single.log = "{t}:x", multi.log
	sem.prefix, multi.prefix, single.prefix = mutex.prefix, mutex.prefix, mutex.prefix
	var ws []*worker
	for i := range procs {
		ws = append(ws, start(t, "loop", mutex), start(t, "loop", sem))
		if i%2 == 0 {
			ws = append(ws, start(t, "loop", multi))
		} else {
			ws = append(ws, start(t, "loop", single))
		}
	}
	time.Sleep(6 * time.Second)
	for _, w := range ws {
		w.stop(10 * time.Second)
	}
	for _, s := range []spec{mutex, sem, multi} {
		o := readLog(t, s.log, s.capacity)
		var mine []*worker
		for _, w := range ws {
			if w.spec.log == s.log {
				mine = append(mine, w)
			}
		}
		if idle := o.idle(mine, 0); len(idle) > 0 {
			t.Errorf("%s: %v entered no critical section", s.name, idle)
		}
		stalled := o.stalledReleases(s.lease)
		t.Logf("%s (capacity %d): %d processes, %d acquisitions, %d violations, %d errors (%d releases that found their lease lost after their process stalled)", s.name, s.capacity, procs, o.enters, o.violations, o.errors+o.releaseErrors, stalled)
		if o.violations > 0 || o.errors+o.releaseErrors-stalled > 0 || o.enters < procs {
			t.Errorf("%s: %d acquisitions, %d violations, %d acquire and %d release errors; the first: %q", s.name, o.enters, o.violations, o.errors, o.releaseErrors, o.errorLines)
		}
	}
}

// 2. A holder killed in its critical section: the next waiter is granted
// within the lease TTL (plus a small margin) of the kill, every time.
func TestHolderKilled(t *testing.T) {
	redistest.Long(t)
	b := redistest.RealBackend(t)
	s := newSpec(t, b.Addr, "killed", 1)
	c := client(t, s)
	for i := range 3 {
		holder := start(t, "hold", s)
		holder.token(10 * time.Second)
		waiter := start(t, "hold", s)
		waitWaiters(t, c, s, 1)
		killed := time.Now()
		holder.signal(syscall.SIGKILL)
		waiter.token(s.lease + 5*time.Second)
		took := time.Since(killed)
		t.Logf("round %d: waiter granted %v after the holder was killed (lease TTL %v)", i, took.Round(time.Millisecond), s.lease)
		if took > s.lease+500*time.Millisecond {
			t.Errorf("round %d: waiter granted %v after the kill; lease TTL is %v", i, took, s.lease)
		}
		waiter.stop(5 * time.Second)
	}
}

// 3. Waiters killed while queued (several at once), then the whole
// application restarted while its waiters were queued: survivors and
// fresh processes are granted within one waiter TTL, not one per dead
// waiter.
func TestWaitersKilled(t *testing.T) {
	redistest.Long(t)
	b := redistest.RealBackend(t)
	s := newSpec(t, b.Addr, "queue", 1)
	c := client(t, s, fairlock.WithLeaseTTL(time.Minute))
	margin := 500 * time.Millisecond

	held, err := c.Acquire(context.Background(), s.req())
	if err != nil {
		t.Fatal(err)
	}
	var dead []*worker
	for i := range 5 {
		dead = append(dead, start(t, "hold", s))
		waitWaiters(t, c, s, i+1)
	}
	survivor := start(t, "hold", s)
	waitWaiters(t, c, s, 6)
	killed := time.Now()
	for _, w := range dead {
		w.signal(syscall.SIGKILL)
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	survivor.token(10 * time.Second)
	took := time.Since(killed)
	t.Logf("5 waiters killed at once: the survivor was granted %v later (waiter TTL %v)", took.Round(time.Millisecond), s.waiter)
	if took > s.waiter+margin {
		t.Errorf("survivor granted %v after 5 waiters died; waiter TTL %v", took, s.waiter)
	}
	survivor.stop(5 * time.Second)

	// The application restarts: every process queued dies, and fresh ones
	// queue behind their ghosts.
	held, err = c.Acquire(context.Background(), s.req())
	if err != nil {
		t.Fatal(err)
	}
	var old []*worker
	for i := range 4 {
		old = append(old, start(t, "hold", s))
		waitWaiters(t, c, s, i+1)
	}
	killed = time.Now()
	for _, w := range old {
		w.signal(syscall.SIGKILL)
	}
	var fresh []*worker
	for range 4 {
		fresh = append(fresh, start(t, "hold", s))
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	// (Nothing is granted before this release: on a busy machine the
	// fresh processes take a while to start, and the bound counts from
	// the later of the ghosts' death and the release.)
	released := time.Since(killed)
	// The fresh processes queued in whatever order they started in; each
	// is granted in turn as the one before lets go.
	granted := make(chan *worker, len(fresh))
	for _, w := range fresh {
		go func() {
			if l, ok := <-w.lines; ok && strings.HasPrefix(l, "acquired ") {
				granted <- w
			}
		}()
	}
	for i := range fresh {
		select {
		case w := <-granted:
			took := time.Since(killed)
			t.Logf("restart: fresh process %d granted %v after the old ones died", i, took.Round(time.Millisecond))
			if i == 0 && took > max(s.waiter, released)+margin {
				t.Errorf("first fresh process granted %v after the restart (the lock released %v after it); waiter TTL %v", took, released, s.waiter)
			}
			w.stop(5 * time.Second)
		case <-time.After(10 * time.Second):
			st, err := c.Status(context.Background(), s.name)
			t.Fatalf("only %d of %d fresh processes granted; status %+v %v", i, len(fresh), st, err)
		}
	}
}

// 4. A holder paused past its lease learns it lost the lease when it
// resumes, and its token is lower than the next holder's.
func TestHolderPaused(t *testing.T) {
	redistest.Long(t)
	b := redistest.RealBackend(t)
	s := newSpec(t, b.Addr, "paused", 1)
	c := client(t, s)
	holder := start(t, "hold", s)
	mine := holder.token(10 * time.Second)
	waiter := start(t, "hold", s)
	waitWaiters(t, c, s, 1)
	holder.signal(syscall.SIGSTOP)
	next := waiter.token(s.lease + 5*time.Second)
	holder.signal(syscall.SIGCONT)
	cause := holder.expect("done ", 10*time.Second)
	rel := holder.expect("release ", 5*time.Second)
	t.Logf("paused holder: token %d, next holder's %d; Done: %s; Release: %s", mine, next, cause, rel)
	if !strings.Contains(cause, "lease lost") || !strings.Contains(rel, "lease lost") {
		t.Errorf("paused holder's Done cause %q, Release %q: want lease lost", cause, rel)
	}
	if mine >= next {
		t.Errorf("paused holder's token %d is not below the next holder's %d", mine, next)
	}
	waiter.stop(5 * time.Second)
	holder.stop(5 * time.Second)
}

// 5. Redis killed and started again on its port while processes loop:
// they get errors, never hang, resume within a second of Redis being back,
// and no permit is lost afterwards.
func TestRedisRestart(t *testing.T) {
	redistest.Long(t)
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	srv, err := redisserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	s := newSpec(t, srv.Addr, "restart", 2)
	var ws []*worker
	for range 4 {
		ws = append(ws, start(t, "loop", s))
	}
	time.Sleep(time.Second)
	srv.Kill()
	time.Sleep(time.Second)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	time.Sleep(2 * time.Second)
	for _, w := range ws {
		w.stop(10 * time.Second) // a hung worker fails here
	}
	o := readLog(t, s.log, s.capacity)
	var first int64
	for _, at := range o.entersAt {
		if at >= back.UnixMicro() {
			first = at
			break
		}
	}
	if first == 0 {
		t.Fatalf("no acquisition after Redis came back (%d before, %d errors)", o.enters, o.errors)
	}
	resumed := time.Duration(first-back.UnixMicro()) * time.Microsecond
	t.Logf("Redis down 1 s: %d acquire and %d release errors reported, work resumed %v after Redis was back, %d acquisitions in all",
		o.errors, o.releaseErrors, resumed.Round(time.Millisecond), o.enters)
	// go-redis's own retries may carry a waiting Acquire across the
	// outage; the holders' releases cannot succeed (the restarted Redis
	// has no record of their leases).
	if o.errors+o.releaseErrors == 0 {
		t.Error("no caller saw an error while Redis was down")
	}
	if resumed > time.Second {
		t.Errorf("work resumed %v after Redis was back", resumed)
	}
	// Each process's client came back too.
	if idle := o.idle(ws, back.UnixMicro()); len(idle) > 0 {
		t.Errorf("%v acquired nothing in the 2 s after Redis was back", idle)
	}
	// Everything was released: the whole capacity is free, at once
	// unless a worker's Close said that a clean-up of its did not land
	// (on a busy machine, a withdrawal or a give-back past Close's
	// bound), and then once Redis has dropped what it left: within a
	// lease TTL and a waiter TTL.
	c := client(t, s)
	whole := fairlock.Request{Name: s.name, Capacity: s.capacity, Permits: s.capacity}
	l, err := c.TryAcquire(context.Background(), whole)
	if err != nil {
		if len(o.closeErrors) == 0 {
			t.Fatalf("whole capacity after the restart, every worker closed cleanly: %v\nerrors %q\n%s", err, o.errorLines, keysNow(s))
		}
		t.Logf("whole capacity after the restart: %v; the workers' Close said %q", err, o.closeErrors)
		ctx, cancel := context.WithTimeout(context.Background(), s.lease+s.waiter+2*time.Second)
		defer cancel()
		if l, err = c.Acquire(ctx, whole); err != nil {
			t.Fatalf("whole capacity not granted within a lease and a waiter TTL (and 2 s) of the workers' end: %v", err)
		}
	}
	_ = l.Release(context.Background())
}

// 6. Hundreds of waiters cancelled at random moments leave no ghost: once
// the holder releases, a fresh request is granted at once, and no key
// remains when all is idle.
func TestCancelledWaitersLeaveNoGhost(t *testing.T) {
	redistest.Long(t)
	b := redistest.RealBackend(t)
	s := newSpec(t, b.Addr, "ghosts", 1)
	ctx := context.Background()
	held, err := client(t, s).Acquire(ctx, s.req())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wrong []error
	var cs []*fairlock.Client
	for range 10 {
		c := client(t, s)
		cs = append(cs, c)
		for range 30 {
			wg.Go(func() {
				wctx, cancel := context.WithTimeout(ctx, time.Duration(1+rand.IntN(300))*time.Millisecond)
				defer cancel()
				if _, err := c.Acquire(wctx, s.req()); !errors.Is(err, context.DeadlineExceeded) {
					mu.Lock()
					wrong = append(wrong, err)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if len(wrong) > 0 {
		t.Fatalf("%d cancelled waiters returned something else, first: %v", len(wrong), wrong[0])
	}
	// A withdrawal that did not answer within the grace finishes in the
	// background (on a loaded machine, after Acquire returned); Close
	// waits for it.
	for _, c := range cs {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := client(t, s).TryAcquire(ctx, s.req())
	if err != nil {
		t.Fatalf("fresh request after 300 cancelled waiters: %v", err)
	}
	_ = l.Release(ctx)
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	// Once idle, only the state hash and the tombstones stay (each
	// cancelled waiter's withdrawal leaves one), for at most twice the
	// tombstones' lifetime (20 s): while in use, the keys' expiry moves
	// as far past the latest need as that lies ahead (keys_exp), and an
	// idle semaphore keeps it. The state counts nobody.
	deadline := time.Now().Add(5 * time.Second)
	for {
		keys, _ := rdb.Keys(ctx, s.prefix+"*").Result()
		var other []string
		for _, k := range keys {
			ttl, _ := rdb.PTTL(ctx, k).Result()
			if !(strings.HasSuffix(k, ":s") || strings.HasSuffix(k, ":t")) || ttl <= 0 || ttl > 41*time.Second {
				other = append(other, k)
			}
		}
		if len(other) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys remain once idle: %v\n%s", other, keysNow(s))
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, err := rdb.HMGet(ctx, s.prefix+"{ghosts}:s", "used", "nh", "nq").Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range st {
		if v != nil && v != "0" {
			t.Fatalf("idle state field %d is %v, want 0", i, v)
		}
	}
}

// keysNow describes every key under s's prefix: its type, its TTL and its
// contents, with Redis's clock, for a failure's message.
func keysNow(s spec) string {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr})
	defer rdb.Close()
	ctx := context.Background()
	var b strings.Builder
	now, _ := rdb.Time(ctx).Result()
	fmt.Fprintf(&b, "redis time %d ms\n", now.UnixMilli())
	keys, err := rdb.Keys(ctx, s.prefix+"*").Result()
	if err != nil {
		return err.Error()
	}
	slices.Sort(keys)
	for _, k := range keys {
		typ := rdb.Type(ctx, k).Val()
		var v any
		switch typ {
		case "hash":
			v = rdb.HGetAll(ctx, k).Val()
		case "zset":
			v = rdb.ZRangeWithScores(ctx, k, 0, -1).Val()
		case "list":
			v = rdb.LRange(ctx, k, 0, -1).Val()
		case "string":
			v = rdb.Get(ctx, k).Val()
		}
		fmt.Fprintf(&b, "%q %s pttl %v: %v\n", k, typ, rdb.PTTL(ctx, k).Val(), v)
	}
	return b.String()
}
