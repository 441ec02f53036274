package fairlockrueidis_test

import (
	"os"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockrueidis"
	"github.com/fairlock/fairlock/internal/conformance"
	"github.com/fairlock/fairlock/internal/faulttest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/robustness"
	"github.com/redis/rueidis"
)

// TestMain runs the tests, or, in a child of internal/robustness's runs or
// a worker of internal/faulttest's tests (which build this binary), that
// process's traffic through rueidis.
func TestMain(m *testing.M) {
	if robustness.IsChild() {
		os.Exit(robustness.ChildMain(dial))
	}
	if faulttest.IsWorker() {
		os.Exit(faulttest.WorkerMain(dial))
	}
	redistest.Main(m)
}

// dial is the child processes' Dial (internal/clients) through rueidis.
func dial(tg robustness.Target, opts ...fairlock.Option) (*fairlock.Client, func(), error) {
	opt := rueidis.ClientOption{InitAddress: []string{tg.Addr}}
	switch {
	case len(tg.Sentinels) > 0:
		opt.InitAddress = tg.Sentinels
		opt.Sentinel = rueidis.SentinelOption{MasterSet: tg.MasterName}
	case len(tg.Cluster) > 0:
		opt.InitAddress = tg.Cluster
	}
	rdb, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, nil, err
	}
	c, err := fairlockrueidis.New(rdb, opts...)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return c, rdb.Close, nil
}

// The behaviour every Backend must show (internal/conformance), through
// rueidis: on miniredis, a real server and a Cluster.
func TestConformance(t *testing.T) {
	conformance.RunAll(t, func(t *testing.T, s conformance.Server) func(...fairlock.Option) (*fairlock.Client, error) {
		opt := rueidis.ClientOption{InitAddress: s.Addrs}
		if s.MasterName != "" {
			opt.Sentinel = rueidis.SentinelOption{MasterSet: s.MasterName}
		}
		if s.Mini {
			// miniredis has no client-side caching, which the client
			// turns on over RESP3.
			opt.DisableCache = true
		}
		rdb, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatalf("%v: %v", s.Addrs, err)
		}
		t.Cleanup(rdb.Close)
		return func(opts ...fairlock.Option) (*fairlock.Client, error) { return fairlockrueidis.New(rdb, opts...) }
	})
}
