package fairlock

import (
	"context"
	"fmt"
	"strconv"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/redis/go-redis/v9"
)

// runTest runs s on rdb with keys and args and returns its reply as a go-redis
// command, without WithReplicaAck's WAIT: tests run entries by hand.
func runTest(ctx context.Context, s *script.Script, rdb RedisClient, keys []string, args ...any) *redis.Cmd {
	g := &goRedis{rdb: rdb}
	r := s.Run(ctx, g, g.Info().Functions, func(sc backend.Script) script.Result {
		v, err := g.Script(ctx, sc)
		return script.Result{Val: v, Err: err}
	}, keys, renderArgs(args))
	cmd := redis.NewCmd(ctx)
	cmd.SetVal(r.Val)
	cmd.SetErr(r.Err)
	return cmd
}

// goRedisOf returns the go-redis client c was made on.
func goRedisOf(c *Client) RedisClient { return c.b.(*goRedis).rdb }

// NoTransform has the clients a test makes run the scripts unchanged
// (without the package's half-run checker), for the external tests.
var NoTransform = noTransform

// SetTestTransform is setTestTransform, for the external tests.
var SetTestTransform = setTestTransform

// HasTestTransform reports whether the clients made now pass their scripts
// through a transform by default (setTestTransform).
func HasTestTransform() bool { return testTransform.Load() != nil }

// renderArgs renders a test's script arguments as the strings Redis
// receives: strings as they are, integers in decimal.
func renderArgs(args []any) []string {
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = v
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		case int:
			out[i] = strconv.Itoa(v)
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	return out
}
