package fairlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// condWaitHook is a go-redis hook: once holdWait is set, the next "wait"
// script runs in Redis and its reply is held back until release closes;
// once failLeave is set, every "leave" script fails with leaveErr.
type condWaitHook struct {
	holdWait  atomic.Bool
	held      chan struct{}
	release   chan struct{}
	failLeave atomic.Bool
	leaveErr  error
	leaves    atomic.Int32
	log       func(string)
}

func (h *condWaitHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *condWaitHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *condWaitHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 3 {
			nkeys, _ := args[2].(int)
			if i := 3 + nkeys; i < len(args) {
				if h.log != nil {
					defer func() { h.log(fmt.Sprintf("%v %v -> %v / %v", args[0], args[i], cmd.Err(), cmd.String())) }()
				}
				switch args[i] {
				case "leave":
					if h.failLeave.Load() {
						h.leaves.Add(1)
						cmd.SetErr(h.leaveErr)
						return h.leaveErr
					}
				case "wait":
					if h.holdWait.Load() {
						// The first form that runs (not NOSCRIPT) is held.
						err := next(ctx, cmd)
						if err == nil && h.holdWait.CompareAndSwap(true, false) {
							close(h.held)
							<-h.release
						}
						return err
					}
				}
			}
		}
		return next(ctx, cmd)
	}
}

// A condition wait whose script call is on its way when Close begins
// returns ErrClosed (boundByClose), and its late clean-up withdraws the
// new ticket the script put on the condition. The guide and Close's doc:
// "if some of the blocked Acquire calls (and condition waits) it ended
// could not leave their queues in that time ... the error says how many
// of how many". An Acquire's late clean-up reports to the close
// (acquirePlan: cleanUpReport with closeReport), and so does the
// condition wait's: the withdrawal fails, the ticket stays on the
// condition, and Close's error says so. (Before, the condition wait's did
// not, and Close returned nil.)
func TestCloseReportsConditionWaitOnItsWay(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		h := &condWaitHook{held: make(chan struct{}), release: make(chan struct{}),
			leaveErr: errors.New("test: withdrawal refused")}
		// h.log = func(s string) { t.Log(s) } // every script call, for debugging
		var releaseOnce sync.Once
		free := func() { releaseOnce.Do(func() { close(h.release) }) }
		defer free()
		rdb := b.Client(t)
		rdb.AddHook(h)
		prefix := redistest.Prefix(t)
		c, err := New(rdb, WithPrefix(prefix), WithWaiterTTL(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		req := Request{Name: "m", Capacity: 1, Permits: 1}
		l, err := c.Acquire(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background()) // may outlast the close
		defer cancel()
		h.holdWait.Store(true)
		waited := make(chan error, 1)
		go func() {
			_, err := l.condWait(ctx, "cv")
			waited <- err
		}()
		<-h.held // the wait ran in Redis: its new ticket is on the condition
		h.failLeave.Store(true)
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		select {
		case err := <-waited:
			t.Logf("condWait = %v", err)
			if !errors.Is(err, ErrClosed) {
				t.Errorf("condWait on its way at Close = %v, want ErrClosed", err)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("condWait did not return at the close")
		}
		free() // the reply comes: the late clean-up runs
		var cerr error
		select {
		case cerr = <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return")
		}
		keys, _ := rdb.Keys(context.Background(), prefix+"*").Result()
		for _, k := range keys {
			typ, _ := rdb.Type(context.Background(), k).Result()
			switch typ {
			case "zset":
				z, _ := rdb.ZRangeWithScores(context.Background(), k, 0, -1).Result()
				t.Logf("%q: %v", k, z)
			case "hash":
				h, _ := rdb.HGetAll(context.Background(), k).Result()
				t.Logf("%q: %v", k, h)
			}
		}
		p, _ := c.plan([]Request{req})
		n, _ := rdb.ZCard(context.Background(), condKeys(p.first().k, "cv")[0]).Result()
		t.Logf("Close = %v; withdrawals tried %d; waiters left on the condition: %d", cerr, h.leaves.Load(), n)
		if h.leaves.Load() == 0 {
			t.Fatal("no withdrawal was tried: the probe did not reach its case")
		}
		if cerr == nil || !errors.Is(cerr, ErrRedis) {
			t.Errorf("Close = %v, want an error matching ErrRedis saying a withdrawal it ended did not land (%d waiter(s) left on the condition)", cerr, n)
		}
	})
}
