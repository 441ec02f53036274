package fairlock_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/redis/go-redis/v9"
)

// Semantics 7: fencing tokens strictly increase over all grants of a
// semaphore: across processes, weights, and after its keys expire.
func TestTokensIncrease(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	var last int64
	check := func(l *fairlock.Lease) {
		t.Helper()
		if l.Token() <= last {
			t.Fatalf("token %d after %d", l.Token(), last)
		}
		last = l.Token()
	}
	// Grants within one frozen microsecond still increase.
	s := newSem(e.Client(), "tok", 3)
	var held []*fairlock.Lease
	for range 3 {
		l, err := s.Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		check(l)
		held = append(held, l)
	}
	// A release granting several waiters at once numbers them in order.
	var chans []<-chan fltest.Result
	for i := range 3 {
		chans = append(chans, acquireAsync(ctx, newSem(e.Client(), "tok", 3), 1))
		e.WaitQueued("tok", int64(i+1))
	}
	for _, l := range held {
		e.Release(l)
	}
	for _, ch := range chans {
		r := e.Receive(ch)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		check(r.Lease)
		e.Release(r.Lease)
	}
	// Idle long enough for every key to expire: tokens still increase.
	b.Advance(t, time.Hour)
	if ks := e.Keys(); len(ks) != 0 {
		t.Fatalf("keys after an idle hour: %v", ks)
	}
	l, err := s.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	check(l)
	e.Release(l)
}

// Semantics 8: the capacity is stored with the semaphore while in use.
func TestCapacityMismatch(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		l, err := newSem(e.Client(), "cap", 4).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		_, err = newSem(e.Client(), "cap", 5).Acquire(ctx, 1)
		fltest.IsErr(t, "Acquire with another capacity", err, fairlock.ErrCapacityMismatch)
		_, err = newSem(e.Client(), "cap", 5).TryAcquire(ctx, 1)
		fltest.IsErr(t, "TryAcquire with another capacity", err, fairlock.ErrCapacityMismatch)
		e.Release(l)
		// Idle now: a new capacity is accepted.
		l, err = newSem(e.Client(), "cap", 5).Acquire(ctx, 5)
		if err != nil {
			t.Fatalf("Acquire on the idle semaphore with a new capacity: %v", err)
		}
		e.Release(l)
	})
}

// The state hash records each grant's token (for retried and withdrawn
// calls) only while its lease lives: a grant made at once, and one handed
// over through the queue and confirmed by its holder's renewal, until
// released. On a semaphore that never goes idle, so that its hash never
// expires, the records must not pile up: after many grants of both kinds,
// only the live ones remain.
func TestGrantRecordsDoNotPile(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		s := newSem(e.Client(), "busy", 2)
		// A grant handed over is confirmed by its first renewal, at a
		// third of the waiter TTL: a short one keeps the test short.
		other := newSem(e.Client(fairlock.WithWaiterTTL(600*time.Millisecond)), "busy", 2)
		pinned, err := s.Acquire(ctx, 1) // keeps the semaphore busy throughout
		if err != nil {
			t.Fatal(err)
		}
		// records counts the hash's grant records: fields that are not
		// state fields, whose value is a token (not a tombstone, "x",
		// which the scripts trim after a while), and the holder kept in
		// the hash (o), whose member is its record; not the waiting
		// processes' liveness fields.
		records := func() int {
			t.Helper()
			kv, err := e.RDB.HGetAll(ctx, e.Key("busy", "s")).Result()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for k, v := range kv {
				switch {
				case k == "cap" || k == "used" || k == "nh" || k == "nq" || k == "seq" || k == "exp" || k == "tnext" || k == "hmin" || k == "dmin" || k == "lmin" || k == "zq" ||
					k == "nc" || k == "layout" || k == "oe":
				case v == "x": // tombstones
				case strings.HasPrefix(k, "l\x1f"): // processes' liveness
				default:
					n++
				}
			}
			return n
		}
		if n := records(); n != 1 {
			t.Fatalf("%d grant records with one lease held", n)
		}
		for range 20 {
			// A grant made at once, released.
			l, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			// A grant handed over through the queue, confirmed, released.
			ch := acquireAsync(ctx, other, 1)
			e.WaitQueued("busy", 1)
			e.Release(l)
			r := e.Receive(ch)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			// Confirmed: its expiry moves from the waiter TTL to the
			// lease's, like the pinned one's.
			e.WaitFor("the handed-over grant confirmed", func() bool {
				hs, err := statecheck.Holders(ctx, e.RDB, e.Prefix+"{busy}")
				return err == nil && len(hs) == 2 && int64(hs[0].Score) > time.Now().Add(time.Second).UnixMilli()
			})
			if n := records(); n != 2 {
				t.Fatalf("%d grant records with two leases held", n)
			}
			e.Release(r.Lease)
			if n := records(); n != 1 {
				t.Fatalf("%d grant records once the handed-over lease was released, with one lease held", n)
			}
		}
		if n := records(); n != 1 {
			t.Fatalf("%d grant records after 40 grants came and went, with one lease held", n)
		}
		e.Release(pinned)
	})
}

// hashTag is Redis Cluster's rule for the part of a key that is hashed.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// Semantics 9: one semaphore's keys share a hash tag, and nothing stays
// once it is idle but keys that expire on their own.
func TestKeysShareSlotAndVanish(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, name := range []string{"plain", "{acct}:17", "{a}b}", "x{"} {
			e := fltest.New(t, b)
			s := newSem(e.Client(), name, 2)
			held, err := s.Acquire(ctx, 2)
			if err != nil {
				t.Fatal(err)
			}
			ch := acquireAsync(ctx, newSem(e.Client(), name, 2), 1)
			e.WaitFor("a waiter on "+name, func() bool {
				for _, k := range e.Keys() {
					if strings.HasSuffix(k, ":q") {
						return true
					}
				}
				return false
			})
			tags := map[string]bool{}
			for _, k := range e.Keys() {
				tags[hashTag(k)] = true
			}
			if len(tags) != 1 {
				t.Fatalf("keys of %q hash as %v, want one tag", name, tags)
			}
			e.Release(held)
			r := e.Receive(ch)
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			e.Release(r.Lease)
			// Left: the state hash, for the token sequence and the
			// tombstones of released leases, and the tombstones' index,
			// for their lifetime (20 s) and at most half of it more (so
			// that most releases set no TTL); wake lists until their TTL.
			for _, k := range e.Keys() {
				ttl, err := e.RDB.PTTL(ctx, k).Result()
				if err != nil || ttl <= 0 {
					t.Fatalf("idle %q left key %s with TTL %v (%v)", name, k, ttl, err)
				}
				switch {
				case strings.Contains(k, "\x1fw\x1f"): // an own wake list (keyspace.Keys.Derived)
				case (strings.HasSuffix(k, ":s") || strings.HasSuffix(k, ":t")) && ttl <= 31*time.Second:
				default:
					t.Fatalf("idle %q left key %s with TTL %v", name, k, ttl)
				}
			}
			if b.Mini != nil {
				b.Mini.FastForward(time.Hour)
				if ks := e.Keys(); len(ks) != 0 {
					t.Fatalf("keys of %q once their TTLs ran out: %v", name, ks)
				}
			}
		}
	})
}

// Status shows live holders and waiters, with owners, tokens and times.
func TestStatus(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	alice := e.Client(fairlock.WithOwner("alice"), fairlock.WithLeaseTTL(time.Minute))
	held, err := newSem(alice, "st", 3).Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	bob := e.Client(fairlock.WithOwner("bob"), fairlock.WithWaiterTTL(time.Second))
	ch := acquireAsync(ctx, newSem(bob, "st", 3), 2)
	e.WaitQueued("st", 1)

	st, err := alice.Status(ctx, "st")
	if err != nil {
		t.Fatal(err)
	}
	if st.Capacity != 3 || st.InUse != 2 || len(st.Holders) != 1 || len(st.Waiters) != 1 {
		t.Fatalf("Status = %+v, want capacity 3, 2 in use, one holder, one waiter", st)
	}
	if h := st.Holders[0]; h.Owner != "alice" || h.Permits != 2 || h.Token != held.Token() || h.ExpiresIn != time.Minute {
		t.Fatalf("holder = %+v, want alice holding 2 with token %d for 1m", h, held.Token())
	}
	if w := st.Waiters[0]; w.Owner != "bob" || w.Permits != 2 {
		t.Fatalf("waiter = %+v, want bob waiting for 2", w)
	}
	// Bob's process shuts down; Close takes him out of the queue.
	e.NotYet(ch, "bob")
	if err := bob.Close(); err != nil {
		t.Fatal(err)
	}
	e.Receive(ch)
	st, err = alice.Status(ctx, "st")
	if err != nil || len(st.Waiters) != 0 {
		t.Fatalf("Status after bob left = %+v, %v", st, err)
	}
	e.Release(held)
	if st, err = alice.Status(ctx, "st"); err != nil || st.Capacity != 0 || len(st.Holders) != 0 {
		t.Fatalf("Status when idle = %+v, %v", st, err)
	}
	_, err = alice.Status(ctx, "")
	fltest.IsErr(t, "Status of an empty name", err, fairlock.ErrInvalidName)
	_, err = fairlock.New(e.RDB, fairlock.WithOwner("has space"))
	fltest.IsErr(t, "WithOwner with a space", err, fairlock.ErrInvalidArgument)
}

// Status reports a holder or waiter it cannot read with ErrRedis, rather
// than leave it out of the snapshot.
func TestStatusBadMember(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		c := e.Client()
		l, err := newSem(c, "bad", 1).Acquire(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Release(l)
		if _, err := c.Status(ctx, "bad"); err != nil {
			t.Fatalf("Status before the bad member: %v", err)
		}
		far := float64(time.Now().Add(time.Hour).UnixMilli())
		for _, m := range []string{"t1 many c1 5", "t2 1 c2", "t3 1 c3 token"} {
			if err := e.RDB.ZAdd(ctx, e.Key("bad", "h"), redis.Z{Score: far, Member: m}).Err(); err != nil {
				t.Fatal(err)
			}
			_, err := c.Status(ctx, "bad")
			fltest.IsErr(t, fmt.Sprintf("Status with holder %q", m), err, fairlock.ErrRedis)
			e.RDB.ZRem(ctx, e.Key("bad", "h"), m)
		}
	})
}

// Tombstones (what a resent call finds of a lease that ended without its
// release) do not pile up on a semaphore that never goes idle: each lives
// 10 to 20 s by Redis's clock and is trimmed by a later script. A released
// lease leaves none.
func TestTombstonesAreTrimmed(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	s := newSem(e.Client(fairlock.WithLeaseTTL(time.Hour)), "busy", 2)
	pinned, err := s.Acquire(ctx, 1) // keeps the semaphore busy throughout
	if err != nil {
		t.Fatal(err)
	}
	tombs := func() int64 {
		t.Helper()
		n, err := e.RDB.ZCard(ctx, e.Key("busy", "t")).Result()
		if err != nil {
			t.Fatal(err)
		}
		kv, _ := e.RDB.HGetAll(ctx, e.Key("busy", "s")).Result()
		var fields int64
		for _, v := range kv {
			if v == "x" {
				fields++
			}
		}
		if fields != n {
			t.Fatalf("%d tombstones in the state hash, %d in their index", fields, n)
		}
		return n
	}
	// released takes and releases k leases: no tombstone.
	released := func(k int) {
		for range k {
			l, err := s.Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			e.Release(l)
		}
	}
	// ended takes k leases whose processes stop (Abandon), each ending
	// when its TTL runs out and dropped by the next acquisition: the
	// last one stays held, expired.
	const ttl = 100 * time.Millisecond
	ended := func(k int) {
		for range k {
			c := e.Client(fairlock.WithLeaseTTL(ttl))
			if _, err := newSem(c, "busy", 2).Acquire(ctx, 1); err != nil {
				t.Fatal(err)
			}
			if err := c.Abandon(); err != nil {
				t.Fatal(err)
			}
			b.Advance(t, ttl)
		}
	}
	released(30)
	if n := tombs(); n != 0 {
		t.Fatalf("%d tombstones after 30 releases, want 0", n)
	}
	ended(31)
	if n := tombs(); n != 30 {
		t.Fatalf("%d tombstones after 30 leases ended unreleased, want 30", n)
	}
	b.Advance(t, 21*time.Second)
	ended(1)
	if n := tombs(); n != 1 {
		t.Fatalf("%d tombstones 21 s later and one more lease ended, want 1", n)
	}
	e.Release(pinned)
}
