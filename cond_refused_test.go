package fairlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// condTTL is the lease TTL of the refused-wait tests: a waiter that had to
// wait it out would be far past their bound of condPrompt.
const (
	condTTL    = 8 * time.Second
	condPrompt = 2 * time.Second
)

// condRefused locks the mutex name with holder, queues a waiter of other
// behind it, calls refuse (which makes the holder's next wait fail), and
// has the holder wait on the mutex's condition. The wait must fail with
// ErrRedis, saying why (want) and that the lease was released; the lease
// counts as released; and the waiter must be granted within condPrompt of
// undo (called after the wait returns; nil: at once), not at the lease's
// TTL. It returns the failed wait's error.
func condRefused(t *testing.T, ctx context.Context, holder, other *Client, name string, refuse, undo func(), want string) error {
	t.Helper()
	req := Request{Name: name, Capacity: 1, Permits: 1}
	l, err := holder.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		w, err := other.Acquire(context.Background(), req)
		if err == nil {
			err = w.Release(context.Background())
		}
		granted <- err
	}()
	waitQueued(t, other, name, 1)
	refuse()
	start := time.Now()
	nl, err := l.condWait(ctx, "")
	took := time.Since(start)
	if nl != nil {
		t.Errorf("a refused CondWait returned a lease (err %v)", err)
	}
	if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "lease was released") {
		t.Errorf("a refused CondWait = %v, want ErrRedis saying %q and that the lease was released", err, want)
	}
	if errors.Is(err, ErrLeaseLost) {
		t.Errorf("a refused CondWait = %v: matches ErrLeaseLost, but the lease was released, not lost", err)
	}
	if took > condPrompt {
		t.Errorf("the refused CondWait returned after %v", took)
	}
	if !errors.Is(l.Err(), ErrNotHeld) {
		t.Errorf("the lease after a refused CondWait: Err = %v, want ErrNotHeld (released)", l.Err())
	}
	if err := l.Release(ctx); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Release after a refused CondWait = %v, want ErrNotHeld", err)
	}
	if undo != nil {
		undo()
		start = time.Now()
	}
	select {
	case gerr := <-granted:
		if gerr != nil {
			t.Fatalf("the waiter behind the holder: %v", gerr)
		}
		t.Logf("wait refused with %v; the waiter behind was granted within %v", err, time.Since(start).Round(time.Millisecond))
	case <-time.After(condPrompt):
		t.Fatalf("the waiter behind a refused CondWait was not granted within %v (the lease TTL is %v): the lease was not released", condPrompt, condTTL)
	}
	return err
}

// eventually waits until cond holds, failing t after 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
	}
}

// condWaiters returns how many tickets wait on the default condition of
// the semaphore name.
func condWaiters(t *testing.T, c *Client, rdb redis.Cmdable, name string) int64 {
	t.Helper()
	k, err := c.keys(name)
	if err != nil {
		t.Fatal(err)
	}
	n, err := rdb.ZCard(context.Background(), condKeys(k, "")[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A CondWait refused by a full Redis (maxmemory reached, noeviction: the
// wait, which adds a waiter, has no allow-oom flag) releases its lease
// there and then, as a release runs on a full Redis: the waiter queued
// behind is granted at once, not at the lease's TTL. Through FCALL and
// through EVAL alike.
func TestCondWaitRefusedAtMaxmemory(t *testing.T) {
	redistest.RealBackend(t) // a real server, or a failure under CI=true
	noTransform(t)
	for _, evalOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("evalOnly=%v", evalOnly), func(t *testing.T) {
			srv, err := redisserver.Start("--maxmemory-policy", "noeviction")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Stop)
			ctx := context.Background()
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			prefix := WithPrefix(redistest.Prefix(t))
			holder := fnClient(t, redis.NewClient(&redis.Options{Addr: srv.Addr}), evalOnly, prefix, WithLeaseTTL(condTTL))
			other := fnClient(t, redis.NewClient(&redis.Options{Addr: srv.Addr}), evalOnly, prefix, WithLeaseTTL(condTTL))
			full := func() {
				if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
					t.Fatal(err)
				}
				if err := rdb.Set(ctx, "junk", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
					t.Fatalf("a write with maxmemory 1 = %v, want OOM", err)
				}
			}
			condRefused(t, ctx, holder, other, "full", full, nil, "OOM")
			if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if n := condWaiters(t, holder, rdb, "full"); n != 0 {
				t.Fatalf("%d waiters on the condition after a refused wait, want 0", n)
			}
		})
	}
}

// lostReply is a go-redis hook that reports err in place of the replies
// of the first n scripts of op that run, as when a connection drops after
// the command was sent: the script ran, the caller cannot know it. (A
// script not loaded yet, NOSCRIPT, is let through.)
type lostReply struct {
	n   atomic.Int64
	op  string
	err error
}

func (f *lostReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *lostReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *lostReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && redistest.RunsOp(cmd, f.op) && f.n.Add(-1) >= 0 {
			cmd.SetErr(f.err)
			return f.err
		}
		return err
	}
}

// A CondWait whose script was refused by an error that passes (TRYAGAIN,
// READONLY) or out of memory, or whose reply was lost (the script may have
// run), releases the lease as Release does: the release is sent at once,
// and sent again while it meets errors that pass; the waiter queued behind
// is granted at once, not at the lease's TTL; a waiter the script may
// have added to the condition is withdrawn.
func TestCondWaitRefusedReleases(t *testing.T) {
	tryAgain := replyError("TRYAGAIN Multiple keys request during rehashing of slot")
	for _, tc := range []struct {
		name     string
		err      error
		ran      bool  // the wait runs, its reply is lost
		releases int64 // releases refused with TRYAGAIN after the wait
	}{
		{name: "TRYAGAIN", err: tryAgain},
		{name: "READONLY", err: replyError("READONLY You can't write against a read only replica.")},
		{name: "OOM", err: replyError("OOM command not allowed when used memory > 'maxmemory'.")},
		{name: "TRYAGAIN, then the release too", err: tryAgain, releases: 3},
		{name: "reply lost", err: fmt.Errorf("read: %w", io.ErrUnexpectedEOF), ran: true},
		{name: "reply lost, then the release refused", err: fmt.Errorf("read: %w", io.ErrUnexpectedEOF), ran: true, releases: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				ctx := context.Background()
				prefix := WithPrefix(redistest.Prefix(t))
				hrdb := b.Client(t)
				// Both hooks are idle (n 0 lets the first call through)
				// until refuse arms them.
				refusedWait := &failReleases{op: "wait", err: tc.err}
				lostWait := &lostReply{op: "wait", err: tc.err}
				refusedRelease := &failReleases{op: "release", err: tryAgain}
				if tc.ran {
					hrdb.AddHook(lostWait)
				} else {
					hrdb.AddHook(refusedWait)
				}
				hrdb.AddHook(refusedRelease)
				holder, err := New(hrdb, prefix, WithLeaseTTL(condTTL))
				if err != nil {
					t.Fatal(err)
				}
				defer holder.Close()
				other, err := New(b.Client(t), prefix, WithLeaseTTL(condTTL))
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
				refuse := func() {
					refusedWait.n.Store(1)
					lostWait.n.Store(1)
					refusedRelease.n.Store(tc.releases)
				}
				want := strings.Fields(tc.err.Error())[0]
				condRefused(t, ctx, holder, other, "refused", refuse, nil, want)
				// (The release is sent again with backoff; when the wait ran,
				// it released the lease itself.)
				eventually(t, "the release sent (again) until it lands", func() bool { return refusedRelease.n.Load() <= -1 })
				raw := b.Client(t)
				eventually(t, "no waiter on the condition", func() bool { return condWaiters(t, holder, raw, "refused") == 0 })
			})
		})
	}
}

// A CondWait that meets a Redis refusing connections releases its lease
// once Redis can be reached again (the release is sent again, with
// backoff, until the lease would have expired): the waiter queued behind
// is granted then, not at the lease's TTL.
func TestCondWaitUnreachableReleases(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	for _, late := range []bool{false, true} {
		// late: the wait's own failure comes after the client learns of
		// the refused dial, which the wait then reports at once (its
		// clean-up runs when the call ends).
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				prefix := WithPrefix(redistest.Prefix(t))
				var refusing atomic.Bool
				hrdb := b.Client(t, func(o *redis.Options) {
					// go-redis's own retries would hide the refusal.
					o.MaxRetries, o.DialerRetries, o.DialerRetryTimeout = -1, 1, time.Millisecond
					// An idle connection is closed when next taken, so the
					// wait dials.
					o.ConnMaxIdleTime = 20 * time.Millisecond
					o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
						if refusing.Load() {
							return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
						}
						var d net.Dialer
						return d.DialContext(ctx, network, addr)
					}
				})
				if late {
					hrdb.AddHook(&slowFailure{op: "wait", delay: 200 * time.Millisecond})
				}
				holder, err := New(hrdb, prefix, WithLeaseTTL(condTTL), WithWaiterTTL(time.Second))
				if err != nil {
					t.Fatal(err)
				}
				defer holder.Close()
				other, err := New(b.Client(t), prefix, WithLeaseTTL(condTTL))
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
				refuse := func() {
					refusing.Store(true)
					time.Sleep(50 * time.Millisecond) // past ConnMaxIdleTime
				}
				undo := func() {
					time.Sleep(500 * time.Millisecond) // releases sent meanwhile are refused
					refusing.Store(false)
				}
				err = condRefused(t, ctx, holder, other, "unreachable", refuse, undo, "refused")
				if late && !fault.IsDialError(err) {
					t.Fatalf("the wait = %v, want it to report the refused dial first", err)
				}
			})
		})
	}
}

// slowFailure is a go-redis hook that holds back a failure of a script of
// op by delay.
type slowFailure struct {
	op    string
	delay time.Duration
}

func (f *slowFailure) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *slowFailure) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *slowFailure) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && redistest.RunsOp(cmd, f.op) {
			time.Sleep(f.delay)
		}
		return err
	}
}
