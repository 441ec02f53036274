package fairlockrueidis_test

import (
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockrueidis"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/redis/rueidis"
)

// Close returns within its bound through rueidis, which honours deadlines:
// one waiter TTL from the call (its blocking reads nudged together, each
// within a second of it), on a single node, a Cluster and a Sentinel set,
// Redis stalled or refusing; every blocked Acquire has left its queue by
// then (see fltest.CloseBound).
func TestCloseBound(t *testing.T) {
	fltest.CloseBound(t, fairlock.DefaultWaiterTTL+time.Second,
		func(t *testing.T, s fltest.Servers, opts ...fairlock.Option) *fairlock.Client {
			opt := rueidis.ClientOption{InitAddress: s.Addrs}
			if s.MasterName != "" {
				opt.Sentinel = rueidis.SentinelOption{MasterSet: s.MasterName}
			}
			rdb, err := rueidis.NewClient(opt)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(rdb.Close)
			c, err := fairlockrueidis.New(rdb, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			return c
		})
}
