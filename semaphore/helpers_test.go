package semaphore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// env is one test's view of a backend (see fltest.Env), with short names
// for what the tests read most.
type env struct {
	*fltest.Env
	t      *testing.T
	b      *redistest.Backend
	rdb    *redis.Client
	prefix string
}

func newEnv(t *testing.T, b *redistest.Backend) *env {
	e := fltest.New(t, b)
	return &env{Env: e, t: t, b: b, rdb: e.RDB, prefix: e.Prefix}
}

func (e *env) sem(c *fairlock.Client, name string, capacity int64) *semaphore.Semaphore {
	e.t.Helper()
	s, err := semaphore.New(c, name, capacity)
	if err != nil {
		e.t.Fatalf("semaphore.New(%q, %d): %v", name, capacity, err)
	}
	return s
}

// key returns the Redis key of a semaphore's part (see fairlock's doc).
func (e *env) key(name, part string) string { return e.prefix + "{" + name + "}:" + part }

// waitQueued waits until n tickets wait in the semaphore's queue.
func (e *env) waitQueued(name string, n int64) {
	e.t.Helper()
	e.WaitFor(fmt.Sprintf("%d queued on %s", n, name), func() bool {
		got, err := e.rdb.ZCard(context.Background(), e.key(name, "q")).Result()
		return err == nil && got == n
	})
}

// keys lists the keys under e's prefix.
func (e *env) keys() []string {
	ks, err := e.rdb.Keys(context.Background(), e.prefix+"*").Result()
	if err != nil {
		e.t.Fatalf("KEYS: %v", err)
	}
	return ks
}

// result is what a background Acquire returned.
type result struct {
	lease *fairlock.Lease
	err   error
}

// acquireAsync starts Acquire in a goroutine and returns where its result
// will arrive.
func acquireAsync(ctx context.Context, s *semaphore.Semaphore, n int64) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := s.Acquire(ctx, n)
		ch <- result{l, err}
	}()
	return ch
}

func (e *env) receive(ch <-chan result) result {
	e.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		e.t.Fatal("Acquire did not return within 10s")
		return result{}
	}
}

// notYet fails if ch already has a result.
func (e *env) notYet(ch <-chan result, what string) {
	e.t.Helper()
	select {
	case r := <-ch:
		e.t.Fatalf("%s returned early: lease=%v err=%v", what, r.lease != nil, r.err)
	default:
	}
}

// counter is a go-redis hook that counts the commands a client sends.
type counter struct {
	mu       sync.Mutex
	byName   map[string]int
	blocking int // BLPOPs in flight now
	peak     int // most BLPOPs in flight at once
}

func newCounter() *counter { return &counter{byName: map[string]int{}} }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := cmd.Name()
		if (name == "evalsha" || name == "eval" || name == "fcall") && len(cmd.Args()) > 3 {
			// Count script calls by op (the first ARGV after the keys) as
			// "script:<op>", whether they ran as EVALSHA, EVAL or FCALL.
			nkeys, _ := cmd.Args()[2].(int)
			if i := 3 + nkeys; i < len(cmd.Args()) {
				if op, ok := cmd.Args()[i].(string); ok {
					name = "script:" + op
				}
			}
		}
		script := strings.HasPrefix(name, "script:")
		c.mu.Lock()
		if !script {
			c.byName[name]++
		}
		if name == "blpop" {
			c.blocking++
			c.peak = max(c.peak, c.blocking)
		}
		c.mu.Unlock()
		err := next(ctx, cmd)
		if name == "blpop" {
			c.mu.Lock()
			c.blocking--
			c.mu.Unlock()
		}
		if script {
			// A call that found no script or function (NOSCRIPT, FCALL
			// on a server without it) ran nothing; it is sent again.
			e := err
			if e == nil {
				e = cmd.Err()
			}
			ran := e == nil || !(redis.HasErrorPrefix(e, "NOSCRIPT") ||
				strings.Contains(e.Error(), "Function not found") || strings.Contains(e.Error(), "unknown command"))
			c.mu.Lock()
			if ran {
				c.byName[name]++
			} else {
				c.byName[cmd.Name()]++
			}
			c.mu.Unlock()
		}
		return err
	}
}

func (c *counter) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.byName[name]
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.byName {
		n += v
	}
	return n
}

type redisOptions = redis.Options
