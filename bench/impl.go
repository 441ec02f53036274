package main

import (
	"context"
	"crypto/rand"
	"errors"
	"math"
	"time"

	"github.com/bsm/redislock"
	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/fairlock/fairlock/multilock"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// leaseTTL is the lock TTL every implementation gets: long enough that no
// lock expires while its holder lives.
const leaseTTL = 10 * time.Second

// A locker is one simulated process's handle on one lock implementation.
type locker interface {
	// lock blocks until it holds the lock key (or ctx ends) and returns
	// how to release it.
	lock(ctx context.Context, key string) (unlock func(context.Context) error, err error)
	// lockBoth takes two locks: atomically where the implementation can,
	// else one after the other in name order, which cannot deadlock.
	lockBoth(ctx context.Context, a, b string) (unlock func(context.Context) error, err error)
	close()
}

// An impl makes lockers, one per simulated process, each on its own
// go-redis client.
type impl struct {
	name  string
	about string // settings, for the report
	// peer is false for fairlock itself.
	peer bool
	// reference marks a row that is neither fairlock nor a peer: a floor
	// measured beside them (see floor.go).
	reference bool
	// variant marks fairlock on another Redis client than go-redis: its
	// rows are measured beside fairlock's own, which alone the targets
	// judge.
	variant bool
	// realOnly: the implementation needs what the embedded miniredis
	// lacks (client-side caching), so it runs on real servers only.
	realOnly bool
	// client names the Redis client an implementation makes for itself
	// on each process's address ("" for the process's go-redis client).
	client string
	// optIn: measured only when -impls names it (a study, not a row of
	// the main job).
	optIn bool
	open  func(rdb *redis.Client, prefix string) (locker, error)
}

func impls() []impl {
	return []impl{
		{name: "fairlock", about: "semaphore.Mutex (capacity 1); multilock for two locks; lease TTL 10s, waiter TTL 3s",
			open: openFairlock},
		{name: "fairlock-batched", variant: true, about: "fairlock as above, WithBatching(16): a process's concurrent calls to one server go as one script call",
			open: openFairlockBatched},
		{name: autopipeName, variant: true, optIn: true, about: "fairlock as above, its script calls through go-redis's experimental autopipeliner (a Backend of the bench's own: Submit, then WaitContext)",
			open: openFairlockAutopipe},
		{name: "fairlock-rueidis", variant: true, client: "rueidis", about: "fairlock as above, on a rueidis v1.0.79 client of its own per process (fairlockrueidis; no client-side caching, which fairlock does not use)",
			open: openFairlockRueidis},
		{name: "fairlock-valkey", variant: true, client: "valkey-go", about: "fairlock as above, on a valkey-go v1.0.79 client of its own per process (fairlockvalkey)",
			open: openFairlockValkey},
		{name: "redsync", peer: true, about: "redsync v4, one pool, default retry delay (random 50–250 ms), tries unlimited, expiry 10s",
			open: openRedsync},
		{name: "redislock", peer: true, about: "bsm/redislock, RetryStrategy LinearBackoff(100ms) as in its package example, TTL 10s",
			open: openRedislock},
		{name: "setnx", peer: true, about: "SET NX PX, sleep 10 ms and retry; release by compare-and-delete script",
			open: openSetNX},
		{name: "rueidislock", peer: true, realOnly: true, client: "rueidis", about: "rueidis v1.0.79's rueidislock, one Redis (KeyMajority 1), KeyValidity 10s, NOLOOP tracking where the server has it; waits by client-side caching (the server tells it when the key changes), a wait that hears nothing for 1 s begun again (a wake-up can be lost); its own rueidis client per process; real servers only",
			open: openRueidislock},
		{name: "valkeylock", peer: true, realOnly: true, client: "valkey-go", about: "valkey-go v1.0.79's valkeylock, set as rueidislock (its fork); real servers only",
			open: openValkeylock},
	}
}

// ownRow reports whether im is fairlock on go-redis: the row the targets
// judge.
func (im impl) ownRow() bool { return !im.peer && !im.reference && !im.variant }

// own returns fairlock's own row among the run's implementations, and
// false when the run measures none (-impls left it out): the scenarios
// only fairlock can run then have nothing to measure.
func (e *env) own() (impl, bool) {
	var im impl
	for _, x := range e.impls {
		if x.ownRow() {
			im = x
		}
	}
	return im, im.name != ""
}

// inOrder returns a before b in name order.
func inOrder(a, b string) (string, string) {
	if b < a {
		return b, a
	}
	return a, b
}

// bothInOrder takes two locks one after the other, in name order.
func bothInOrder(ctx context.Context, l locker, a, b string) (func(context.Context) error, error) {
	a, b = inOrder(a, b)
	ua, err := l.lock(ctx, a)
	if err != nil {
		return nil, err
	}
	ub, err := l.lock(ctx, b)
	if err != nil {
		_ = ua(context.WithoutCancel(ctx))
		return nil, err
	}
	return func(ctx context.Context) error { return errors.Join(ub(ctx), ua(ctx)) }, nil
}

// fairlock

type fairlockLocker struct {
	c     *fairlock.Client
	after func() // closes the Redis client the locker made, if it made one
}

func openFairlock(rdb *redis.Client, prefix string) (locker, error) {
	c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(leaseTTL), countBlocking(rdb))
	if err != nil {
		return nil, err
	}
	return &fairlockLocker{c: c}, nil
}

// countBlocking has the blocking reads of fairlock's client on rdb (which
// go through a go-redis client of fairlock's own, off rdb's pool, with
// none of rdb's hooks) counted with rdb's commands, as the peers' and
// the other clients' blocking reads are: without it, fairlock's row on
// go-redis left out one command per wake-up.
func countBlocking(rdb *redis.Client) fairlock.Option {
	return testhook.BlockingHooks[fairlock.Option](counterOf(rdb))
}

// batchedName is the row of fairlock with batching on, which some
// targets judge beside fairlock's own.
const batchedName = "fairlock-batched"

func openFairlockBatched(rdb *redis.Client, prefix string) (locker, error) {
	c, err := fairlock.New(rdb, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(leaseTTL), fairlock.WithBatching(16), countBlocking(rdb))
	if err != nil {
		return nil, err
	}
	return &fairlockLocker{c: c}, nil
}

func (f *fairlockLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	mu, err := semaphore.NewMutex(f.c, key)
	if err != nil {
		return nil, err
	}
	l, err := mu.Lock(ctx)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (f *fairlockLocker) lockBoth(ctx context.Context, a, b string) (func(context.Context) error, error) {
	l, err := multilock.Lock(ctx, f.c, a, b)
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (f *fairlockLocker) close() {
	_ = f.c.Close()
	if f.after != nil {
		f.after()
	}
}

// redsync

type redsyncLocker struct {
	rs     *redsync.Redsync
	prefix string
}

func openRedsync(rdb *redis.Client, prefix string) (locker, error) {
	return &redsyncLocker{rs: redsync.New(goredis.NewPool(rdb)), prefix: prefix}, nil
}

func (r *redsyncLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	m := r.rs.NewMutex(r.prefix+key, redsync.WithTries(math.MaxInt32), redsync.WithExpiry(leaseTTL))
	if err := m.LockContext(ctx); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := m.UnlockContext(ctx)
		return err
	}, nil
}

func (r *redsyncLocker) lockBoth(ctx context.Context, a, b string) (func(context.Context) error, error) {
	return bothInOrder(ctx, r, a, b)
}

func (r *redsyncLocker) close() {}

// redislock

type redislockLocker struct {
	c      *redislock.Client
	prefix string
}

func openRedislock(rdb *redis.Client, prefix string) (locker, error) {
	return &redislockLocker{c: redislock.New(rdb), prefix: prefix}, nil
}

func (r *redislockLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	l, err := r.c.Obtain(ctx, r.prefix+key, leaseTTL, &redislock.Options{
		RetryStrategy: redislock.LinearBackoff(100 * time.Millisecond),
	})
	if err != nil {
		return nil, err
	}
	return l.Release, nil
}

func (r *redislockLocker) lockBoth(ctx context.Context, a, b string) (func(context.Context) error, error) {
	return bothInOrder(ctx, r, a, b)
}

func (r *redislockLocker) close() {}

// setnx: the lock many services write by hand.

type setnxLocker struct {
	rdb    *redis.Client
	prefix string
}

var compareAndDelete = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)

func openSetNX(rdb *redis.Client, prefix string) (locker, error) {
	return &setnxLocker{rdb: rdb, prefix: prefix}, nil
}

func (s *setnxLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	key = s.prefix + key
	val := rand.Text()
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	for {
		ok, err := s.rdb.SetNX(ctx, key, val, leaseTTL).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			return func(ctx context.Context) error {
				return compareAndDelete.Run(ctx, s.rdb, []string{key}, val).Err()
			}, nil
		}
		t.Reset(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (s *setnxLocker) lockBoth(ctx context.Context, a, b string) (func(context.Context) error, error) {
	return bothInOrder(ctx, s, a, b)
}

func (s *setnxLocker) close() {}
