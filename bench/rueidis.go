package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/fairlockrueidis"
	"github.com/fairlock/fairlock/fairlockvalkey"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
	"github.com/valkey-io/valkey-go"
	"github.com/valkey-io/valkey-go/valkeylock"
)

// The peers on the other Go Redis clients: rueidislock (rueidis) and
// valkeylock (valkey-go). Both wait for a held lock by client-side
// caching: the server tells the waiting client when the key changes, so
// they do not poll. That needs RESP3 and CLIENT TRACKING, which the
// embedded miniredis lacks: they run on real servers only.

// counters maps a process's go-redis client to the counter its commands
// count into, so that a peer that talks to Redis through a client of its
// own counts there too (see counted).
var counters sync.Map // *redis.Client -> *counter

// counted makes rdb count its commands into cnt, and remembers cnt for
// the peers that make clients of their own on rdb's address.
func counted(rdb *redis.Client, cnt *counter) *redis.Client {
	rdb.AddHook(cnt)
	counters.Store(rdb, cnt)
	return rdb
}

func counterOf(rdb *redis.Client) *counter {
	if c, ok := counters.Load(rdb); ok {
		return c.(*counter)
	}
	return &counter{}
}

// noLoopTracking reports whether the server's version (Redis's or, for
// Valkey, the Redis release it matches) takes CLIENT TRACKING's NOLOOP,
// which both lock packages ask for where they can (Redis 7.0.5 and later).
func noLoopTracking(version string) bool {
	var v [3]int
	for i, f := range strings.SplitN(version, ".", 3) {
		v[i], _ = strconv.Atoi(f)
	}
	return v[0] > 7 || v[0] == 7 && (v[1] > 0 || v[2] >= 5)
}

// serverVersion is the redis_version of the server under test, set when
// the run starts.
var serverVersion string

// rueidislock

type rueidisLocker struct{ l rueidislock.Locker }

func openRueidislock(rdb *redis.Client, prefix string) (locker, error) {
	cnt := counterOf(rdb)
	l, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: rueidis.ClientOption{InitAddress: []string{rdb.Options().Addr}},
		ClientBuilder: func(o rueidis.ClientOption) (rueidis.Client, error) {
			c, err := rueidis.NewClient(o)
			if err != nil {
				return nil, err
			}
			return &rueidisCounted{Client: c, cnt: cnt}, nil
		},
		KeyPrefix:      strings.TrimSuffix(prefix, ":"),
		KeyMajority:    1, // one Redis
		KeyValidity:    leaseTTL,
		NoLoopTracking: noLoopTracking(serverVersion),
	})
	if err != nil {
		return nil, fmt.Errorf("rueidislock: %w", err)
	}
	return &rueidisLocker{l}, nil
}

func (r *rueidisLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	return lockUntilUnlock(ctx, func(ctx context.Context) (func(), error) {
		_, unlock, err := r.l.WithContext(ctx, key)
		return unlock, err
	})
}

// lockUntilUnlock takes a lock of the rueidislock kind, which holds until
// its context ends, as the other implementations' locks hold: ctx bounds
// the wait, and the lock, once taken, lasts until unlock (or its TTL, its
// holder gone), whatever becomes of ctx.
//
// A wait that hears nothing for rewaitAfter begins again. Both packages
// wait for the server's invalidation of the lock's key with no timeout of
// their own, and that wake-up can be lost: in the handoff scenario under
// the race detector a valkeylock waiter slept for 7 minutes after its
// holder had released (its goroutine parked in WithContext, on its gate).
// Begun again, such a wait shows as one of about rewaitAfter.
func lockUntilUnlock(ctx context.Context, take func(context.Context) (unlock func(), err error)) (func(context.Context) error, error) {
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	for {
		// The attempt's context has no deadline (the packages shorten a
		// lock to its context's deadline): a timer cancels it instead.
		actx, acancel := context.WithCancel(lctx)
		t := time.AfterFunc(rewaitAfter, acancel)
		unlock, err := take(actx)
		inTime := t.Stop()
		switch {
		case err == nil && inTime && stop():
			return func(context.Context) error {
				unlock()
				acancel()
				cancel()
				return nil
			}, nil
		case err == nil:
			unlock() // taken as ctx or the timer ended the attempt
		}
		acancel()
		if ctx.Err() != nil {
			cancel()
			return nil, ctx.Err()
		}
		if err != nil && inTime {
			stop()
			cancel()
			return nil, err
		}
	}
}

// rewaitAfter is how long a rueidislock or valkeylock wait may hear
// nothing before it begins again (see lockUntilUnlock).
const rewaitAfter = time.Second

func (r *rueidisLocker) lockBoth(ctx context.Context, a, b string) (func(context.Context) error, error) {
	return bothInOrder(ctx, r, a, b)
}

func (r *rueidisLocker) close() { r.l.Close() }

// fairlock on rueidis and valkey-go

func openFairlockRueidis(rdb *redis.Client, prefix string) (locker, error) {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{rdb.Options().Addr}, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("rueidis: %w", err)
	}
	fc, err := fairlockrueidis.New(&rueidisCounted{Client: c, cnt: counterOf(rdb)}, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(leaseTTL))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &fairlockLocker{c: fc, after: c.Close}, nil
}

func openFairlockValkey(rdb *redis.Client, prefix string) (locker, error) {
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{rdb.Options().Addr}, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("valkey-go: %w", err)
	}
	fc, err := fairlockvalkey.New(&valkeyCounted{Client: c, cnt: counterOf(rdb)}, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(leaseTTL))
	if err != nil {
		c.Close()
		return nil, err
	}
	return &fairlockLocker{c: fc, after: c.Close}, nil
}

// rueidisCounted counts the commands a rueidis client sends (a cached
// read answered from the client's cache is not sent).
type rueidisCounted struct {
	rueidis.Client
	cnt *counter
}

func (c *rueidisCounted) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.cnt.n.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c *rueidisCounted) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	c.cnt.n.Add(int64(len(multi)))
	return c.Client.DoMulti(ctx, multi...)
}

func (c *rueidisCounted) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	r := c.Client.DoCache(ctx, cmd, ttl)
	if !r.IsCacheHit() {
		c.cnt.n.Add(1)
	}
	return r
}

func (c *rueidisCounted) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	rs := c.Client.DoMultiCache(ctx, multi...)
	for _, r := range rs {
		if !r.IsCacheHit() {
			c.cnt.n.Add(1)
		}
	}
	return rs
}

// valkeylock

type valkeyLocker struct{ l valkeylock.Locker }

func openValkeylock(rdb *redis.Client, prefix string) (locker, error) {
	cnt := counterOf(rdb)
	l, err := valkeylock.NewLocker(valkeylock.LockerOption{
		ClientOption: valkey.ClientOption{InitAddress: []string{rdb.Options().Addr}},
		ClientBuilder: func(o valkey.ClientOption) (valkey.Client, error) {
			c, err := valkey.NewClient(o)
			if err != nil {
				return nil, err
			}
			return &valkeyCounted{Client: c, cnt: cnt}, nil
		},
		KeyPrefix:      strings.TrimSuffix(prefix, ":"),
		KeyMajority:    1,
		KeyValidity:    leaseTTL,
		NoLoopTracking: noLoopTracking(serverVersion),
	})
	if err != nil {
		return nil, fmt.Errorf("valkeylock: %w", err)
	}
	return &valkeyLocker{l}, nil
}

func (v *valkeyLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	return lockUntilUnlock(ctx, func(ctx context.Context) (func(), error) {
		_, unlock, err := v.l.WithContext(ctx, key)
		return unlock, err
	})
}

func (v *valkeyLocker) lockBoth(ctx context.Context, a, b string) (func(context.Context) error, error) {
	return bothInOrder(ctx, v, a, b)
}

func (v *valkeyLocker) close() { v.l.Close() }

type valkeyCounted struct {
	valkey.Client
	cnt *counter
}

func (c *valkeyCounted) Do(ctx context.Context, cmd valkey.Completed) valkey.ValkeyResult {
	c.cnt.n.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c *valkeyCounted) DoMulti(ctx context.Context, multi ...valkey.Completed) []valkey.ValkeyResult {
	c.cnt.n.Add(int64(len(multi)))
	return c.Client.DoMulti(ctx, multi...)
}

func (c *valkeyCounted) DoCache(ctx context.Context, cmd valkey.Cacheable, ttl time.Duration) valkey.ValkeyResult {
	r := c.Client.DoCache(ctx, cmd, ttl)
	if !r.IsCacheHit() {
		c.cnt.n.Add(1)
	}
	return r
}

func (c *valkeyCounted) DoMultiCache(ctx context.Context, multi ...valkey.CacheableTTL) []valkey.ValkeyResult {
	rs := c.Client.DoMultiCache(ctx, multi...)
	for _, r := range rs {
		if !r.IsCacheHit() {
			c.cnt.n.Add(1)
		}
	}
	return rs
}
