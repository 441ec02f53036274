package election_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
)

// leaseEnd is one way a leader's lease ends.
type leaseEnd struct {
	name string
	// published: the end is published (observers see it as Redis pushes
	// it); otherwise nobody is left to publish, and observers see it
	// within a round trip of the lease's expiry by Redis's clock.
	published bool
	// end ends the leadership l, won on the client c (whose Redis link
	// faults can cut), and returns by when the lease has ended in Redis
	// at the latest.
	end func(t *testing.T, l *election.Leadership, c *fairlock.Client, faults *redistest.Faults) time.Time
}

// endTTL is the lease TTL of the leaders whose lease lapses: short, so
// the test does not wait long, and long enough that a loaded machine
// renews it in time.
const endTTL = time.Second

// endSlack is what the test allows past the documented bound of an
// observer that learns of a lapse (the lease's expiry plus a round trip),
// for a loaded machine.
const endSlack = 3 * time.Second

var leaseEnds = []leaseEnd{
	{name: "resign", published: true, end: func(t *testing.T, l *election.Leadership, _ *fairlock.Client, _ *redistest.Faults) time.Time {
		if err := l.Resign(context.Background()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		return time.Now()
	}},
	{name: "close", published: true, end: func(t *testing.T, _ *election.Leadership, c *fairlock.Client, _ *redistest.Faults) time.Time {
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		return time.Now()
	}},
	// Shutdown waits for the leases that code holds, a leadership among
	// them, until its context ends; then it ends them, as Close does.
	{name: "shutdown", published: true, end: func(t *testing.T, _ *election.Leadership, c *fairlock.Client, _ *redistest.Faults) time.Time {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if err := c.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown of a leader's client whose context ends = %v, want an error matching context.DeadlineExceeded", err)
		}
		return time.Now()
	}},
	// The lease lapses: its client stops renewing it (Abandon), as a
	// crashed process does, and nobody publishes.
	{name: "lapse", end: func(t *testing.T, _ *election.Leadership, c *fairlock.Client, _ *redistest.Faults) time.Time {
		if err := c.Abandon(); err != nil {
			t.Fatalf("Abandon: %v", err)
		}
		return time.Now().Add(endTTL)
	}},
	// The holder's process stalls past its TTL: its renewals do not
	// reach Redis until after the lease has expired there.
	{name: "pause", end: func(t *testing.T, l *election.Leadership, _ *fairlock.Client, faults *redistest.Faults) time.Time {
		faults.Down.Store(true)
		t.Cleanup(func() { faults.Down.Store(false) })
		return time.Now().Add(endTTL)
	}},
}

// Every way a leader's lease ends reaches both faces, Observe and Leader,
// with nobody queued (no leader) and with a successor queued (no leader,
// then the successor, or the successor at once): a published end at once,
// a lapse within a round trip of the lease's expiry (the test allows
// endSlack more).
func TestLeaseEndsReachObservers(t *testing.T) {
	if testing.Short() {
		t.Skip("long: a real server's run for seconds; runs in the full suite (without -short)")
	}
	for _, way := range leaseEnds {
		for _, successor := range []bool{false, true} {
			name := way.name + "/alone"
			if successor {
				name = way.name + "/successor"
			}
			t.Run(name, func(t *testing.T) {
				redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
					leaseEndReachesObservers(t, b, way, successor)
				})
			})
		}
	}
}

func leaseEndReachesObservers(t *testing.T, b *redistest.Backend, way leaseEnd, successor bool) {
	e := newEnv(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const name = "ends"
	// A published end must not be seen only by way of the lease's
	// expiry: those leases are long.
	ttl := fairlock.WithLeaseTTL(endTTL)
	if way.published {
		ttl = fairlock.WithLeaseTTL(time.Minute)
	}
	c, faults := e.FaultyClient(ttl)
	la, err := e.election(c, name).Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	obs := e.election(e.Client(), name)
	ch := obs.Observe(ctx)
	if got := e.next(ch); got.Term != la.Term() {
		t.Fatalf("Observe delivered %+v first, want a's term %d", got, la.Term())
	}
	var next <-chan won
	if successor {
		next = campaignAsync(ctx, e.election(e.Client(ttl), name), "b")
		fltest.WaitWaiters(t, e.Client(), name, 1)
	}
	ended := way.end(t, la, c, faults)
	bound := time.Until(ended) + endSlack

	// Observe: no leader, then the successor (or the successor at once).
	got := nextWithin(t, ch, bound, fmt.Sprintf("the end of a's lease (%s)", way.name))
	if successor && got.Term == 0 {
		got = nextWithin(t, ch, bound, "the successor")
	}
	var want election.Info
	if successor {
		lb := e.receive(next)
		defer func() { _ = lb.Resign(context.Background()) }()
		want = election.Info{Value: "b", Term: lb.Term()}
	}
	if got != want {
		t.Fatalf("after %s, Observe delivered %+v; want %+v", way.name, got, want)
	}
	// Leader says the same.
	l, err := obs.Leader(ctx)
	switch {
	case want.Term == 0 && !errors.Is(err, election.ErrNoLeader):
		t.Fatalf("after %s, Leader() = %+v, %v; want ErrNoLeader", way.name, l, err)
	case want.Term != 0 && (err != nil || l != want):
		t.Fatalf("after %s, Leader() = %+v, %v; want %+v", way.name, l, err, want)
	}
}

// nextWithin returns the next change ch delivers, failing if none comes
// within d.
func nextWithin(t *testing.T, ch <-chan election.Info, d time.Duration, what string) election.Info {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case info, ok := <-ch:
		if !ok {
			t.Fatal("Observe's channel closed")
		}
		return info
	case <-timer.C:
		t.Fatalf("Observe delivered nothing within %v of %s", d.Round(time.Millisecond), what)
		return election.Info{}
	}
}

// While a Shutdown waits for the leases code holds, a leadership among
// them, the leader's record is renewed with its lease: Leader and Observe
// keep showing the leader, however long the wait lasts past the record's
// TTL (two lease TTLs).
func TestLeaderRecordLastsWhileShutdownWaits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		const name = "drain"
		const ttl = 200 * time.Millisecond
		c := e.Client(fairlock.WithLeaseTTL(ttl))
		la, err := e.election(c, name).Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(context.Background(), 20*ttl)
		defer scancel()
		shut := make(chan error, 1)
		go func() { shut <- c.Shutdown(sctx) }()
		obs := e.election(e.Client(), name)
		// Six lease TTLs into the wait: three times the record's TTL.
		for deadline := time.Now().Add(6 * ttl); time.Now().Before(deadline); time.Sleep(ttl / 4) {
			if err := la.Err(); err != nil {
				t.Fatalf("the leadership ended during Shutdown's wait: %v", err)
			}
			info, err := obs.Leader(ctx)
			if err != nil || info.Term != la.Term() {
				t.Fatalf("Leader during Shutdown's wait = %+v, %v; want a's term %d", info, err, la.Term())
			}
		}
		if err := la.Resign(context.Background()); err != nil {
			t.Fatalf("Resign during Shutdown's wait: %v", err)
		}
		if err := <-shut; err != nil {
			t.Fatalf("Shutdown once the leader resigned = %v, want nil", err)
		}
	})
}
