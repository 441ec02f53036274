package redisserver

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Cluster is a Redis Cluster of masters on loopback ports, without
// replicas.
type Cluster struct {
	Nodes []*Server
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, s := range c.Nodes {
		out = append(out, s.Addr)
	}
	return out
}

// Stop kills every node.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes {
		s.Stop()
	}
}

// StartCluster starts n redis-server nodes in cluster mode (each on a
// free port whose bus port, 10000 higher, is free too), joins them with
// redis-cli --cluster create, and waits until the cluster is ok.
func StartCluster(n int) (*Cluster, error) {
	cli, err := Binary("redis-cli")
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	for range n {
		// A node's cluster bus listens on its port + 10000.
		bus := func(port int) bool { return port+10000 <= 65535 && portFree(port+10000) }
		s, err := onFreePort(20, bus, func(port int) (*Server, error) {
			s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port,
				Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}}
			if err := s.start(); err != nil {
				s.Stop()
				return nil, err
			}
			return s, nil
		})
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("starting cluster node: %v", err)
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.Nodes {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			info, err := rdb.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				rdb.Close()
				c.Stop()
				return nil, fmt.Errorf("cluster on %v not ok: %v %s", c.Addrs(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rdb.Close()
	}
	return c, nil
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}
