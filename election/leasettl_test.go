package election_test

import (
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// WithLeaseTTL gives one election's leaderships their TTL, on a client
// whose other leases keep the default (10s): the leader stays leader for
// many of its TTLs, renewed; abandoned, it is followed by the next
// candidate about one TTL later, while a lease of the same client with
// the client's TTL still holds.
func TestWithLeaseTTL(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := fltest.Bounded(t)
		// Renewed every 300 ms: lost only if this process cannot run for
		// about 0.6 s (300 ms leases were lost on a machine at load 9).
		const ttl = 900 * time.Millisecond
		c := e.Client()
		el, err := election.New(c, "short", election.WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		l, err := el.Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		other, err := c.Acquire(ctx, fairlock.Request{Name: "long", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // several TTLs, renewed
		if err := l.Err(); err != nil {
			t.Fatalf("leadership with WithLeaseTTL(%v) after 2s: %v", ttl, err)
		}
		st, err := c.Status(ctx, "short")
		if err != nil || len(st.Holders) != 1 || st.Holders[0].ExpiresIn > ttl {
			t.Fatalf("Status(short) = %+v, %v; want one holder expiring within %v", st, err, ttl)
		}
		e.leaderIs(el, election.Info{Value: "a", Term: l.Term()})

		next := campaignAsync(ctx, e.election(e.Client(), "short"), "b")
		abandoned := time.Now()
		if err := c.Abandon(); err != nil {
			t.Fatal(err)
		}
		w := <-next
		if w.err != nil {
			t.Fatalf("next candidate's Campaign = %v", w.err)
		}
		if took := time.Since(abandoned); took > ttl+2*time.Second {
			t.Errorf("the next candidate led %v after the leader was abandoned, with WithLeaseTTL(%v)", took, ttl)
		}
		if _, err := e.Client().TryAcquire(ctx, fairlock.Request{Name: "long", Capacity: 1, Permits: 1}); err == nil {
			t.Errorf("the client's-TTL lease lapsed %v after Abandon", time.Since(abandoned))
		}
		_ = w.l.Resign(ctx)
		_ = other.Release(ctx)
	})
}

// An election's lease TTL out of range fails New with ErrInvalidArgument
// naming it.
func TestWithLeaseTTLRefused(t *testing.T) {
	e := newEnv(t, redistest.Mini(t))
	c := e.Client()
	for _, d := range []time.Duration{-time.Second, time.Millisecond, fairlock.MaxTTL + time.Second} {
		_, err := election.New(c, "e", election.WithLeaseTTL(d))
		fltest.IsErr(t, "New(WithLeaseTTL("+d.String()+"))", err, fairlock.ErrInvalidArgument)
		if !strings.Contains(err.Error(), "LeaseTTL") {
			t.Errorf("error %q does not name the lease TTL", err)
		}
	}
	if _, err := election.New(c, "e", election.WithLeaseTTL(0), nil); err != nil {
		t.Fatalf("New(WithLeaseTTL(0), nil) = %v, want nil (the client's TTL)", err)
	}
}
