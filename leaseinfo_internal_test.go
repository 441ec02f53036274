package fairlock

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// A lease prints as its semaphores, tokens, permits and state, never its
// ticket (which would let a reader of the log renew or release it), and
// its Expiry is a lower bound of Redis's expiry: no later than a TTL after
// the grant was sent, zero once the lease has ended. Each state a lease
// can be in is printed in a word, without ending the lease.
func TestLeaseStringAndExpiry(t *testing.T) {
	const ttl = time.Hour // nothing expires by itself while the test runs
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	newClient := func() *Client {
		c, err := New(rdb, WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := newClient()
	ctx := context.Background()
	req := func(name string, capacity, n int64) Request {
		return Request{Name: name, Capacity: capacity, Permits: n}
	}
	check := func(what string, l *Lease, want string) {
		t.Helper()
		for _, verb := range []string{"%v", "%+v", "%s"} {
			got := fmt.Sprintf(verb, l)
			if got != want {
				t.Errorf("%s: Sprintf(%q, lease) = %q, want %q", what, verb, got, want)
			}
			if strings.Contains(got, l.ticket) {
				t.Errorf("%s: Sprintf(%q, lease) = %q holds the lease's ticket %q", what, verb, got, l.ticket)
			}
		}
	}

	sent := time.Now()
	l, err := c.Acquire(ctx, req("jobs", 3, 1))
	if err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	check("held", l, fmt.Sprintf(`fairlock lease "jobs": token %d, 1 permit, held`, l.Token()))
	if exp := l.Expiry(); exp.After(answered.Add(ttl)) || exp.Before(sent.Add(ttl-time.Minute)) {
		t.Errorf("Expiry() = %v, want at most a TTL (%v) after the grant was sent (%v, answered %v)", exp, ttl, sent, answered)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check("released", l, fmt.Sprintf(`fairlock lease "jobs": token %d, 1 permit, released`, l.Token()))
	if exp := l.Expiry(); !exp.IsZero() {
		t.Errorf("Expiry() of a released lease = %v, want the zero time", exp)
	}

	m, err := c.AcquireAll(ctx, req("b", 3, 1), req("a", 3, 2))
	if err != nil {
		t.Fatal(err)
	}
	pa, pb := m.Parts()[0], m.Parts()[1]
	check("over two semaphores", m, fmt.Sprintf(`fairlock lease ["a" "b"]: "a" token %d, 2 permits; "b" token %d, 1 permit, held`, pa.Token, pb.Token))

	// Past its deadline, unrenewed: "expired" until something (Err here)
	// ends it as lost.
	x, err := c.Acquire(ctx, req("x", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	x.rmu.Lock()
	x.deadline = time.Now().Add(-time.Second)
	x.rmu.Unlock()
	check("past its deadline", x, fmt.Sprintf(`fairlock lease "x": token %d, 1 permit, expired`, x.Token()))
	if x.Err() == nil {
		t.Fatal("Err() past the deadline = nil")
	}
	check("lost", x, fmt.Sprintf(`fairlock lease "x": token %d, 1 permit, lost`, x.Token()))

	a := newClient()
	y, err := a.Acquire(ctx, req("y", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Abandon(); err != nil {
		t.Fatal(err)
	}
	check("abandoned", y, fmt.Sprintf(`fairlock lease "y": token %d, 1 permit, abandoned`, y.Token()))
	z := newClient()
	w, err := z.Acquire(ctx, req("w", 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	check("released by Close", w, fmt.Sprintf(`fairlock lease "w": token %d, 1 permit, released`, w.Token()))
	_ = m.Release(ctx)
}
