package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// instantRedis answers the acquire and release scripts at once, with
// canned replies, so that a benchmark measures what the client itself
// spends on a call: everything but the round trip and the script.
type instantRedis struct{ token int64 }

func (r *instantRedis) reply(ctx context.Context, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	now := time.Now().UnixMilli()
	switch args[0] {
	case "acquire", "try":
		r.token++
		cmd.SetVal([]any{int64(1), now, now + 10_000, strconv.FormatInt(r.token, 10)})
	case "release", "leave":
		cmd.SetVal([]any{int64(1), int64(0)})
	default:
		cmd.SetErr(fmt.Errorf("instantRedis: op %v", args[0]))
	}
	return cmd
}

func (r *instantRedis) Eval(ctx context.Context, _ string, _ []string, args ...any) *redis.Cmd {
	return r.reply(ctx, args)
}
func (r *instantRedis) EvalSha(ctx context.Context, _ string, _ []string, args ...any) *redis.Cmd {
	return r.reply(ctx, args)
}
func (r *instantRedis) EvalRO(ctx context.Context, _ string, _ []string, args ...any) *redis.Cmd {
	return r.reply(ctx, args)
}
func (r *instantRedis) EvalShaRO(ctx context.Context, _ string, _ []string, args ...any) *redis.Cmd {
	return r.reply(ctx, args)
}
func (r *instantRedis) ScriptExists(ctx context.Context, _ ...string) *redis.BoolSliceCmd {
	return redis.NewBoolSliceCmd(ctx)
}
func (r *instantRedis) ScriptLoad(ctx context.Context, _ string) *redis.StringCmd {
	return redis.NewStringCmd(ctx)
}
func (r *instantRedis) BLPop(ctx context.Context, _ time.Duration, _ ...string) *redis.StringSliceCmd {
	<-ctx.Done()
	cmd := redis.NewStringSliceCmd(ctx)
	cmd.SetErr(ctx.Err())
	return cmd
}

// cycles runs b's loop of uncontended Acquires and Releases on c.
func cycles(ctx context.Context, b *testing.B, c *fairlock.Client) {
	req := fairlock.Request{Name: "m", Capacity: 1, Permits: 1}
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClientPath measures the client's own work for one uncontended
// Acquire and its Release (time and allocations), Redis's answers taking
// no time: the cost a thin call path removes. With a deadline, the
// context can end while a call runs.
func BenchmarkClientPath(b *testing.B) {
	for _, deadline := range []bool{false, true} {
		b.Run(fmt.Sprintf("deadline=%v", deadline), func(b *testing.B) {
			c, err := fairlock.New(&instantRedis{})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			if deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Hour)
				defer cancel()
			}
			cycles(ctx, b, c)
		})
	}
}

// instantBackend is instantRedis as a backend.Backend of its own, whose
// Info can say that its calls return by their context's end (Deadlines).
// onScript, if set, is called with each script command.
type instantBackend struct {
	redis     instantRedis
	deadlines bool
	onScript  func()
}

func (b *instantBackend) Info() backend.Info {
	return backend.Info{Layout: backend.Single, Deadlines: b.deadlines}
}

func (b *instantBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	if b.onScript != nil {
		b.onScript()
	}
	args := make([]any, len(s.Args))
	for i, a := range s.Args {
		args[i] = a
	}
	return b.redis.reply(ctx, args).Result()
}

func (b *instantBackend) ScriptWait(ctx context.Context, s backend.Script, _ int, _ time.Duration) (any, int64, error, error) {
	v, err := b.Script(ctx, s)
	return v, 0, err, nil
}

func (b *instantBackend) LoadLibrary(context.Context, string) error { return nil }

func (b *instantBackend) BlockingPop(ctx context.Context, timeout time.Duration, _ int, _ []string) (string, []string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return "", nil, ctx.Err()
	case <-t.C:
		return "", nil, nil
	}
}

func (b *instantBackend) Pop(context.Context, string, int) ([]string, error) { return nil, nil }

func (b *instantBackend) Blocking() (backend.Backend, func() error, error) { return nil, nil, nil }

// BenchmarkBackendPath is BenchmarkClientPath through a Backend of its own:
// with Deadlines, a call whose context can end runs on the caller's
// goroutine, as a call without a deadline does.
func BenchmarkBackendPath(b *testing.B) {
	for _, deadlines := range []bool{false, true} {
		b.Run(fmt.Sprintf("deadlines=%v", deadlines), func(b *testing.B) {
			c, err := fairlock.NewWithBackend(&instantBackend{deadlines: deadlines})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			cycles(ctx, b, c)
		})
	}
}

// goroutineID returns the running goroutine's number, from its stack's
// first line ("goroutine N [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

// A Backend that returns by its context's end (Deadlines) gets the
// caller's calls on the caller's goroutine, deadline or not; any other
// gets those whose context can end on a goroutine of the engine's, so
// that the caller returns in time whatever the client does.
func TestCallsUnderADeadlineRunOnTheCallersGoroutineWhenTheBackendHonoursThem(t *testing.T) {
	for _, deadlines := range []bool{false, true} {
		t.Run(fmt.Sprintf("deadlines=%v", deadlines), func(t *testing.T) {
			var mu sync.Mutex
			var on []string
			b := &instantBackend{deadlines: deadlines, onScript: func() {
				mu.Lock()
				on = append(on, goroutineID())
				mu.Unlock()
			}}
			c, err := fairlock.NewWithBackend(b)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			l, err := c.Acquire(ctx, fairlock.Request{Name: "m", Capacity: 1, Permits: 1})
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			me := goroutineID()
			mu.Lock()
			defer mu.Unlock()
			if len(on) != 2 {
				t.Fatalf("%d script calls, want 2 (the acquire, the release)", len(on))
			}
			for i, g := range on {
				if mine := g == me; mine != deadlines {
					t.Errorf("call %d ran on goroutine %s, the caller's %s: on the caller's %v, want %v", i, g, me, mine, deadlines)
				}
			}
		})
	}
}

// The allocations of one uncontended Acquire and its Release, on each
// route a call takes (see BenchmarkClientPath), stay within a budget: the
// thin call path, kept thin. A change that adds allocations to every call
// (a context, a closure, a boxed argument, an error target that escapes
// though the call succeeded) fails here; raise a budget only for a reason
// worth its cost on every acquisition. (Part of each count is the test's
// instant Redis's own: its reply, and instantBackend's arguments.)
func TestClientPathAllocations(t *testing.T) {
	if redistest.Race {
		t.Skip("the race detector allocates on its own")
	}
	hour := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		t.Cleanup(cancel)
		return ctx
	}
	for _, tc := range []struct {
		name   string
		b      backend.Backend // nil: a go-redis RedisClient
		ctx    context.Context
		budget float64
	}{
		{"go-redis, a context that cannot end", nil, context.Background(), 22},
		// A context that may outlast a close's bound (no deadline, or one
		// later than a waiter TTL away, as here) gives the acquisition's
		// call one that also ends at the close, so that the Redis client's
		// retries (a stalled Cluster's: four tries of a read timeout each)
		// cannot hold the close: a cancel context and its hook on the
		// close, 4 to 5 allocations; the Release's call as well (a close
		// waits for the lease it releases), 5 more.
		{"go-redis, a deadline (the call on a goroutine of the client's)", nil, hour(), 30},
		{"a Backend that honours deadlines, a deadline", &instantBackend{deadlines: true}, hour(), 46},
		// Through a Backend that returns only by its context's end, a
		// context that cannot end gets the close's end as well: nothing
		// else would end a call to a Redis that does not answer.
		{"a Backend that honours deadlines, a context that cannot end", &instantBackend{deadlines: true}, context.Background(), 46},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c *fairlock.Client
			var err error
			if tc.b == nil {
				c, err = fairlock.New(&instantRedis{})
			} else {
				c, err = fairlock.NewWithBackend(tc.b)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req := fairlock.Request{Name: "m", Capacity: 1, Permits: 1}
			got := testing.AllocsPerRun(200, func() {
				l, err := c.Acquire(tc.ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(tc.ctx); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("%v allocations per Acquire and Release (budget %v)", got, tc.budget)
			if got > tc.budget {
				t.Errorf("%v allocations per Acquire and Release, over the budget of %v", got, tc.budget)
			}
		})
	}
}

// Close keeps its bound when an Acquire's script call is on the wire and
// Redis does not answer it, on a Backend that claims to return by its
// context's end but does not (the close ends that context; here nothing
// comes of it): it stops waiting for that acquisition at the bound (one
// waiter TTL) and says so, matching ErrRedis.
func TestCloseBoundsAnAcquireRedisDoesNotAnswer(t *testing.T) {
	release := make(chan struct{})
	var stall atomic.Bool
	started := make(chan struct{}, 1)
	b := &instantBackend{deadlines: true, onScript: func() {
		if stall.Load() {
			select {
			case started <- struct{}{}:
			default:
			}
			<-release
		}
	}}
	c, err := fairlock.NewWithBackend(b, fairlock.WithWaiterTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	stall.Store(true)
	acquired := make(chan error, 1)
	go func() {
		_, err := c.Acquire(context.Background(), fairlock.Request{Name: "m", Capacity: 1, Permits: 1})
		acquired <- err
	}()
	<-started
	closed := make(chan error, 1)
	t0 := time.Now()
	go func() { closed <- c.Close() }()
	select {
	case err = <-closed:
	case <-time.After(10 * time.Second):
		close(release)
		<-closed
		t.Fatal("Close waited 10 s for an Acquire whose script call Redis did not answer (its bound: one waiter TTL, 300ms)")
	}
	took := time.Since(t0)
	close(release)
	<-acquired
	if !errors.Is(err, fairlock.ErrRedis) || !strings.Contains(err.Error(), "1 acquisitions were still waiting") {
		t.Errorf("Close = %v, want an error matching ErrRedis that says 1 acquisition was still waiting", err)
	}
	t.Logf("Close returned after %v: %v", took.Round(time.Millisecond), err)
}
