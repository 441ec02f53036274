package fairlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/robustness"
	"github.com/redis/go-redis/v9"
)

// embeddedRing is a caller's wrapper that embeds a Ring: it shows all of
// Ring's methods.
type embeddedRing struct{ *redis.Ring }

// ringLike is an interface a caller might wrap a Ring behind, keeping
// Ring's shard methods.
type ringLike interface {
	fairlock.RedisClient
	SetAddrs(addrs map[string]string)
	GetShardClientForKey(key string) (*redis.Client, error)
}

// ringBehind wraps whatever its interface holds (a Ring here).
type ringBehind struct{ ringLike }

// ringWithOptions forwards RedisClient to a Ring and shows the Ring's
// options.
type ringWithOptions struct {
	fairlock.RedisClient
	r *redis.Ring
}

func (w ringWithOptions) Options() *redis.RingOptions { return w.r.Options() }

// hiddenRing forwards only RedisClient's methods to a Ring it keeps in a
// field: nothing about it says Ring, and New cannot recognise it.
type hiddenRing struct{ r *redis.Ring }

func (h hiddenRing) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return h.r.Eval(ctx, script, keys, args...)
}

func (h hiddenRing) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return h.r.EvalSha(ctx, sha1, keys, args...)
}

func (h hiddenRing) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return h.r.EvalRO(ctx, script, keys, args...)
}

func (h hiddenRing) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return h.r.EvalShaRO(ctx, sha1, keys, args...)
}

func (h hiddenRing) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return h.r.ScriptExists(ctx, hashes...)
}

func (h hiddenRing) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return h.r.ScriptLoad(ctx, script)
}

func (h hiddenRing) BLPop(ctx context.Context, timeout time.Duration, keys ...string) *redis.StringSliceCmd {
	return h.r.BLPop(ctx, timeout, keys...)
}

// wrappedClient embeds a *redis.Client: its Options returns *redis.Options,
// not a Ring's, and it must not be taken for a Ring.
type wrappedClient struct{ *redis.Client }

// New refuses a go-redis Ring, and every type that shows Ring's own
// methods, with ErrInvalidArgument and a message that says why and what
// to use instead. The other go-redis clients, and a wrapper of a
// *redis.Client, are accepted.
func TestNewRefusesRing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": b.Addr}})
		t.Cleanup(func() { _ = ring.Close() })

		refused := []struct {
			name string
			rdb  fairlock.RedisClient
			opts []fairlock.Option
		}{
			{"*redis.Ring", ring, nil},
			{"*redis.Ring with WithReplicaAck", ring, []fairlock.Option{fairlock.WithReplicaAck(1, time.Second)}},
			{"struct embedding *redis.Ring", embeddedRing{ring}, nil},
			{"wrapper showing SetAddrs and GetShardClientForKey", ringBehind{ring}, nil},
			{"wrapper showing Options() *redis.RingOptions", ringWithOptions{ring, ring}, nil},
		}
		for _, tc := range refused {
			t.Run(tc.name, func(t *testing.T) {
				c, err := fairlock.New(tc.rdb, tc.opts...)
				if err == nil {
					_ = c.Close()
					t.Fatalf("New(%T) made a client; want it refused: a Ring moves keys between shards", tc.rdb)
				}
				fltest.IsErr(t, "New on a Ring", err, fairlock.ErrInvalidArgument)
				for _, want := range []string{"Ring", "two processes could hold one lock", "ClusterClient", "Sentinel"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			})
		}

		cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{b.Addr}})
		t.Cleanup(func() { _ = cluster.Close() })
		failover := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{b.Addr}})
		t.Cleanup(func() { _ = failover.Close() })
		accepted := []struct {
			name string
			rdb  fairlock.RedisClient
		}{
			{"*redis.Client", b.Client(t)},
			{"*redis.ClusterClient", cluster},
			{"Sentinel failover client", failover},
			{"struct embedding *redis.Client", wrappedClient{b.Client(t)}},
			// The documented limit: a wrapper that shows nothing of its
			// Ring cannot be recognised.
			{"wrapper hiding a Ring", hiddenRing{ring}},
		}
		for _, tc := range accepted {
			t.Run(tc.name, func(t *testing.T) {
				c, err := fairlock.New(tc.rdb)
				if err != nil {
					t.Fatalf("New(%T): %v", tc.rdb, err)
				}
				_ = c.Close()
			})
		}
	})
}

// A client cut off from the shard that keeps a mutex must not be granted
// it elsewhere while the holder keeps it. On a go-redis Ring that is what
// happens: the cut-off client's Ring marks the shard down after a few
// failed heartbeats and sends the mutex's keys to another shard, where
// nobody holds it. So New refuses a Ring, and no fairlock client, hence no
// second holder, can be made on one. The rest of the test shows, through a
// wrapper that hides its Ring from New (the documented limit), the two
// holders that the refusal prevents: two live leases of one mutex at once,
// each on its own shard.
func TestRingPartitionNoSecondHolder(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	shardA := redistest.RealBackend(t)
	srvB, err := redisserver.Start()
	if err != nil {
		t.Fatalf("starting shard b: %v", err)
	}
	t.Cleanup(srvB.Stop)
	proxy, err := robustness.StartProxy(shardA.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	newRing := func(addrA string) *redis.Ring {
		// The heartbeat every 50 ms rather than go-redis's 500 ms: the
		// shard is marked down after three failures all the same.
		r := redis.NewRing(&redis.RingOptions{
			Addrs:              map[string]string{"a": addrA, "b": srvB.Addr},
			HeartbeatFrequency: 50 * time.Millisecond,
		})
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	// The holder reaches shard a directly; the other client through the
	// proxy, which the test cuts.
	holderRing, cutRing := newRing(shardA.Addr), newRing(proxy.Addr())

	for _, r := range []*redis.Ring{holderRing, cutRing} {
		c, err := fairlock.New(r)
		if err == nil {
			_ = c.Close()
			t.Fatal("New made a client on a Ring: a client cut off from one shard could be a second holder")
		}
		fltest.IsErr(t, "New on a Ring", err, fairlock.ErrInvalidArgument)
	}

	// What the refusal prevents.
	prefix := redistest.Prefix(t)
	const ttl = time.Second
	holder, err := fairlock.New(hiddenRing{holderRing}, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Close() })
	other, err := fairlock.New(hiddenRing{cutRing}, fairlock.WithPrefix(prefix), fairlock.WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })
	shardOf := func(r *redis.Ring, name string) string {
		c, err := r.GetShardClientForKey(prefix + "{" + name + "}:s")
		if err != nil {
			t.Fatal(err)
		}
		return c.Options().Addr
	}
	// A mutex whose keys both Rings place on shard a.
	var name string
	for _, n := range []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"} {
		if shardOf(holderRing, n) == shardA.Addr && shardOf(cutRing, n) == proxy.Addr() {
			name = n
			break
		}
	}
	if name == "" {
		t.Fatal("no mutex name on shard a among ten")
	}
	mutex := fairlock.Request{Name: name, Capacity: 1, Permits: 1}
	ctx := context.Background()

	first, err := holder.Acquire(ctx, mutex)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Release(ctx)
	if l, err := other.TryAcquire(ctx, mutex); !errors.Is(err, fairlock.ErrNotAcquired) {
		if err == nil {
			_ = l.Release(ctx)
		}
		t.Fatalf("before the cut, TryAcquire of the held mutex: %v, want ErrNotAcquired", err)
	}

	heal := proxy.Cut()
	defer heal()
	cut := time.Now()
	deadline := cut.Add(10 * time.Second)
	for shardOf(cutRing, name) != srvB.Addr {
		if time.Now().After(deadline) {
			t.Fatal("the cut-off Ring still places the mutex on shard a 10 s after the cut")
		}
		time.Sleep(10 * time.Millisecond)
	}
	moved := time.Since(cut)
	second, err := other.TryAcquire(ctx, mutex)
	if err != nil {
		t.Fatalf("after the cut-off Ring moved the mutex to shard b: %v (the split brain did not show)", err)
	}
	defer second.Release(ctx)
	t.Logf("the cut-off Ring moved the mutex to shard b %v after the cut; second grant: token %d (the holder's: %d)",
		moved.Round(time.Millisecond), second.Token(), first.Token())

	// Two live holders, each renewing on its own shard, for as long as the
	// cut lasts; two lease TTLs here.
	time.Sleep(2 * ttl)
	for who, l := range map[string]*fairlock.Lease{"holder": first, "second holder": second} {
		if err := l.Err(); err != nil {
			t.Fatalf("%s's lease ended (%v) two TTLs after the second grant; both were meant to stay live", who, err)
		}
	}
	for who, c := range map[string]*fairlock.Client{"holder": holder, "second holder": other} {
		st, err := c.Status(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Held != 1 {
			t.Fatalf("%s's shard holds %d leases of %q, want 1", who, st.Held, name)
		}
	}
	t.Logf("both leases live %v after the second grant: one mutex, two holders", 2*ttl)
}
