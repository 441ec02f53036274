package fairlock_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
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
		})
	}
}
