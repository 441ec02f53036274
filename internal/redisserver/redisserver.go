// Package redisserver starts and stops redis-server processes on free
// loopback ports, for fairlock's tests and benchmark harness.
//
// The programs (redis-server, redis-cli) come from the folder named by the
// environment variable FAIRLOCK_REDIS_SERVER_DIR when it is set, and from
// PATH otherwise; Which names the server that runs (Redis or Valkey, and
// its version).
package redisserver

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process on a loopback port.
type Server struct {
	Addr string
	Port int
	Args []string
	cmd  *exec.Cmd
	dir  string
	conf string // a sentinel's configuration file; "" for a plain server
}

// EnvDir is the environment variable naming the folder that holds the
// redis-server and redis-cli to run (Redis's or Valkey's); when it is
// unset or empty they come from PATH.
const EnvDir = "FAIRLOCK_REDIS_SERVER_DIR"

// Binary returns the path of program name (redis-server, redis-cli): the
// file of that name in $FAIRLOCK_REDIS_SERVER_DIR when the variable is
// set, else the one on PATH. It fails when the program is not there or is
// not executable; a set variable never falls back to PATH, so a run meant
// for one server never silently tests another.
func Binary(name string) (string, error) {
	dir := os.Getenv(EnvDir)
	if dir == "" {
		return exec.LookPath(name)
	}
	path, err := exec.LookPath(filepath.Join(dir, name))
	if err != nil {
		return "", fmt.Errorf("%s=%s: %w", EnvDir, dir, err)
	}
	return filepath.Abs(path)
}

// Build names a server program: Name is "Redis" or "Valkey", Version its
// release ("7.4.1"), Path the program run ("" when read from a running
// server's INFO).
type Build struct {
	Name, Version, Path string
}

// String returns "Valkey 8.0.1", followed by the path in parentheses when
// known.
func (b Build) String() string {
	s := b.Name + " " + b.Version
	if b.Path != "" {
		s += " (" + b.Path + ")"
	}
	return s
}

// versionLine matches the first line of `redis-server --version`:
// "Redis server v=7.4.1 sha=..." or "Valkey server v=8.0.1 sha=...".
var versionLine = regexp.MustCompile(`^(\S+) server v=(\S+)`)

// Which returns the redis-server that Start runs, named by its own
// --version output. It fails when there is none (see Binary), when it does
// not run, or when its output is not the one Redis and Valkey print.
func Which() (Build, error) {
	path, err := Binary("redis-server")
	if err != nil {
		return Build{}, err
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return Build{}, fmt.Errorf("%s --version: %w", path, err)
	}
	m := versionLine.FindStringSubmatch(string(out))
	if m == nil {
		return Build{}, fmt.Errorf("%s --version: unrecognised output %q", path, out)
	}
	return Build{Name: m[1], Version: m[2], Path: path}, nil
}

// FromInfo names a running server from its INFO server section: Valkey
// reports server_name:valkey and valkey_version (its redis_version is the
// Redis release it is compatible with); Redis reports only redis_version.
// ok is false when the reply has neither.
func FromInfo(info string) (b Build, ok bool) {
	field := func(name string) string {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
				return v
			}
		}
		return ""
	}
	if v := field("valkey_version"); v != "" || field("server_name") == "valkey" {
		return Build{Name: "Valkey", Version: v}, v != ""
	}
	if v := field("redis_version"); v != "" {
		return Build{Name: "Redis", Version: v}, true
	}
	return Build{}, false
}

// Start runs redis-server (see Binary) on a free loopback port (never
// 6379) with persistence off, plus any extra arguments, and waits up to 5
// seconds until it answers. It fails, leaving no process behind, when
// there is no redis-server or it does not start after 5 tries on fresh
// ports; the error then carries the server's log.
func Start(args ...string) (*Server, error) {
	if _, err := Binary("redis-server"); err != nil {
		return nil, err
	}
	var last error
	for range 5 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, Args: args}
		if last = s.start(); last == nil {
			return s, nil
		}
	}
	return nil, last
}

func (s *Server) start() error {
	if s.dir == "" {
		dir, err := os.MkdirTemp("", "redistest")
		if err != nil {
			return err
		}
		s.dir = dir
	}
	args := append([]string{
		"--port", fmt.Sprint(s.Port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no",
	}, s.Args...)
	if s.conf != "" {
		args = []string{s.conf, "--sentinel"}
	}
	bin, err := Binary("redis-server")
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	// Keep draining the server's log so it never blocks on a full pipe.
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
	}()
	s.cmd = cmd
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		// A server with a password answers NOAUTH: it is up.
		if err := c.Ping(context.Background()).Err(); err == nil || strings.HasPrefix(err.Error(), "NOAUTH") {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	var log []string
	for l := range lines {
		log = append(log, l)
	}
	return fmt.Errorf("redis-server on %s did not start: %s", s.Addr, strings.Join(log, "\n"))
}

func (s *Server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Kill kills the server (SIGKILL) and keeps its port and directory, so
// Restart can bring it back where it was.
func (s *Server) Kill() { s.kill() }

// Pause stops the server's process (SIGSTOP): it keeps its port and its
// connections, and the kernel still accepts new ones, but it answers
// nothing until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redis-server on %s is not running", s.Addr)
	}
	return s.cmd.Process.Signal(sig)
}

// Restart starts the server again on the same port, after Kill.
func (s *Server) Restart() error { return s.start() }

// Stop kills the server and removes its directory.
func (s *Server) Stop() {
	s.kill()
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	if port == 6379 {
		return freePort()
	}
	return port, nil
}

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
		var s *Server
		var err error
		for range 20 {
			port, perr := freePort()
			if perr != nil {
				return nil, perr
			}
			if port+10000 > 65535 || !portFree(port+10000) {
				continue
			}
			s = &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port,
				Args: []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"}}
			if err = s.start(); err == nil {
				break
			}
			s = nil
		}
		if s == nil {
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

// MoveSlot migrates hash slot slot, with its keys, to the node at index
// to, the way redis-cli --cluster reshard does: IMPORTING and MIGRATING,
// MIGRATE of every key, then SETSLOT NODE on every master.
func (c *Cluster) MoveSlot(ctx context.Context, slot, to int) error {
	return c.MigrateSlot(ctx, slot, to, Migration{})
}

// A Migration says how MigrateSlot moves a slot: how many keys each
// MIGRATE carries and how long it pauses while the slot is half-moved, so
// that commands run on the MIGRATING source and the IMPORTING target in
// between.
type Migration struct {
	// Batch is the number of keys per MIGRATE (default 100).
	Batch int
	// Hold is how long the slot stays open (IMPORTING on the target,
	// MIGRATING on the source) before the first key moves.
	Hold time.Duration
	// Pause is the time between two MIGRATE batches.
	Pause time.Duration
	// Replace sends MIGRATE with REPLACE, overwriting a key the target
	// already has; without it such a key fails the move (BUSYKEY), as in
	// redis-cli --cluster reshard without --cluster-replace.
	Replace bool
	// Hook, if not nil, is called at each step of the move, on the
	// goroutine of MigrateSlot.
	Hook func(MigrationStep)
}

// A MigrationStep is one moment of a slot migration, told to
// Migration.Hook.
type MigrationStep struct {
	Slot       int
	From, To   int    // node indexes
	Phase      string // "open", "batch" or "closed"
	Moved      int    // keys migrated so far
	SourceAddr string
	TargetAddr string
}

// MigrateSlot migrates hash slot slot, with its keys, to the node at index
// to, step by step as redis-cli --cluster reshard does: SETSLOT IMPORTING
// on the target and MIGRATING on the source (phase "open"), MIGRATE of the
// source's keys in the slot m.Batch at a time (phase "batch" after each),
// then SETSLOT NODE on the target, the source and every other node (phase
// "closed"). It returns the first error a step returns; the slot may then
// be left open, which a later MigrateSlot of the same slot does not repair.
func (c *Cluster) MigrateSlot(ctx context.Context, slot, to int, m Migration) error {
	if m.Batch <= 0 {
		m.Batch = 100
	}
	clients := make([]*redis.Client, len(c.Nodes))
	ids := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: s.Addr})
		defer clients[i].Close()
		id, err := clients[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return err
		}
		ids[i] = id
	}
	from, err := c.NodeOf(ctx, slot)
	if err != nil {
		return err
	}
	if from == to {
		return fmt.Errorf("slot %d is on node %d already", slot, to)
	}
	step := MigrationStep{Slot: slot, From: from, To: to, SourceAddr: c.Nodes[from].Addr, TargetAddr: c.Nodes[to].Addr}
	hook := func(phase string) {
		if m.Hook != nil {
			step.Phase = phase
			m.Hook(step)
		}
	}
	pause := func(d time.Duration) error {
		if d <= 0 {
			return nil
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	src, dst := clients[from], clients[to]
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err(); err != nil {
		return err
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err(); err != nil {
		return err
	}
	hook("open")
	if err := pause(m.Hold); err != nil {
		return err
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, m.Batch).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", c.Nodes[to].Port, "", 0, 5000}
		if m.Replace {
			args = append(args, "REPLACE")
		}
		args = append(args, "KEYS")
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE: %w", err)
		}
		step.Moved += len(keys)
		hook("batch")
		if err := pause(m.Pause); err != nil {
			return err
		}
	}
	order := []int{to, from}
	for i := range c.Nodes {
		if i != to && i != from {
			order = append(order, i)
		}
	}
	for _, i := range order {
		if err := clients[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err(); err != nil {
			return err
		}
	}
	hook("closed")
	return nil
}

// NodeOf returns the index of the node that owns slot.
func (c *Cluster) NodeOf(ctx context.Context, slot int) (int, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr})
	defer rdb.Close()
	shards, err := rdb.ClusterShards(ctx).Result()
	if err != nil {
		return -1, err
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if int64(slot) < r.Start || int64(slot) > r.End {
				continue
			}
			for _, n := range sh.Nodes {
				for i, s := range c.Nodes {
					if n.Role == "master" && int(n.Port) == s.Port {
						return i, nil
					}
				}
			}
		}
	}
	return -1, fmt.Errorf("no node owns slot %d", slot)
}

// A Sentinel set is a master, one replica and three sentinels watching
// them under the name "mymaster", all on loopback.
type Sentinel struct {
	Master, Replica *Server
	Sentinels       []*Server
}

// MasterName is the name the sentinels know the master by.
const MasterName = "mymaster"

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
		port, err := freePort()
		if err != nil {
			set.Stop()
			return nil, err
		}
		dir, err := os.MkdirTemp("", "sentinel")
		if err != nil {
			set.Stop()
			return nil, err
		}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
			"sentinel monitor %s 127.0.0.1 %d 2\nsentinel down-after-milliseconds %s %d\n"+
			"sentinel failover-timeout %s 10000\nsentinel parallel-syncs %s 1\n",
			port, dir, MasterName, set.Master.Port, MasterName, downAfter.Milliseconds(), MasterName, MasterName)
		path := dir + "/sentinel.conf"
		if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
			set.Stop()
			return nil, err
		}
		x := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), Port: port, dir: dir, conf: path}
		if err := x.start(); err != nil {
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
