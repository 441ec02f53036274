package faulttest

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// settledBound is how soon after Redis settles the next waiter must hold
// the permits a refused release left: the resend backoff is capped at
// 500 ms, and a queued waiter hears of its grant within milliseconds; the
// rest is room for a busy machine, and still a fiftieth of the
// 60 s lease TTL the holder uses, which the waiter would wait without
// the resend.
const settledBound = 1200 * time.Millisecond

// redisErr is an error reply from Redis, as go-redis reports one.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

// refuseReleases is a go-redis hook that fails release scripts (the
// script's op "release" or "leave") with err while on is set, either before
// they reach Redis or, with ran, after Redis ran them (a reply lost).
type refuseReleases struct {
	on      atomic.Bool
	ran     bool
	err     error
	mu      sync.Mutex
	refused int
}

func (h *refuseReleases) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refuseReleases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *refuseReleases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !h.on.Load() || !isRelease(cmd) {
			return next(ctx, cmd)
		}
		if h.ran {
			_ = next(ctx, cmd)
		}
		h.mu.Lock()
		h.refused++
		h.mu.Unlock()
		cmd.SetErr(h.err)
		return h.err
	}
}

// isRelease reports whether cmd runs a fairlock script with op "release"
// or "leave" (the script's first argument after its keys).
func isRelease(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "evalsha", "eval", "fcall", "evalsha_ro", "eval_ro", "fcall_ro":
	default:
		return false
	}
	args := cmd.Args()
	if len(args) < 3 {
		return false
	}
	n, ok := args[2].(int)
	if !ok || 3+n >= len(args) {
		return false
	}
	op := args[3+n]
	return op == "release" || op == "leave"
}

// A release refused by a transient error (a slot migrating, a failover,
// a restarted server loading, a dropped connection) is sent again until it
// lands: the queued waiter holds the permits soon after Redis settles, not
// a lease TTL (60 s) later. A refusal that Redis will repeat is not.
func TestReleaseResentAfterTransientError(t *testing.T) {
	for _, tc := range []struct {
		what string
		err  error
		ran  bool
	}{
		{"TRYAGAIN", redisErr("TRYAGAIN Multiple keys request during rehashing of slot"), false},
		{"READONLY", redisErr("READONLY You can't write against a read only replica."), false},
		{"LOADING", redisErr("LOADING Redis is loading the dataset in memory"), false},
		{"connection dropped before", io.EOF, false},
		{"connection dropped after it ran", io.ErrUnexpectedEOF, true},
	} {
		t.Run(tc.what, func(t *testing.T) {
			e := fltest.New(t, redistest.RealBackend(t))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			h := &refuseReleases{err: tc.err, ran: tc.ran}
			rdb := e.B.Client(t)
			hooked := redistest.AddHook[fairlock.Option](rdb, h)
			holder := e.ClientOn(rdb, hooked, fairlock.WithLeaseTTL(60*time.Second))
			waiter := e.Client()
			req := fairlock.Request{Name: "r", Capacity: 1, Permits: 1}
			l, err := holder.Acquire(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			got, gone := make(chan time.Time, 1), make(chan struct{})
			go func() {
				defer close(gone)
				wl, err := waiter.Acquire(ctx, req)
				if err != nil {
					t.Errorf("the waiter's Acquire: %v", err)
					close(got)
					return
				}
				got <- time.Now()
				if err := wl.Release(ctx); err != nil {
					t.Errorf("the waiter's Release: %v", err)
				}
			}()
			fltest.WaitWaiters(t, holder, req.Name, 1)

			h.on.Store(true)
			err = l.Release(ctx)
			t.Logf("Release while Redis refuses it: %v", err)
			if !errors.Is(err, fairlock.ErrRedis) {
				t.Errorf("Release = %v, want an error matching ErrRedis", err)
			}
			// Redis keeps refusing for a while: unless the release ran
			// (only its reply was lost), the waiter must not be granted
			// (the permits are still held in Redis); if it ran, the
			// resends that find it done must not grant twice.
			select {
			case at := <-got:
				if !tc.ran {
					t.Fatalf("the waiter was granted at %v while the release was refused", at)
				}
				got <- at
			case <-time.After(300 * time.Millisecond):
			}
			settled := time.Now()
			h.on.Store(false)
			select {
			case at, ok := <-got:
				if !ok {
					return
				}
				h.mu.Lock()
				refused := h.refused
				h.mu.Unlock()
				t.Logf("granted %v after Redis settled (%d refusals)", at.Sub(settled).Round(time.Millisecond), refused)
				if d := at.Sub(settled); d > settledBound {
					t.Errorf("the waiter was granted %v after Redis settled, want within %v", d.Round(time.Millisecond), settledBound)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the waiter was not granted within 5 s of Redis settling (the lease TTL is 60 s): the refused release was not sent again")
			}
			<-gone
			if st, err := waiter.Status(ctx, req.Name); err != nil || st.InUse != 0 || st.Queued != 0 {
				t.Errorf("after both leases ended: Status %+v (%v), want nothing in use or queued", st, err)
			}
			if !errors.Is(l.Err(), fairlock.ErrNotHeld) {
				t.Errorf("after the release: lease Err = %v, want ErrNotHeld", l.Err())
			}
		})
	}
}

// A release that fails with an error Redis will repeat (here a script
// error) is not sent again.
func TestReleaseNotResentAfterLastingError(t *testing.T) {
	e := fltest.New(t, redistest.RealBackend(t))
	ctx := context.Background()
	h := &refuseReleases{err: redisErr("ERR Error running script (call to f_x): @user_script:1: bad")}
	rdb := e.B.Client(t)
	hooked := redistest.AddHook[fairlock.Option](rdb, h)
	c := e.ClientOn(rdb, hooked, fairlock.WithLeaseTTL(60*time.Second))
	l, err := c.Acquire(ctx, fairlock.Request{Name: "r", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	h.on.Store(true)
	if err := l.Release(ctx); !errors.Is(err, fairlock.ErrRedis) {
		t.Errorf("Release = %v, want ErrRedis", err)
	}
	time.Sleep(500 * time.Millisecond)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.refused != 1 {
		t.Errorf("the release was sent %d times, want once", h.refused)
	}
}
