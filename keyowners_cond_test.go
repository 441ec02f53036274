package fairlock

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/redis/go-redis/v9"
)

// The condition "q" of the mutex "a" and the semaphore named "{a}:c" are
// two objects: acquiring and releasing "{a}:c" never grants the
// condition's waiter, whose wait must return a lease of "a" only once the
// other holder of "a" has let it go. (When the condition kept its waiters
// at "{a}:c:q", the queue of "{a}:c", a release of "{a}:c" granted the
// waiter there, and its wait came back holding "a" beside that holder.)
func TestConditionIsNoOtherSemaphoresQueue(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		prefix := WithPrefix(redistest.Prefix(t))
		newC := func() *Client {
			c, err := New(b.Client(t), prefix)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		}
		waiter, holder, other := newC(), newC(), newC()
		mutex := Request{Name: "a", Capacity: 1, Permits: 1}
		la, err := waiter.Acquire(ctx, mutex)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			l   *Lease
			err error
		}
		woke := make(chan result, 1)
		go func() {
			l, err := la.condWait(ctx, "q")
			woke <- result{l, err}
		}()
		// The wait has released "a" once another process can take it.
		lb, err := holder.Acquire(ctx, mutex)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			lc, err := other.Acquire(ctx, Request{Name: "{a}:c", Capacity: 1, Permits: 1})
			if err != nil {
				t.Fatalf("acquire %d of {a}:c: %v", i, err)
			}
			if err := lc.Release(ctx); err != nil {
				t.Fatalf("release %d of {a}:c: %v", i, err)
			}
		}
		st, err := holder.Status(ctx, "{a}:c")
		if err != nil {
			t.Fatal(err)
		}
		if st.Held != 0 || st.Queued != 0 {
			t.Fatalf("{a}:c after its leases ended: %d held, %d queued (%+v); want none: the condition's waiter is not its", st.Held, st.Queued, st)
		}
		select {
		case r := <-woke:
			if r.l != nil {
				t.Fatalf("condition wait on a returned a lease of a (token %d) while another process holds a (token %d)", r.l.Token(), lb.Token())
			}
			t.Fatalf("condition wait on a returned %v while another process holds a", r.err)
		default:
		}
		// Signalled, the waiter queues for "a", and gets it once the holder
		// releases it.
		if n, err := holder.signal(ctx, "a", "q", false); err != nil || n != 1 {
			t.Fatalf("signal(a, q) = %d, %v; want 1 woken", n, err)
		}
		if st, err := holder.Status(ctx, "a"); err != nil || st.Held != 1 || st.Queued != 1 {
			t.Fatalf("a after the signal: %+v, %v; want its holder and the woken waiter queued", st, err)
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-woke:
			if r.err != nil {
				t.Fatalf("condition wait: %v", r.err)
			}
			if r.l.Token() <= lb.Token() {
				t.Errorf("woken waiter's token %d, not above the holder's %d", r.l.Token(), lb.Token())
			}
			_ = r.l.Release(ctx)
		case <-time.After(30 * time.Second):
			t.Fatal("condition wait not granted a 30 s after a's holder released it")
		}
	})
}

// The scripts build derived keys (derived_key in lua/rules.lua) from
// KEY_SEP in queue.lua, which must be keyspace.Sep: a Lua string literal, read
// back through a server's Lua.
func TestKeySepInStep(t *testing.T) {
	m := regexp.MustCompile(`(?m)^local KEY_SEP = ('[^'\n]*')$`).FindStringSubmatch(script.Source("queue.lua"))
	if m == nil {
		t.Fatal("queue.lua defines no KEY_SEP = '...'")
	}
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	got, err := rdb.Eval(context.Background(), "return "+m[1], nil).Text()
	if err != nil {
		t.Fatal(err)
	}
	if got != keyspace.Sep {
		t.Fatalf("queue.lua's KEY_SEP is %q, keyspace.Sep %q", got, keyspace.Sep)
	}
}

// refresh.lua recognises a latch's and a barrier's waiters by the kind
// that ends their resource's base (open, broken): the letters it names are
// the kinds the root package registers for them.
func TestRefreshKnowsThePrimitivesKinds(t *testing.T) {
	src := script.Source("lua/ops/refresh.lua")
	for _, kind := range []string{kindLatch, kindBarrier} {
		if want := "== KEY_SEP .. '" + kind + "' then"; !strings.Contains(src, want) {
			t.Errorf("refresh.lua does not recognise the kind %q (no %q)", kind, want)
		}
	}
	if !slices.Contains(keyspace.Kinds(), kindLatch) || !slices.Contains(keyspace.Kinds(), kindBarrier) {
		t.Errorf("keyspace.Kinds() = %q: the latch's and the barrier's are not registered", keyspace.Kinds())
	}
}
