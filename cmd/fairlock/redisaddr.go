package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

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
