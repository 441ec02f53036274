package faulttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/barrier"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/latch"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

// resendOn runs every pipeline that calls op a second time on another
// connection (its own client's) and hands the caller the second reply:
// what go-redis's retry does when the first reply is lost with its
// connection (the retry takes another connection from the pool, or dials).
type resendOn struct {
	mu     sync.Mutex
	op     string
	resend *redis.Client
	seen   []string
}

func (*resendOn) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (*resendOn) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *resendOn) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.mu.Lock()
		op := h.op
		h.mu.Unlock()
		if op == "" || !redistest.RunsOp(cmds[0], op) {
			return err
		}
		first := fmt.Sprint(cmds[0].(*redis.Cmd).Val(), " wait=", cmds[len(cmds)-1].(*redis.IntCmd).Val())
		_, err = h.resend.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, c := range cmds {
				_ = p.Process(ctx, c)
			}
			return nil
		})
		h.mu.Lock()
		h.seen = append(h.seen, "first "+first+"; resent "+fmt.Sprint(cmds[0].(*redis.Cmd).Val(), " wait=", cmds[len(cmds)-1].(*redis.IntCmd).Val()))
		h.mu.Unlock()
		return err
	}
}

// With WithReplicaAck, a call whose reply is lost is sent again, often on
// another connection; the resend finds its first run's outcome and writes
// nothing. WAIT counts the replicas that have its connection's last
// write, so it must be made to cover what the master ran before (the
// first run's writes): a call resent while the replica has stopped
// acknowledging must still fail with ErrNotReplicated, not succeed on the
// strength of a WAIT that covered nothing. (Acquire and a condition's Wait
// confirm what a resend finds with a write of their own.)
func TestResentChangeAwaitsReplicas(t *testing.T) {
	redistest.RealBackend(t) // skips, or fails under CI, without redis-server
	master, err := redisserver.Start("--repl-diskless-sync-delay", "0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(master.Stop)
	replica, err := redisserver.Start("--replicaof", "127.0.0.1", fmt.Sprint(master.Port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Stop)
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	for {
		info, _ := rc.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rc.Close()

	prefix := redistest.Prefix(t)
	hook := &resendOn{resend: redis.NewClient(&redis.Options{Addr: master.Addr})}
	t.Cleanup(func() { _ = hook.resend.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(hook)
	// Two seconds: a live replica acknowledges each row's setup under a
	// loaded -race run too (100 ms was not enough there); the paused one
	// makes each call under test wait them out.
	c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithReplicaAck(1, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	prdb := redis.NewClient(&redis.Options{Addr: master.Addr})
	t.Cleanup(func() { _ = prdb.Close() })
	plain, err := fairlock.New(prdb, fairlock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })

	for _, tc := range []struct {
		what, op string
		setup    func(t *testing.T, ctx context.Context) func() error
	}{
		{"Release", "release", func(t *testing.T, ctx context.Context) func() error {
			l, err := c.Acquire(ctx, fairlock.Request{Name: "rel", Capacity: 1, Permits: 1})
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return l.Release(ctx) }
		}},
		{"latch CountDown", "latch_down", func(t *testing.T, ctx context.Context) func() error {
			l, err := latch.New(c, "down", 1)
			if err != nil {
				t.Fatal(err)
			}
			return func() error { return l.CountDown(ctx) }
		}},
		{"barrier Await that completes its round", "barrier_await", func(t *testing.T, ctx context.Context) func() error {
			br, err := barrier.New(c, "last", 1)
			if err != nil {
				t.Fatal(err)
			}
			return func() error { _, err := br.Await(ctx); return err }
		}},
		{"Cond.Signal that wakes a waiter", "signal", func(t *testing.T, ctx context.Context) func() error {
			// A plain client's waiter waits on the condition.
			pm, err := semaphore.NewMutex(plain, "cs")
			if err != nil {
				t.Fatal(err)
			}
			pcv, err := semaphore.NewNamedCond(pm, "c")
			if err != nil {
				t.Fatal(err)
			}
			l, err := pm.Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				if l, _ := pcv.Wait(ctx, l); l != nil {
					_ = l.Release(context.Background())
				}
			}()
			for {
				st, err := plain.Status(ctx, "cs")
				if err != nil {
					t.Fatal(err)
				}
				if st.Held == 0 { // released by the wait: it waits
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			m, err := semaphore.NewMutex(c, "cs")
			if err != nil {
				t.Fatal(err)
			}
			cv, err := semaphore.NewNamedCond(m, "c")
			if err != nil {
				t.Fatal(err)
			}
			return func() error { _, err := cv.Signal(ctx); return err }
		}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			call := tc.setup(t, ctx)                // acknowledged by the live replica
			if err := replica.Pause(); err != nil { // the replica stops applying (and acknowledging) writes
				t.Fatal(err)
			}
			defer func() { _ = replica.Resume() }()
			hook.mu.Lock()
			hook.op, hook.seen = tc.op, nil
			hook.mu.Unlock()
			err := call()
			hook.mu.Lock()
			hook.op = ""
			t.Logf("pipelines: %v", hook.seen)
			hook.mu.Unlock()
			if !errors.Is(err, fairlock.ErrNotReplicated) {
				t.Errorf("%s resent after a lost reply, replica paused = %v, want ErrNotReplicated", tc.what, err)
			}
		})
	}
}
