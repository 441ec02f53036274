package election_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/election"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/semaphore"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { mainWithWorkers(m) }

// Candidates lead in the order they campaigned, each with a higher term
// than the one before; Resign hands over at once.
func TestCampaignFIFO(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		first := e.election(e.Client(), "fifo")
		l, err := first.Campaign(ctx, "c0")
		if err != nil {
			t.Fatal(err)
		}
		const n = 4
		var chs []<-chan won
		for i := range n {
			chs = append(chs, campaignAsync(ctx, e.election(e.Client(), "fifo"), fmt.Sprintf("c%d", i+1)))
			fltest.WaitWaiters(t, e.Client(), "fifo", i+1)
		}
		for i := range n {
			prev := l
			e.resign(prev)
			l = e.receive(chs[i])
			if want := fmt.Sprintf("c%d", i+1); l.Value() != want {
				t.Fatalf("leader %d is %q, want %q (first-in first-out)", i+1, l.Value(), want)
			}
			if l.Term() <= prev.Term() {
				t.Fatalf("term %d after %d, want a higher one", l.Term(), prev.Term())
			}
			e.leaderIs(first, election.Info{Value: l.Value(), Term: l.Term()})
			for _, ch := range chs[i+1:] {
				select {
				case w := <-ch:
					t.Fatalf("a later candidate led out of turn: %+v", w)
				default:
				}
			}
		}
		e.resign(l)
		e.leaderIs(first, election.Info{})
	})
}

// Leader reports nobody before a campaign and after a resignation, and
// the leader's value and term while it leads; Done closes on Resign.
func TestLeaderAndResign(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		el := e.election(e.Client(), "lr")
		e.leaderIs(el, election.Info{})
		l, err := el.Campaign(ctx, "host-a:8080")
		if err != nil {
			t.Fatal(err)
		}
		e.leaderIs(el, election.Info{Value: "host-a:8080", Term: l.Term()})
		if l.Err() != nil {
			t.Fatalf("Err() = %v while leading", l.Err())
		}
		e.resign(l)
		select {
		case <-l.Done():
		default:
			t.Fatal("Done not closed after Resign")
		}
		fltest.IsErr(t, "Err() after Resign", l.Err(), fairlock.ErrNotHeld)
		fltest.IsErr(t, "second Resign", l.Resign(ctx), fairlock.ErrNotHeld)
		e.leaderIs(el, election.Info{})
		if n, _ := e.RDB.Exists(ctx, e.Prefix+"{lr}\x1fld").Result(); n != 0 {
			t.Fatal("the leader record outlived Resign")
		}
	})
}

// A crashed leader with nobody queued: once its lease has expired by
// Redis's clock, Leader reports no leader though the record is still
// there.
func TestLeaderNotReportedAfterLeaseEnds(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		ttl := time.Second
		crashing, faults := e.FaultyClient(fairlock.WithLeaseTTL(ttl))
		l, err := e.election(crashing, "crash").Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		el := e.election(e.Client(), "crash")
		e.leaderIs(el, election.Info{Value: "a", Term: l.Term()})
		faults.Down.Store(true) // the leader's process dies
		watcher := e.Client()
		e.WaitFor("the lease to expire", func() bool {
			st, err := watcher.Status(ctx, "crash")
			return err == nil && len(st.Holders) == 0
		})
		if n, _ := e.RDB.Exists(ctx, e.Prefix+"{crash}\x1fld").Result(); n != 1 {
			t.Fatal("the record expired with the lease: this test checks nothing")
		}
		e.leaderIs(el, election.Info{})
	})
}

// A leader cut off from Redis past its lease (a paused process) learns it
// lost: Done closes, Resign reports ErrLeaseLost, and its successor's
// term is higher.
func TestPausedLeaderLearnsItLost(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		ttl := time.Second
		paused, faults := e.FaultyClient(fairlock.WithLeaseTTL(ttl))
		la, err := e.election(paused, "pause").Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		next := campaignAsync(ctx, e.election(e.Client(fairlock.WithLeaseTTL(ttl)), "pause"), "b")
		fltest.WaitWaiters(t, e.Client(), "pause", 1)
		faults.Down.Store(true)
		lb := e.receive(next) // the engine grants b when a's lease expires
		select {
		case <-la.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the paused leader's Done did not close")
		}
		faults.Down.Store(false)
		fltest.IsErr(t, "the paused leader's Err()", la.Err(), fairlock.ErrLeaseLost)
		if la.Term() >= lb.Term() {
			t.Fatalf("paused leader's term %d, successor's %d: want lower", la.Term(), lb.Term())
		}
		fltest.IsErr(t, "the paused leader's Resign", la.Resign(ctx), fairlock.ErrLeaseLost)
		e.leaderIs(e.election(e.Client(), "pause"), election.Info{Value: "b", Term: lb.Term()})
		e.resign(lb)
	})
}

// Observe delivers the current leader, then each change: a successor, a
// resignation with nobody left (the zero Info), a new leader; nothing
// twice. The channel closes when ctx ends.
func TestObserve(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		ea, eb := e.election(e.Client(), "obs"), e.election(e.Client(), "obs")
		la, err := ea.Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		octx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := e.election(e.Client(), "obs").Observe(octx)
		if got := e.next(ch); got != (election.Info{Value: "a", Term: la.Term()}) {
			t.Fatalf("first delivery %+v, want a", got)
		}
		next := campaignAsync(ctx, eb, "b")
		fltest.WaitWaiters(t, e.Client(), "obs", 1)
		e.resign(la)
		lb := e.receive(next)
		got := e.next(ch)
		if got.Term == 0 {
			// Between a's resignation and b taking office nobody led.
			got = e.next(ch)
		}
		if got != (election.Info{Value: "b", Term: lb.Term()}) {
			t.Fatalf("after a's resignation: %+v, want b", got)
		}
		e.resign(lb)
		if got := e.next(ch); got != (election.Info{}) {
			t.Fatalf("after b resigned with nobody queued: %+v, want the zero Info", got)
		}
		lc, err := ea.Campaign(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		if got := e.next(ch); got != (election.Info{Value: "c", Term: lc.Term()}) {
			t.Fatalf("after c campaigned: %+v, want c", got)
		}
		e.quiet(ch, 100*time.Millisecond) // nothing twice
		cancel()
		select {
		case _, ok := <-ch:
			if ok {
				t.Fatal("Observe delivered after its ctx ended")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Observe's channel not closed after ctx ended")
		}
		e.resign(lc)
	})
}

// opCounter counts a client's commands, and its script calls by op.
type opCounter struct {
	mu  sync.Mutex
	ops []string
}

func (c *opCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *opCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *opCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.ops = append(c.ops, cmd.Name())
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (c *opCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ops)
}

// Observe waits for pushes: an observer sends nothing to Redis while the
// leader does not change (until it reads the leader again at its lease's
// expiry, a lease TTL away).
func TestObserveDoesNotPoll(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		l, err := e.election(e.Client(), "poll").Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		rdb := b.Client(t)
		cnt := &opCounter{}
		rdb.AddHook(cnt)
		octx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := e.election(e.ClientOn(rdb), "poll").Observe(octx)
		e.next(ch)
		before := cnt.count()
		e.quiet(ch, 500*time.Millisecond)
		if n := cnt.count() - before; n != 0 {
			cnt.mu.Lock()
			t.Fatalf("the observer sent %d commands in 500ms with no change: %v", n, cnt.ops[before:])
		}
		e.resign(l)
		if got := e.next(ch); got.Term != 0 {
			t.Fatalf("after the resignation: %+v", got)
		}
	})
}

// An observer cut off from Redis while the leader changes delivers the
// latest leader once it is back: go-redis resubscribes and the observer
// reads the leader again.
func TestObserveResynchronises(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		ea, eb := e.election(e.Client(), "resync"), e.election(e.Client(), "resync")
		la, err := ea.Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		p := newProxy(t, b.Addr)
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		octx, cancel := context.WithCancel(ctx)
		defer cancel()
		ch := e.election(e.ClientOn(rdb), "resync").Observe(octx)
		if got := e.next(ch); got.Value != "a" {
			t.Fatalf("first delivery %+v, want a", got)
		}
		p.setCut(true)
		// While cut off: a resigns, b leads, b resigns, c leads.
		next := campaignAsync(ctx, eb, "b")
		fltest.WaitWaiters(t, e.Client(), "resync", 1)
		e.resign(la)
		e.resign(e.receive(next))
		lc, err := ea.Campaign(ctx, "c")
		if err != nil {
			t.Fatal(err)
		}
		e.quiet(ch, 200*time.Millisecond)
		p.setCut(false)
		if got := e.next(ch); got != (election.Info{Value: "c", Term: lc.Term()}) {
			t.Fatalf("after the reconnection: %+v, want c (term %d)", got, lc.Term())
		}
		e.resign(lc)
		if got := e.next(ch); got.Term != 0 {
			t.Fatalf("after c resigned: %+v, want the zero Info", got)
		}
	})
}

// Campaign honours its context while queued, and leaves the queue.
func TestCampaignCancelled(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		l, err := e.election(e.Client(), "cancel").Campaign(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err = e.election(e.Client(), "cancel").Campaign(cctx, "b")
		fltest.IsErr(t, "Campaign past its deadline", err, context.DeadlineExceeded)
		fltest.WaitWaiters(t, e.Client(), "cancel", 0)
		e.resign(l)
		e.leaderIs(e.election(e.Client(), "cancel"), election.Info{})
	})
}

// Bad input gets a clear error at once, and nothing is queued.
func TestBadInput(t *testing.T) {
	b := redistest.Mini(t)
	e := newEnv(t, b)
	c := e.Client()
	if _, err := election.New(nil, "x"); !errors.Is(err, fairlock.ErrInvalidArgument) {
		t.Errorf("New(nil) = %v, want ErrInvalidArgument", err)
	}
	for _, name := range []string{"", "{x}", "a}b"} {
		if _, err := election.New(c, name); !errors.Is(err, fairlock.ErrInvalidName) {
			t.Errorf("New(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	el := e.election(c, "bad")
	for _, v := range []string{"", strings.Repeat("x", election.MaxValueLen+1)} {
		if _, err := el.Campaign(context.Background(), v); !errors.Is(err, fairlock.ErrInvalidArgument) {
			t.Errorf("Campaign(value of %d bytes) = %v, want ErrInvalidArgument", len(v), err)
		}
	}
	fltest.WaitWaiters(t, c, "bad", 0)
	e.leaderIs(el, election.Info{})
	// A client that cannot subscribe is refused.
	nc, err := fairlock.New(noSubscribe{e.RDB}, fairlock.WithPrefix(e.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := election.New(nc, "x"); !errors.Is(err, election.ErrNotSubscriber) {
		t.Errorf("New(client without Subscribe) = %v, want ErrNotSubscriber", err)
	}
}

type noSubscribe struct{ fairlock.RedisClient }

// An election and a condition variable of the mutex of the same name keep
// keys of their own side by side: an election's record and a condition's
// waiters never share a key.
func TestElectionBesideCond(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := newEnv(t, b)
		ctx := context.Background()
		c := e.Client()
		mu, err := semaphore.NewMutex(c, "shared")
		if err != nil {
			t.Fatal(err)
		}
		cond := semaphore.NewCond(mu)
		lease, err := mu.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() {
			l, err := cond.Wait(ctx, lease)
			if err == nil {
				err = l.Release(ctx)
			}
			waited <- err
		}()
		fltest.WaitWaiters(t, c, "shared", 0)
		e.WaitFor("the condition's waiter", func() bool {
			n, _ := e.RDB.Exists(ctx, e.Prefix+"{shared}\x1fc\x1f").Result() // the default condition's waiters (keyspace.Keys.Derived)
			return n == 1
		})
		el := e.election(c, "shared")
		l, err := el.Campaign(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		e.leaderIs(el, election.Info{Value: "v", Term: l.Term()})
		e.resign(l)
		if n, err := cond.Signal(ctx); err != nil || n != 1 {
			t.Fatalf("Signal = %d, %v; want 1 woken", n, err)
		}
		if err := <-waited; err != nil {
			t.Fatalf("the condition's waiter: %v", err)
		}
	})
}

// The election's own errors name the call and the election, and the
// package once; the engine's come as its own.
func TestErrorsNameElectionOnce(t *testing.T) {
	b := redistest.Mini(t)
	e := newEnv(t, b)
	el := e.election(e.Client(), "e")
	ctx := context.Background()
	_, leaderErr := el.Leader(ctx)
	_, campaignErr := el.Campaign(ctx, "")
	_, newErr := election.New(e.Client(), "")
	for _, tc := range []struct {
		err  error
		is   error
		text string
	}{
		{leaderErr, election.ErrNoLeader, `election: leader "e": no leader`},
		{campaignErr, fairlock.ErrInvalidArgument, `election: campaign "e": invalid argument: value of 0 bytes`},
		{newErr, fairlock.ErrInvalidName, `election: new "": invalid name: empty`},
	} {
		var ee *election.Error
		if !errors.Is(tc.err, tc.is) || !errors.As(tc.err, &ee) || !strings.HasPrefix(fmt.Sprint(tc.err), tc.text) ||
			strings.Count(fmt.Sprint(tc.err), "election:")+strings.Count(fmt.Sprint(tc.err), "fairlock:") != 1 {
			t.Errorf("error %q, want an *election.Error matching %v that starts %q and names a package once", tc.err, tc.is, tc.text)
		}
	}
}
