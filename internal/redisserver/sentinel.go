package redisserver

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Sentinel set is a master, one replica and three sentinels watching
// them under the name "mymaster", all on loopback.
type Sentinel struct {
	Master, Replica *Server
	Sentinels       []*Server
}

// MasterName is the name the sentinels know the master by.
const MasterName = "mymaster"

// FailoverTimeout is the sentinels' failover-timeout. A sentinel that
// started a failover, or voted for another's, tries none of its own for
// twice this long; one that is not elected gives up after this long. A
// failover that cannot finish (the votes split three ways, or the master
// looked down with no replica fit to promote) thus delays the next by
// twice this, not by minutes as with Sentinel's default.
const FailoverTimeout = 3 * time.Second

// SentinelAddrs returns the sentinels' addresses.
func (s *Sentinel) SentinelAddrs() []string {
	var out []string
	for _, x := range s.Sentinels {
		out = append(out, x.Addr)
	}
	return out
}

// Stop kills every process of the set.
func (s *Sentinel) Stop() {
	for _, x := range append([]*Server{s.Master, s.Replica}, s.Sentinels...) {
		if x != nil {
			x.Stop()
		}
	}
}

// StartSentinel starts a master, a replica of it, and three sentinels
// (quorum 2, master declared down after downAfter), and waits until the
// replica is in sync and every sentinel knows the replica and the other
// sentinels.
func StartSentinel(downAfter time.Duration) (*Sentinel, error) {
	set := &Sentinel{}
	var err error
	// Diskless sync waits 5s for more replicas by default.
	if set.Master, err = Start("--repl-diskless-sync-delay", "0"); err != nil {
		return nil, err
	}
	if set.Replica, err = Start("--replicaof", "127.0.0.1", fmt.Sprint(set.Master.Port)); err != nil {
		set.Stop()
		return nil, err
	}
	for range 3 {
		x, err := startSentinel(set.Master.Port, downAfter)
		if err != nil {
			set.Stop()
			return nil, err
		}
		set.Sentinels = append(set.Sentinels, x)
	}
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	replica := redis.NewClient(&redis.Options{Addr: set.Replica.Addr})
	defer replica.Close()
	for {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			set.Stop()
			return nil, fmt.Errorf("replica not in sync: %v %s", err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, x := range set.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: x.Addr})
		for {
			m, err := sc.Master(ctx, MasterName).Result()
			if err == nil && m["num-slaves"] == "1" && m["num-other-sentinels"] == "2" {
				break
			}
			if time.Now().After(deadline) {
				sc.Close()
				set.Stop()
				return nil, fmt.Errorf("sentinel %s not ready: %v %v", x.Addr, m, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		sc.Close()
	}
	return set, nil
}

// startSentinel starts a sentinel of the master on masterPort, on a free
// port; like Start, it tries again on a fresh port, up to 5 times, when
// another process took the port first.
func startSentinel(masterPort int, downAfter time.Duration) (*Server, error) {
	return onFreePort(5, nil, func(port int) (*Server, error) {
		dir, err := os.MkdirTemp("", "sentinel")
		if err != nil {
			return nil, err
		}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s %d\nsentinel parallel-syncs %s 1\n",
			port, dir, MasterName, masterPort, MasterName, downAfter.Milliseconds(), MasterName, FailoverTimeout.Milliseconds(), MasterName)
		path := dir + "/sentinel.conf"
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		x := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, dir: dir, conf: path}
		if err := x.start(); err != nil {
			x.Stop()
			return nil, err
		}
		return x, nil
	})
}
