package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/fairlock/fairlock"
	"github.com/redis/go-redis/v9"
)

// addressForms is what a Redis address may be, as a bad one's error says.
const addressForms = "want HOST[:PORT], redis://[USER[:PASSWORD]@]HOST[:PORT][/DB], rediss://... (TLS) or unix:///PATH[?db=DB]"

// errBadAddress matches the error of a Redis address of no known form.
var errBadAddress = errors.New("bad Redis address")

// redisAddress returns the Redis address to use and where it came from:
// -redis, else $FAIRLOCK_REDIS_URL, else $REDIS_URL, else 127.0.0.1:6379.
func (c *common) redisAddress() (addr, from string) {
	if c.url != "" {
		return c.url, "-redis"
	}
	for _, env := range []string{"FAIRLOCK_REDIS_URL", "REDIS_URL"} {
		if v := os.Getenv(env); v != "" {
			return v, "$" + env
		}
	}
	return "127.0.0.1:6379", "the default"
}

// redisOptions returns go-redis's options for the Redis address, or an
// error matching errBadAddress that names where the address came from and
// the forms it may take.
func (c *common) redisOptions() (*redis.Options, error) {
	addr, from := c.redisAddress()
	o, err := parseAddress(addr)
	if err != nil {
		return nil, fmt.Errorf("%w %s %q: %v; %s", errBadAddress, from, addr, err, addressForms)
	}
	return o, nil
}

// parseAddress reads a Redis address as redis-cli and Redis's clients
// give it: a redis://, rediss:// or unix:// URL (go-redis's
// redis.ParseURL: user, password, database, TLS, options), HOST[:PORT]
// (port 6379 by default; an IPv6 host in brackets), or the absolute path
// of a Unix socket.
func parseAddress(addr string) (*redis.Options, error) {
	if scheme, _, ok := strings.Cut(addr, "://"); ok {
		switch scheme {
		case "redis", "rediss", "unix":
		default:
			return nil, fmt.Errorf("scheme %q", scheme)
		}
		o, err := redis.ParseURL(addr)
		if err != nil {
			return nil, errors.New(strings.TrimPrefix(err.Error(), "redis: "))
		}
		return o, nil
	}
	if strings.HasPrefix(addr, "/") {
		return &redis.Options{Network: "unix", Addr: addr}, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		// No port: a host name, an IPv4 address, or an IPv6 address
		// (bare or in brackets).
		h := addr
		if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
			h = h[1 : len(h)-1]
		}
		if strings.Contains(h, ":") && net.ParseIP(h) == nil {
			return nil, errors.New("not HOST:PORT")
		}
		host, port = h, "6379"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("port %q", port)
	}
	if host == "" || strings.ContainsFunc(host, func(r rune) bool { return r <= ' ' || r == 0x7f || strings.ContainsRune("/@?#", r) }) {
		return nil, fmt.Errorf("host %q", host)
	}
	return &redis.Options{Addr: net.JoinHostPort(host, port)}, nil
}

// redisConn is the go-redis client the commands use: a *redis.Client (one
// server, or a Sentinel set's master) or a *redis.ClusterClient.
type redisConn interface {
	fairlock.RedisClient
	Ping(ctx context.Context) *redis.StatusCmd
	AddHook(redis.Hook)
	Close() error
}

// Forms of -cluster and -sentinel, as a bad one's error says.
const (
	clusterForms  = "want HOST:PORT[,HOST:PORT...] (any of the Cluster's nodes) or redis://[USER[:PASSWORD]@]HOST:PORT[?addr=HOST:PORT...]"
	sentinelForms = "want HOST[:PORT][,HOST[:PORT]...] (the sentinels; port 26379 by default) with -master NAME, or redis://[USER[:PASSWORD]@]HOST:PORT?master_name=NAME[&addr=HOST:PORT...]"
)

// dial returns a go-redis client for where the flags say Redis is: a
// Cluster (-cluster), a Sentinel set's master (-sentinel, -master), else
// the one server of -redis (see redisOptions); and how to name it in
// messages. A bad address fails with an error matching errBadAddress.
func (c *common) dial() (redisConn, string, error) {
	switch {
	case c.cluster != "" && (c.sentinel != "" || c.url != ""):
		return nil, "", fmt.Errorf("%w: -cluster goes alone, without -redis or -sentinel", errBadAddress)
	case c.sentinel != "" && c.url != "":
		return nil, "", fmt.Errorf("%w: -sentinel goes alone, without -redis", errBadAddress)
	case c.master != "" && c.sentinel == "":
		return nil, "", fmt.Errorf("%w: -master names a Sentinel set's master: give its sentinels with -sentinel", errBadAddress)
	case c.cluster != "":
		o, err := parseCluster(c.cluster)
		if err != nil {
			return nil, "", fmt.Errorf("%w -cluster %q: %v; %s", errBadAddress, c.cluster, err, clusterForms)
		}
		return redis.NewClusterClient(o), "the Cluster at " + strings.Join(o.Addrs, ","), nil
	case c.sentinel != "":
		o, err := parseSentinel(c.sentinel, c.master)
		if err != nil {
			return nil, "", fmt.Errorf("%w -sentinel %q: %v; %s", errBadAddress, c.sentinel, err, sentinelForms)
		}
		return redis.NewFailoverClient(o), fmt.Sprintf("master %q of the sentinels at %s", o.MasterName, strings.Join(o.SentinelAddrs, ",")), nil
	}
	o, err := c.redisOptions()
	if err != nil {
		return nil, "", err
	}
	return redis.NewClient(o), "Redis at " + o.Addr, nil
}

// parseCluster reads -cluster: a comma-separated list of nodes, HOST:PORT
// each (port 6379 by default), or a redis:// or rediss:// URL as go-redis's
// redis.ParseClusterURL reads it (more nodes as addr=HOST:PORT).
func parseCluster(s string) (*redis.ClusterOptions, error) {
	if strings.Contains(s, "://") {
		o, err := redis.ParseClusterURL(s)
		if err != nil {
			return nil, errors.New(strings.TrimPrefix(err.Error(), "redis: "))
		}
		return o, nil
	}
	addrs, err := hostPorts(s, "6379")
	if err != nil {
		return nil, err
	}
	return &redis.ClusterOptions{Addrs: addrs}, nil
}

// parseSentinel reads -sentinel and -master: a comma-separated list of
// sentinels, HOST[:PORT] each (port 26379 by default), and the master's
// name; or a redis:// URL as go-redis's redis.ParseFailoverURL reads it
// (master_name=NAME, more sentinels as addr=HOST:PORT), in which -master,
// if given, names the master.
func parseSentinel(s, master string) (*redis.FailoverOptions, error) {
	var o *redis.FailoverOptions
	if strings.Contains(s, "://") {
		var err error
		if o, err = redis.ParseFailoverURL(s); err != nil {
			return nil, errors.New(strings.TrimPrefix(err.Error(), "redis: "))
		}
	} else {
		addrs, err := hostPorts(s, "26379")
		if err != nil {
			return nil, err
		}
		o = &redis.FailoverOptions{SentinelAddrs: addrs}
	}
	if master != "" {
		o.MasterName = master
	}
	if o.MasterName == "" {
		return nil, errors.New("no master name (-master NAME)")
	}
	return o, nil
}

// hostPorts reads a comma-separated list of HOST[:PORT], port defPort by
// default.
func hostPorts(s, defPort string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, errors.New("an empty address")
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			if strings.HasPrefix(a, "[") || !strings.Contains(a, ":") || net.ParseIP(a) != nil {
				a = net.JoinHostPort(strings.Trim(a, "[]"), defPort)
			}
		}
		o, err := parseAddress(a)
		if err != nil {
			return nil, err
		}
		out = append(out, o.Addr)
	}
	return out, nil
}
