package fairlock

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/keyslot"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestKeyLayout(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	c, err := New(rdb, WithPrefix("p:"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, tc := range []struct {
		name, base, tag string
	}{
		{"jobs", "p:{jobs}", "jobs"},
		{"{acct}:17", "p:{acct}:17", "acct"},
		{"{acct}:18", "p:{acct}:18", "acct"},
		{"x{", "p:{x{}", "x{"},
		{"{a}b}", "p:{a}b}", "a"},
		{"{{}x}", "p:{{}x}", "{"},
	} {
		k, err := c.keys(tc.name)
		if err != nil {
			t.Fatalf("keys(%q): %v", tc.name, err)
		}
		if k.Base != tc.base {
			t.Errorf("keys(%q).base = %q, want %q", tc.name, k.Base, tc.base)
		}
		// A latch of the name: its count, its waiters' keys and wake
		// lists share the tag (one Cluster slot per latch).
		lk, bk := latchKeysOf(k), barrierKeysOf(k)
		keys := append(append(k.List(), k.Wake("C")), append(lk.call(opLatchDown, 1).Keys, lk.res.OwnWake("C"))...)
		// A barrier's likewise.
		keys = append(keys, append(bk.call(opBarrierAwait, 1).Keys, bk.res.OwnWake("C"))...)
		for _, key := range keys {
			if got := keyslot.HashTag(key); got != tc.tag {
				t.Errorf("hash tag of %q = %q, want %q", key, got, tc.tag)
			}
		}
	}
	// "{acct}" alone would collide with "acct"; an untagged name with a
	// '}' would collide with a tagged one ("a}b" with "{a}b}"), or have keys
	// with no usable hash tag ("}b" would give "p:{}b}:s").
	// A name whose hash tag does not begin it would share its keys with
	// another name under another prefix ("b{c}" under "a", "c" under "ab").
	for _, name := range []string{"{acct}", "a}b", "{}x", "}b", "}", "{}", "{}x}", "ab}{", "b{c}", "acct{17}", "}{a}", "x{a}y"} {
		if _, err := c.keys(name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("keys(%q) = %v, want ErrInvalidName", name, err)
		}
	}
}

// fuzzClientIDs are client ids whose wake lists FuzzKeys checks: a bare
// id as New makes them (rand.Text), ids with owner labels as WithOwner
// makes them, and a short one.
var fuzzClientIDs = []string{"C", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "host:1/ABC", "host:1/ABCDEFGHIJKLMNOPQRSTUVWXYZ", "w:s/ABC"}

// keySet returns every key of k that FuzzKeys compares: the keys scripts
// declare and the wake lists of fuzzClientIDs.
func keySet(k keyspace.Keys) []string {
	ks := append([]string(nil), k.List()...)
	for _, id := range fuzzClientIDs {
		ks = append(ks, k.Wake(id))
	}
	return ks
}

// FuzzKeys checks the name -> keys mapping with one prefix and two names:
// distinct accepted names never share a key, and every key of one
// semaphore has the same non-empty hash tag, hence one Cluster slot, the
// slot plan's cross-slot check computes from the base.
func FuzzKeys(f *testing.F) {
	for _, seed := range [][3]string{
		{"p:", "a}b", "{a}b}"},   // the known collision
		{"p:", "{}x}", "{{}x}}"}, // the same with an empty first tag
		{"", "}", "{}}"},
		{"p:", "}b", "b"}, // no usable hash tag: keys in different slots
		{"p:", "{}x", "{{}x}"},
		{"p:", "acct", "{acct}"},
		{"p:", "x{", "{x{}"},
		{"p:", "{", "{{}"},
		{"fairlock:", "{acct}:17", "{acct}:18"},
		{"fairlock:", "{acct}:17", "acct:17"},
		{"", "{a}x", "{a}x:w:host:1/ABC"},
		{"", "{a}x:w:C", "{a}x"},
		{"", "{a}b:s", "{a}b"},
		{"", "a{b}c", "{a{b}c}"},
		{"", "{{a}}", "{a}"},
		{"p:", "ünï}cøde", "{ünï}cøde}"},
		{"p:", "with space", "{with space}"},
		{"p{", "a", "{a}"}, // a prefix with a brace is refused
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	f.Fuzz(func(t *testing.T, prefix, a, b string) {
		cfg, err := newConfig([]Option{WithPrefix(prefix)})
		if err != nil {
			return
		}
		c := &Client{cfg: cfg}
		ka, errA := c.keys(a)
		kb, errB := c.keys(b)
		for _, r := range []struct {
			name string
			k    keyspace.Keys
			err  error
		}{{a, ka, errA}, {b, kb, errB}} {
			if r.err != nil {
				if !errors.Is(r.err, ErrInvalidName) {
					t.Fatalf("keys(%q): %v, not ErrInvalidName", r.name, r.err)
				}
				continue
			}
			tag := keyslot.HashTag(r.k.Base)
			if tag == "" {
				t.Fatalf("name %q: base %q has no hash tag", r.name, r.k.Base)
			}
			if want := keyslot.HashTag(r.name); want != "" && tag != want {
				t.Fatalf("name %q carries tag %q but its keys have tag %q", r.name, want, tag)
			}
			slot := keyslot.Of(r.k.Base)
			for _, key := range keySet(r.k) {
				if !strings.HasPrefix(key, prefix) {
					t.Fatalf("name %q: key %q lacks prefix %q", r.name, key, prefix)
				}
				if got := keyslot.HashTag(key); got != tag {
					t.Fatalf("name %q: key %q has hash tag %q, base %q has %q", r.name, key, got, r.k.Base, tag)
				}
				if s := keyslot.Of(key); s != slot {
					t.Fatalf("name %q: key %q is in slot %d, base %q in slot %d", r.name, key, s, r.k.Base, slot)
				}
			}
		}
		if errA != nil || errB != nil || a == b {
			return
		}
		// A client on one server hears both names' grants on one list of
		// its own under the prefix, which is no key of either semaphore,
		// and falls back on each name's own list.
		for _, id := range fuzzClientIDs {
			marked := keyspace.ProcessListMark(prefix) + id
			one := ka.Wake(marked)
			if one != kb.Wake(marked) || one != prefix+"{w:"+marked+"}" {
				t.Fatalf("client %q: wake lists %q (%q) and %q (%q), want one, %q", marked, one, a, kb.Wake(marked), b, prefix+"{w:"+marked+"}")
			}
			if keyspace.Unmarked(marked) != id || owner(marked) != owner(id) {
				t.Fatalf("client %q: unmarked %q, owner %q; want %q, %q", marked, keyspace.Unmarked(marked), owner(marked), id, owner(id))
			}
			for _, k := range []keyspace.Keys{ka, kb} {
				if slices.Contains(keySet(k), one) || slices.Contains(k.List(), k.OwnWake(marked)) || keyslot.HashTag(k.OwnWake(marked)) != keyslot.HashTag(k.Base) {
					t.Fatalf("client %q: its one list %q or its own list %q on %q is a key of the semaphore's, or the latter leaves its slot", marked, one, k.OwnWake(marked), k.Base)
				}
			}
		}
		if ka.Base == kb.Base {
			t.Fatalf("names %q and %q share the key base %q", a, b, ka.Base)
		}
		of := map[string]bool{}
		for _, key := range keySet(ka) {
			of[key] = true
		}
		for _, key := range keySet(kb) {
			if of[key] {
				t.Fatalf("names %q and %q share the key %q", a, b, key)
			}
		}
	})
}

// Two names that today map to the same keys, locked together as mutexes
// (capacity 1): the request must be refused, not granted two permits of
// one mutex.
func TestCollidingNamesMultiLock(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, pair := range [][2]string{{"a}b", "{a}b}"}, {"{}x}", "{{}x}}"}} {
			l, err := c.TryAcquireAll(ctx, Request{Name: pair[0], Capacity: 1, Permits: 1}, Request{Name: pair[1], Capacity: 1, Permits: 1})
			if err == nil {
				st, serr := c.Status(ctx, pair[0])
				_ = l.Release(ctx)
				t.Fatalf("multi-lock of %q and %q granted: %d permits of capacity %d in use (status error %v)", pair[0], pair[1], st.InUse, st.Capacity, serr)
			}
			if !errors.Is(err, ErrInvalidName) && !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("multi-lock of %q and %q: %v, want ErrInvalidName or ErrInvalidArgument", pair[0], pair[1], err)
			}
		}
	})
}

// The plan's duplicate check compares key bases as well as names: were the
// mapping ever to give two names one base again, a request naming both
// would be refused rather than take one semaphore's permits twice.
func TestDistinctBases(t *testing.T) {
	mk := func(name, base string) part {
		return part{k: keyspace.Keys{Base: base}, req: Request{Name: name, Capacity: 1, Permits: 1}}
	}
	for _, tc := range []struct {
		parts []part
		ok    bool
	}{
		{[]part{mk("a", "p:{a}"), mk("b", "p:{b}")}, true},
		{[]part{mk("a", "p:{a}"), mk("a", "p:{a}")}, false},
		{[]part{mk("a}b", "p:{a}b}"), mk("x", "p:{x}"), mk("{a}b}", "p:{a}b}")}, false},
	} {
		err := distinct(tc.parts)
		if tc.ok && err != nil {
			t.Errorf("distinct(%v): %v", tc.parts, err)
		}
		if !tc.ok && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("distinct(%v) = %v, want ErrInvalidArgument", tc.parts, err)
		}
	}
}
