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
// server has them), without the package's half-run checker. The suite's
// property and differential tests are left out: the package's own
// (property_test.go, differential_test.go) check go-redis against a fuller
// model, with crashes and Redis's clock moved, and replay far more
// histories.
func TestConformance(t *testing.T) {
	fairlock.NoTransform(t)
	conformance.RunAll(t, func(t *testing.T, s conformance.Server) func(...fairlock.Option) (*fairlock.Client, error) {
		var rdb interface {
			fairlock.RedisClient
			Close() error
		}
		switch {
		case s.Cluster:
			rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.Addrs})
		case s.MasterName != "":
			rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.Addrs})
		default:
			rdb = redis.NewClient(&redis.Options{Addr: s.Addrs[0]})
		}
		t.Cleanup(func() { _ = rdb.Close() })
		return func(opts ...fairlock.Option) (*fairlock.Client, error) { return fairlock.New(rdb, opts...) }
	}, "Property", "Differential")
}
