package fairlock

import (
	"errors"
	"testing"

	"github.com/alicebob/miniredis/v2"
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
		{"a}b", "p:{a}b}", "a"},
		{"x{", "p:{x{}", "x{"},
		{"{}x", "p:{{}x}", "{"},
	} {
		k, err := c.keys(tc.name)
		if err != nil {
			t.Fatalf("keys(%q): %v", tc.name, err)
		}
		if k.base != tc.base {
			t.Errorf("keys(%q).base = %q, want %q", tc.name, k.base, tc.base)
		}
		for _, key := range append(k.list(), k.wake("C")) {
			if got := hashTag(key); got != tc.tag {
				t.Errorf("hash tag of %q = %q, want %q", key, got, tc.tag)
			}
		}
	}
	// "{acct}" alone would collide with "acct".
	if _, err := c.keys("{acct}"); !errors.Is(err, ErrInvalidName) {
		t.Errorf("keys(%q) = %v, want ErrInvalidName", "{acct}", err)
	}
}
