package fairlockvalkey_test

import (
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockvalkey"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/valkey-io/valkey-go"
)

// Close returns within its bound through valkey-go, which honours deadlines:
// one waiter TTL from the call (its blocking reads nudged together, each
// within a second of it), on a single node, a Cluster and a Sentinel set,
// Redis stalled or refusing; every blocked Acquire has left its queue by
// then (see fltest.CloseBound).
func TestCloseBound(t *testing.T) {
	fltest.CloseBound(t, fairlock.DefaultWaiterTTL+time.Second,
		func(t *testing.T, s fltest.Servers, opts ...fairlock.Option) *fairlock.Client {
			opt := valkey.ClientOption{InitAddress: s.Addrs}
			if s.MasterName != "" {
				opt.Sentinel = valkey.SentinelOption{MasterSet: s.MasterName}
			}
			rdb, err := valkey.NewClient(opt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rdb.Close)
			c, err := fairlockvalkey.New(rdb, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
}
