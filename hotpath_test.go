package fairlock

import (
	"bufio"
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// scriptRun is one script call as a real server's MONITOR shows it: the
// FCALL (or EVALSHA) and the commands it ran, in order.
type scriptRun struct {
	fn   string   // the function called (or the script's SHA-1)
	cmds []string // the call and its commands, upper case
}

// monitorScripts watches the server of admin and returns a stop function
// that gives the script calls it saw whose first key starts with prefix.
// A script's commands follow its call in MONITOR's stream with nothing
// between (a script runs alone), so other tests' traffic on the server
// does not mix in.
func monitorScripts(t *testing.T, b *redistest.Backend, prefix string) (stop func() []scriptRun) {
	t.Helper()
	conn, err := net.Dial("tcp", b.Addr)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR answered %q, %v", line, err)
	}
	var (
		mu   sync.Mutex
		runs []scriptRun
		cur  *scriptRun
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			mu.Lock()
			_, rest, _ := strings.Cut(line, "] ")
			fields := strings.Fields(rest)
			name := ""
			if len(fields) > 0 {
				name = strings.ToUpper(strings.Trim(fields[0], `"`))
			}
			switch {
			case strings.Contains(line, " lua] ") && cur != nil:
				cur.cmds = append(cur.cmds, name)
			case (name == "FCALL" || name == "EVALSHA") && len(fields) > 3 && strings.HasPrefix(strings.Trim(fields[3], `"`), prefix):
				runs = append(runs, scriptRun{fn: strings.Trim(fields[1], `"`), cmds: []string{name}})
				cur = &runs[len(runs)-1]
			default:
				cur = nil
			}
			mu.Unlock()
		}
	}()
	return func() []scriptRun {
		// Let the stream catch up with what the server has run.
		time.Sleep(200 * time.Millisecond)
		_ = conn.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(runs)
	}
}

// The commands a contended mutex's hot paths run on a real server, one
// by one: the uncontended acquire and release, acquires that queue behind
// a holder, and releases that hand on to a live waiter of another
// process. These are the engine's cost ("the fairness tax"): a change
// that adds a command to one of them fails here, with the commands each
// call ran.
func TestHotPathCommands(t *testing.T) {
	b := redistest.RealBackend(t)
	noTransform(t)
	ctx := context.Background()
	if err := b.Client(t).Do(ctx, "FUNCTION", "LIST", "LIBRARYNAME", "none").Err(); err != nil {
		// Redis 6.2: the scripts run by EVALSHA, whose calls MONITOR
		// does not name.
		t.Skipf("no functions on this server (%v)", err)
	}
	prefix := redistest.Prefix(t)
	// Waiter and lease TTLs long enough that no refresh or renewal runs
	// within the test. One client per process.
	client := func() *Client {
		c, err := New(b.Client(t), WithPrefix(prefix), WithWaiterTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	h, w1, w2 := client(), client(), client()
	req := Request{Name: "hot", Capacity: 1, Permits: 1, LeaseTTL: time.Minute}
	acquire := func(c *Client) *Lease {
		t.Helper()
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	release := func(l *Lease) {
		t.Helper()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A first cycle makes the state and loads the library.
	release(acquire(h))

	stop := monitorScripts(t, b, prefix)
	held := acquire(h)
	// Two other processes queue behind the holder, in turn.
	leases := make(chan *Lease, 2)
	for i, c := range []*Client{w1, w2} {
		go func() {
			l, err := c.Acquire(ctx, req)
			if err != nil {
				t.Error(err)
			}
			leases <- l
		}()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			st, err := h.Status(ctx, "hot")
			if err != nil {
				t.Fatal(err)
			}
			if st.Queued == int64(i+1) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("waiter %d did not queue", i+1)
			}
		}
	}
	release(held) // to the first waiter
	for range 2 {
		l := <-leases
		if l == nil {
			return
		}
		release(l) // to the second waiter; then nobody
	}
	runs := stop()

	var got []string
	for _, r := range runs {
		if !strings.Contains(r.fn, "status") {
			got = append(got, strings.Join(r.cmds, " "))
		}
	}
	want := []string{
		"FCALL TIME HMGET HSET",                            // uncontended acquire
		"FCALL TIME HMGET ZADD HSET PEXPIREAT",             // the first waiter queues (the queue's key made: its TTL)
		"FCALL TIME HMGET ZADD HSET",                       // a queued acquire
		"FCALL TIME HMGET ZPOPMIN RPUSH HSET PEXPIRE",      // a handing release (the wake list's TTL)
		"FCALL TIME HMGET ZPOPMIN RPUSH HSET HDEL PEXPIRE", // the same to the last waiter (its count of 0 goes)
		"FCALL TIME HMGET HDEL",                            // uncontended release
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the hot paths ran\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// A withdrawal leaves its ticket's tombstone for 10–20 s (so that a late
// copy of its acquire does nothing). The uncontended cycle on that
// semaphore meanwhile costs what it costs without one: the keys' expiry
// covers the tombstone already and stays, so neither call reads or moves
// the tombstones' key.
func TestHotPathCommandsWithTombstone(t *testing.T) {
	b := redistest.RealBackend(t)
	noTransform(t)
	ctx := context.Background()
	if err := b.Client(t).Do(ctx, "FUNCTION", "LIST", "LIBRARYNAME", "none").Err(); err != nil {
		t.Skipf("no functions on this server (%v)", err)
	}
	prefix := redistest.Prefix(t)
	c, err := New(b.Client(t), WithPrefix(prefix), WithWaiterTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	req := Request{Name: "hot", Capacity: 1, Permits: 1, LeaseTTL: 10 * time.Second}
	held, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	// A waiter that gives up: its withdrawal leaves the tombstone.
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(wctx, req)
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st, err := c.Status(ctx, "hot")
		if err != nil {
			t.Fatal(err)
		}
		if st.Queued == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not queue")
		}
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled waiter acquired")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := b.Client(t)
	if n, err := rdb.ZCard(ctx, prefix+"{hot}:t").Result(); err != nil || n != 1 {
		t.Fatalf("tombstones after the withdrawal: %d, %v; want 1", n, err)
	}

	stop := monitorScripts(t, b, prefix)
	for range 3 {
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	runs := stop()
	var got []string
	for _, r := range runs {
		if !strings.Contains(r.fn, "status") {
			got = append(got, strings.Join(r.cmds, " "))
		}
	}
	var want []string
	for range 3 {
		want = append(want, "FCALL TIME HMGET HSET", "FCALL TIME HMGET HDEL")
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the uncontended cycle beside a tombstone ran\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}
