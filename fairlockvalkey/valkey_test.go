package fairlockvalkey_test

import (
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockvalkey"
	"github.com/fairlock/fairlock/internal/conformance"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/valkey-io/valkey-go"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The behaviour every Backend must show (internal/conformance), through
// valkey-go: on miniredis, a real server and a Cluster.
func TestConformance(t *testing.T) {
	conformance.RunAll(t, func(t *testing.T, s conformance.Server) func(...fairlock.Option) (*fairlock.Client, error) {
		opt := valkey.ClientOption{InitAddress: s.Addrs}
		if s.MasterName != "" {
			opt.Sentinel = valkey.SentinelOption{MasterSet: s.MasterName}
		}
		if s.Mini {
			// miniredis has no client-side caching, which the client
			// turns on over RESP3.
			opt.DisableCache = true
		}
		rdb, err := valkey.NewClient(opt)
		if err != nil {
			t.Fatalf("%v: %v", s.Addrs, err)
		}
		t.Cleanup(rdb.Close)
		return func(opts ...fairlock.Option) (*fairlock.Client, error) { return fairlockvalkey.New(rdb, opts...) }
	})
}
