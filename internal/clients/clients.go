// Package clients is what fairlock's process-level tests
// (internal/robustness, internal/faulttest) need to run their child
// processes through every Go Redis client fairlock has a Backend for: how
// a child dials Redis ([Dial], [GoRedis]), and the test binaries of the
// other clients' modules ([Binaries]), whose TestMain runs the child
// through that module's Dial.
package clients

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A Target is the Redis a child is given: one address, a Sentinel set's
// sentinels, or a Cluster's nodes.
type Target struct {
	Addr       string
	Sentinels  []string // with MasterName
	MasterName string
	Cluster    []string
}

// Dial returns a fairlock Client, made with opts, on tg through the Redis
// client under test, and a function that closes that Redis client (after
// the fairlock Client is closed).
type Dial func(tg Target, opts ...fairlock.Option) (*fairlock.Client, func(), error)

// GoRedis is the Dial of go-redis's clients: *redis.Client, the Sentinel
// failover client and *redis.ClusterClient. It silences go-redis's log
// (children see Redis restarted and cut on purpose).
func GoRedis(tg Target, opts ...fairlock.Option) (*fairlock.Client, func(), error) {
	redis.SetLogger(quietLogger{})
	var rdb interface {
		fairlock.RedisClient
		Close() error
	}
	switch {
	case len(tg.Sentinels) > 0:
		rdb = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: tg.MasterName, SentinelAddrs: tg.Sentinels})
	case len(tg.Cluster) > 0:
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: tg.Cluster})
	default:
		rdb = redis.NewClient(&redis.Options{Addr: tg.Addr})
	}
	c, err := fairlock.New(rdb, opts...)
	if err != nil {
		rdb.Close()
		return nil, nil, err
	}
	return c, func() { rdb.Close() }, nil
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// A Binary is a test binary whose children speak to Redis through one Go
// Redis client.
type Binary struct{ Client, Path string }

// The modules of the other clients' Backends, whose test binaries run the
// children through their Dial (see their TestMain).
var modules = []struct{ client, dir string }{
	{"rueidis", "fairlockrueidis"},
	{"valkey-go", "fairlockvalkey"},
}

var (
	once sync.Once
	bins []Binary
	err  error
	dir  string
)

// Binaries returns the binaries children take turns between: the running
// one (go-redis's, the caller's) and each other client module's test
// binary, built once per process (with the race detector when the running
// binary has it) into a directory that [Cleanup] removes.
func Binaries(t testing.TB) []Binary {
	once.Do(func() {
		bins = []Binary{{"go-redis", os.Args[0]}}
		var root string
		if root, err = repoRoot(); err != nil {
			return
		}
		if dir, err = os.MkdirTemp("", "fairlock-clients-"); err != nil {
			return
		}
		var unlock func()
		if unlock, err = buildLock(); err != nil {
			return
		}
		defer unlock()
		for _, m := range modules {
			out := filepath.Join(dir, m.dir+".test")
			args := []string{"test", "-c", "-o", out}
			if redistest.Race {
				args = append(args, "-race")
			}
			cmd := exec.Command("go", append(args, ".")...)
			cmd.Dir = filepath.Join(root, m.dir)
			if b, berr := cmd.CombinedOutput(); berr != nil {
				err = fmt.Errorf("build %s's test binary in %s: %v\n%s", m.client, m.dir, berr, b)
				return
			}
			bins = append(bins, Binary{m.client, out})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

// Cleanup removes the binaries Binaries built; a TestMain calls it after
// the tests.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// repoRoot returns the directory of the module github.com/fairlock/fairlock,
// above the working directory (a test's is its package's).
func repoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && strings.HasPrefix(string(b), "module github.com/fairlock/fairlock\n") {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", fmt.Errorf("no module github.com/fairlock/fairlock above the working directory")
		}
		d = up
	}
}
