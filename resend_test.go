package fairlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// replyError is a Redis error reply, as go-redis gives it.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{replyError("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{replyError("LOADING Redis is loading the dataset in memory"), true},
		{replyError("READONLY You can't write against a read only replica."), true},
		{replyError("MASTERDOWN Link with MASTER is down"), true},
		{replyError("CLUSTERDOWN The cluster is down"), true},
		{replyError("MOVED 3999 127.0.0.1:6381"), true},
		{replyError("ASK 3999 127.0.0.1:6381"), true},
		{replyError("BUSY Redis is busy running a script."), true},
		{fmt.Errorf("wrapped: %w", io.EOF), true},
		{&net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}, true},
		{replyError("OOM command not allowed when used memory > 'maxmemory'."), false},
		{replyError("FAIRLOCK_CAPACITY 3 1"), false},
		{replyError("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{replyError("ERR Error running script"), false},
		{replyError("BUSYKEY Target key name already exists."), false},
		{redis.ErrClosed, false},
		{nil, false},
	} {
		if got := transient(fromClient(tc.err)); got != tc.want {
			t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// An error from go-redis reads the same after fromClient (its text, and
// errors.As finding go-redis's error for a caller who matches it), while
// the engine reads a server's reply and a pool timeout as its own.
func TestFromClient(t *testing.T) {
	reply := fmt.Errorf("a hook's words: %w", replyError("READONLY You can't write against a read only replica."))
	for _, tc := range []struct {
		name      string
		err       error
		reply     string // the server's words, or "" for no error reply
		slow      bool
		transient bool
	}{
		{"an error reply, wrapped by a hook", reply, "READONLY You can't write against a read only replica.", false, true},
		{"a script's refusal", replyError("FAIRLOCK_CAPACITY 3 1"), "FAIRLOCK_CAPACITY 3 1", false, false},
		{"the pool's timeout", redis.ErrPoolTimeout, "", true, false},
		{"a closed client", redis.ErrClosed, "", false, false},
		{"a connection reset", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := fromClient(tc.err)
			if got.Error() != tc.err.Error() {
				t.Errorf("text %q, want %q", got, tc.err)
			}
			if !errors.Is(got, tc.err) {
				t.Errorf("%v does not match the client's error", got)
			}
			var er *backend.ReplyError
			if ok := errors.As(got, &er); ok != (tc.reply != "") || ok && er.Reply != tc.reply {
				t.Errorf("error reply %v (%+v), want %q", ok, er, tc.reply)
			}
			var rerr redis.Error
			if errors.As(got, &rerr) != (tc.reply != "") {
				t.Errorf("errors.As(%v, redis.Error) = %v", got, !(tc.reply != ""))
			}
			if fault.Slow(got) != tc.slow || transient(got) != tc.transient {
				t.Errorf("slow %v, transient %v; want %v, %v", fault.Slow(got), transient(got), tc.slow, tc.transient)
			}
		})
	}
	if fromClient(nil) != nil {
		t.Error("fromClient(nil) is not nil")
	}
}

// failReleases is a go-redis hook that refuses the first n scripts of op
// ("release" unless set) with err, before they reach Redis.
type failReleases struct {
	n   atomic.Int64
	op  string
	err error
}

func (f *failReleases) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failReleases) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *failReleases) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if redistest.RunsOp(cmd, cmp.Or(f.op, "release")) && f.n.Add(-1) >= 0 {
			cmd.SetErr(f.err)
			return f.err
		}
		return next(ctx, cmd)
	}
}

// A release refused by an error that passes (a Cluster slot migrating:
// TRYAGAIN) is sent again in the background until it lands: the queued
// waiter is granted soon after, not a lease TTL later.
func TestReleaseSentAgain(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		hook := &failReleases{err: replyError("TRYAGAIN Multiple keys request during rehashing of slot")}
		hook.n.Store(3)
		hrdb := b.Client(t)
		hrdb.AddHook(hook)
		holder, err := New(hrdb, WithPrefix(prefix), WithLeaseTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		waiter, err := New(b.Client(t), WithPrefix(prefix), WithLeaseTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		defer waiter.Close()
		req := Request{Name: "again", Capacity: 1, Permits: 1}
		l, err := holder.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		granted := make(chan time.Time, 1)
		go func() {
			if w, err := waiter.Acquire(ctx, req); err == nil {
				granted <- time.Now()
				_ = w.Release(ctx)
			}
		}()
		waitQueued(t, waiter, "again", 1)
		start := time.Now()
		err = l.Release(ctx)
		if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "sent again") {
			t.Fatalf("Release refused with TRYAGAIN = %v, want ErrRedis saying it is sent again", err)
		}
		if !errors.Is(l.Err(), ErrNotHeld) {
			t.Fatalf("lease after such a Release: %v, want it released", l.Err())
		}
		select {
		case at := <-granted:
			t.Logf("the waiter was granted %v after the refused Release", at.Sub(start))
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter was not granted within 5 s of a refused release (its lease TTL is a minute)")
		}
		if n := hook.n.Load(); n > -1 {
			t.Fatalf("%d refusals left: the release was not sent again", n+1)
		}
	})
}

// A cancelled waiter's withdrawal refused by an error that passes is sent
// again: the waiter behind it is granted soon after the holder releases,
// not a waiter TTL later.
func TestLeaveSentAgain(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		prefix := redistest.Prefix(t)
		hook := &failReleases{op: "leave", err: replyError("LOADING Redis is loading the dataset in memory")}
		hook.n.Store(3)
		crdb := b.Client(t)
		crdb.AddHook(hook)
		opts := []Option{WithPrefix(prefix), WithWaiterTTL(time.Minute)}
		cancelled, err := New(crdb, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cancelled.Close()
		other, err := New(b.Client(t), opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		req := Request{Name: "leave", Capacity: 1, Permits: 1}
		l, err := other.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		gone := make(chan error, 1)
		go func() {
			_, err := cancelled.Acquire(cctx, req)
			gone <- err
		}()
		waitQueued(t, other, "leave", 1)
		granted := make(chan error, 1)
		go func() {
			w, err := other.Acquire(ctx, req)
			if err == nil {
				_ = w.Release(ctx)
			}
			granted <- err
		}()
		waitQueued(t, other, "leave", 2)
		cancel()
		if err := <-gone; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Acquire = %v, want context.Canceled", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-granted:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the waiter behind a cancelled one was not granted within 5 s (the waiter TTL is a minute)")
		}
		if n := hook.n.Load(); n > -1 {
			t.Fatalf("%d refusals left: the leave was not sent again", n+1)
		}
	})
}
