package fairlock_test

import (
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/conformance"
	"github.com/redis/go-redis/v9"
)

// The behaviour every Backend must show (internal/conformance), through
// go-redis: the suite the rueidis and valkey-go modules run on theirs.
// Its clients run the scripts as their users' do (functions where the
// server has them), without the package's half-run checker.
func TestConformance(t *testing.T) {
	fairlock.NoTransform(t)
	conformance.RunAll(t, func(t *testing.T, s conformance.Server) func(testing.TB, ...fairlock.Option) *fairlock.Client {
		var rdb fairlock.RedisClient
		if s.Cluster {
			rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.Addrs})
		} else {
			rdb = redis.NewClient(&redis.Options{Addr: s.Addrs[0]})
		}
		t.Cleanup(func() { _ = rdb.(interface{ Close() error }).Close() })
		return func(t testing.TB, opts ...fairlock.Option) *fairlock.Client {
			c, err := fairlock.New(rdb, opts...)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
	})
}
