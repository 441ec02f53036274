package fairlock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/wait"
)

// failStale judges each waiter by the refreshes that covered it. One
// refused in a script of its own fails once a waiter TTL has passed since
// it was last alive; one refused beside others (a multi-lock waiter's
// other semaphore refusing the script they shared, say) is not yet known
// to be at fault, and fails only after three TTLs, while refresh parts
// the waiters of failed scripts until the one at fault is alone. A
// refresh that timed out is Redis being busy (see failStale).
func TestFailStaleJudgesEachWaiter(t *testing.T) {
	const ttl = time.Second
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	c, err := New(rdb, WithWaiterTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	refused := errors.New("refused")
	now := time.Now()
	for _, tc := range []struct {
		name  string
		since time.Duration // since it was last alive
		alone bool
		fails bool
	}{
		{"refused alone, within its TTL", ttl / 2, true, false},
		{"refused alone, past its TTL", ttl + time.Millisecond, true, true},
		{"refused beside others, past its TTL", 2 * ttl, false, false},
		{"refused beside others, past three TTLs", 3*ttl + time.Millisecond, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &wait.Waiter{Ticket: "T", Queued: true, Alive: now.Add(-tc.since), Failed: refused, Alone: tc.alone, Ch: make(chan struct{}, 1)}
			r := &wait.Room{C: c.waits, Waiters: map[string]*wait.Waiter{"T": w}, Answered: now}
			r.FailStale(now)
			select {
			case <-w.Ch:
				wk := w.Wk
				if !tc.fails {
					t.Fatalf("failed: %v", wk.Err)
				}
				if !errors.Is(wk.Err, ErrRedis) || !errors.Is(wk.Err, refused) {
					t.Fatalf("failed with %v; want ErrRedis and the refresh's error", wk.Err)
				}
			default:
				if tc.fails {
					t.Fatal("not failed")
				}
			}
		})
	}
}

// A room's refresh round names each waiter with the lease TTL it queued
// with: one script names one TTL, so waiters of several TTLs (their own,
// Request.LeaseTTL, or the client's) go in scripts of one TTL each, the
// suspects (whose last refresh failed) as the others; every queued waiter
// is in exactly one script, and an empty room still sends one.
func TestRefreshBatchesOneLeaseTTLEach(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := &wait.Room{C: c.waits, Waiters: map[string]*wait.Waiter{}}
	c.mu.Lock()
	empty, _ := r.RefreshBatchesLocked(time.Time{})
	c.mu.Unlock()
	if len(empty) != 1 || wait.RefreshCount(empty[0]) != 0 || empty[0][2] != c.leaseMs {
		t.Fatalf("an empty room's round = %q, want one script of no tickets", empty)
	}
	leases := []string{c.leaseMs, "2000", "150"}
	want := map[string]string{} // ticket -> lease
	for i := range 300 {
		lease := leases[i%len(leases)]
		w := &wait.Waiter{Ticket: fmt.Sprintf("T%d", i), Permits: 1, Lease: lease, Queued: i%7 != 0, Ch: make(chan struct{}, 1)}
		if i%5 == 0 {
			w.Failed = errors.New("refused")
		}
		r.Waiters[w.Ticket] = w
		if w.Queued {
			want[w.Ticket] = lease
		}
	}
	c.mu.Lock()
	batches, _ := r.RefreshBatchesLocked(time.Time{})
	c.mu.Unlock()
	seen := map[string]string{}
	for _, args := range batches {
		lease := args[2]
		if n := wait.RefreshCount(args); n == 0 || n > wait.RefreshBatch {
			t.Errorf("a script of %d tickets", n)
		}
		for i := range wait.RefreshCount(args) {
			tk := wait.RefreshedTicket(args, i)
			if _, dup := seen[tk]; dup {
				t.Errorf("%s in two scripts", tk)
			}
			seen[tk] = lease
			if want[tk] != lease {
				t.Errorf("%s (queued %v, lease TTL %q) refreshed with lease TTL %q", tk, r.Waiters[tk].Queued, want[tk], lease)
			}
		}
	}
	if len(seen) != len(want) {
		t.Errorf("%d waiters refreshed, want the %d queued", len(seen), len(want))
	}
}

// A periodic round (maintain's) whose queued waiters were all known alive
// within youngFor sends no script, unless an event of the queue is due,
// which it runs, and comes back before the first of them is one refresh
// period old. A round that refreshes anybody (an old waiter, a suspect)
// names them all, and a round that is not periodic (refresh) leaves out
// nobody.
func TestPeriodicRoundLeavesYoungWaitersOut(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer rdb.Close()
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.keys("young")
	if err != nil {
		t.Fatal(err)
	}
	every, young := c.waits.RefreshEvery(), c.waits.YoungFor()
	now := time.Now()
	mk := func(ticket string, since time.Duration, failed error, queued bool) *wait.Waiter {
		return &wait.Waiter{Ticket: ticket, Permits: 1, Lease: c.leaseMs, Queued: queued, Alive: now.Add(-since), Failed: failed, Ch: make(chan struct{}, 1)}
	}
	tickets := func(batches [][]string) map[string]bool {
		got := map[string]bool{}
		for _, args := range batches {
			for i := range wait.RefreshCount(args) {
				got[wait.RefreshedTicket(args, i)] = true
			}
		}
		return got
	}
	r := &wait.Room{C: c.waits, K: k, Kick: make(chan struct{}, 1), Waiters: map[string]*wait.Waiter{}}
	for _, w := range []*wait.Waiter{
		mk("Y1", young/5, nil, true),
		mk("Y2", young*3/5, nil, true),
		mk("O", young+young/2, nil, true),
		mk("S", young/5, errors.New("refused"), true), // a suspect
		mk("Q", 0, nil, false),                        // not yet queued
	} {
		r.Waiters[w.Ticket] = w
	}
	c.mu.Lock()
	periodic, due := r.RefreshBatchesLocked(now.Add(-young))
	all, allDue := r.RefreshBatchesLocked(time.Time{})
	c.mu.Unlock()
	everyone := map[string]bool{"Y1": true, "Y2": true, "O": true, "S": true}
	if got := tickets(periodic); !maps.Equal(got, everyone) || !due.IsZero() {
		t.Errorf("a periodic round with an old waiter and a suspect refreshes %v (due %v), want %v", slices.Sorted(maps.Keys(got)), due, slices.Sorted(maps.Keys(everyone)))
	}
	if got := tickets(all); !maps.Equal(got, everyone) || !allDue.IsZero() {
		t.Errorf("a refresh refreshes %v (due %v), want %v", slices.Sorted(maps.Keys(got)), allDue, slices.Sorted(maps.Keys(everyone)))
	}
	// A suspect alone among young waiters takes them along too.
	delete(r.Waiters, "O")
	c.mu.Lock()
	periodic, due = r.RefreshBatchesLocked(now.Add(-young))
	c.mu.Unlock()
	if got, want := tickets(periodic), map[string]bool{"Y1": true, "Y2": true, "S": true}; !maps.Equal(got, want) || !due.IsZero() {
		t.Errorf("a periodic round with a suspect refreshes %v (due %v), want %v", slices.Sorted(maps.Keys(got)), due, slices.Sorted(maps.Keys(want)))
	}
	// Only young waiters: no script, due one refresh period after the
	// oldest.
	delete(r.Waiters, "S")
	c.mu.Lock()
	periodic, due = r.RefreshBatchesLocked(now.Add(-young))
	c.mu.Unlock()
	if len(periodic) != 0 {
		t.Errorf("a periodic round of young waiters builds %d scripts, want none", len(periodic))
	}
	if want := r.Waiters["Y2"].Alive.Add(every); !due.Equal(want) {
		t.Errorf("a periodic round of young waiters is next due at %v, want %v: one refresh period after the oldest", due.Sub(now), want.Sub(now))
	}

	// A round that refreshes an old waiter takes the young along: no waiter
	// is refreshed more often than every period. (Redis has none of them,
	// and reports them gone.)
	mixed := &wait.Room{C: c.waits, K: k, Kick: make(chan struct{}, 1), Waiters: map[string]*wait.Waiter{
		"O2": mk("O2", young+young/2, nil, true), "Y3": mk("Y3", young/5, nil, true)}}
	y3 := mixed.Waiters["Y3"]
	if _, err := mixed.Round(true); err != nil {
		t.Fatal(err)
	}
	select {
	case <-y3.Ch:
	default:
		t.Error("a periodic round that refreshed an old waiter left a young one out")
	}

	// Only a waiter not yet queued: one script with no ticket, which runs
	// the queue.
	unqueued := &wait.Room{C: c.waits, K: k, Kick: make(chan struct{}, 1), Waiters: map[string]*wait.Waiter{"Q": r.Waiters["Q"]}}
	c.mu.Lock()
	periodic, due = unqueued.RefreshBatchesLocked(now.Add(-young))
	c.mu.Unlock()
	if len(periodic) != 1 || wait.RefreshCount(periodic[0]) != 0 || !due.IsZero() {
		t.Errorf("a periodic round with no queued waiter builds %d scripts (due %v), want one naming nobody", len(periodic), due)
	}

	// Only young waiters: no script, and the round comes back in time.
	delete(r.Waiters, "Q")
	young1 := maps.Clone(r.Waiters)
	scripts := func() int { return m.CommandCount() }
	before := scripts()
	limit := time.Until(r.Waiters["Y2"].Alive.Add(every))
	next, err := r.Round(true)
	if err != nil {
		t.Fatal(err)
	}
	if n := scripts() - before; n != 0 {
		t.Errorf("a periodic round of young waiters sent %d commands, want none", n)
	}
	if next <= 0 || next > limit {
		t.Errorf("a periodic round of young waiters is next in %v, want within (0, %v]", next, limit)
	}
	// An event of the queue due: the round runs the queue, and names every
	// waiter (here Redis has none of them, and reports them gone).
	r.Event = time.Now().Add(-time.Millisecond)
	before = scripts()
	if _, err := r.Round(true); err != nil {
		t.Fatal(err)
	}
	if scripts() == before {
		t.Error("a periodic round with an event due sent no script")
	}
	for _, tk := range []string{"Y1", "Y2"} {
		select {
		case <-young1[tk].Ch:
			wk := young1[tk].Wk
			if !wk.Requeue {
				t.Errorf("%s: %+v, want it reported gone", tk, wk)
			}
		default:
			t.Errorf("%s: a round at an event left it out", tk)
		}
	}
	c.mu.Lock()
	event := r.Event
	c.mu.Unlock()
	if !event.IsZero() {
		t.Errorf("the event is still noted, %v from now, after a round ran the queue past it (the queue is empty)", time.Until(event))
	}
	// An event not yet due: no script, and the round comes back for it.
	r.Waiters = map[string]*wait.Waiter{"Y1": mk("Y1", 0, nil, true)}
	for _, ahead := range []time.Duration{time.Hour, 20 * time.Millisecond} {
		r.Event = time.Now().Add(ahead)
		before = scripts()
		next, err := r.Round(true)
		if err != nil {
			t.Fatal(err)
		}
		if n := scripts() - before; n != 0 {
			t.Errorf("a periodic round of a young waiter with an event %v away sent %d commands", ahead, n)
		}
		if want := min(every, ahead); next > want || next < 0 {
			t.Errorf("with an event %v away, a periodic round of a young waiter is next in %v, want within [0, %v]", ahead, next, want)
		}
	}
}

// A periodic round that waits for the client's lock longer than youngFor
// still schedules the next in time: not in the past, which maintain would
// take for none.
func TestPeriodicRoundAfterAStall(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	c, err := New(rdb, WithWaiterTTL(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.keys("stall")
	if err != nil {
		t.Fatal(err)
	}
	w := &wait.Waiter{Ticket: "Y", Permits: 1, Lease: c.leaseMs, Queued: true, Alive: time.Now(), Ch: make(chan struct{}, 1)}
	r := &wait.Room{C: c.waits, K: k, Kick: make(chan struct{}, 1), Waiters: map[string]*wait.Waiter{"Y": w}}
	c.mu.Lock()
	go func() {
		time.Sleep(3 * c.waits.YoungFor())
		c.mu.Unlock()
	}()
	next, err := r.Round(true)
	if err != nil {
		t.Fatal(err)
	}
	if next < 0 {
		t.Errorf("after a stall the round is next in %v", next)
	}
}

// The queue's next event that a waiter's script reports: on a held mutex,
// the lease's expiry alone (a dead waiter's process cannot move that
// queue: the lease's release passes it by); on a semaphore of more
// permits, full or with a permit free that the head waiter cannot take,
// the waiters' liveness deadline too (a release may leave a dead head
// holding the others back until it passes); and wherever condition
// waiters wait (a barrier's parties), their liveness deadline (a dead
// party breaks the round).
func TestQueuedEventsAreThoseThatMoveTheQueue(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	holder, err := New(rdb) // leases of 10s
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	const wttl = 600 * time.Millisecond
	acquire := func(capacity, held, permits int64) func(*testing.T, *Client, context.Context) {
		return func(t *testing.T, c *Client, ctx context.Context) {
			name := fmt.Sprintf("events-%d-%d-%d", capacity, held, permits)
			held, err := holder.Acquire(ctx, Request{Name: name, Capacity: capacity, Permits: held})
			if err != nil {
				t.Error(err)
				return
			}
			defer held.Release(context.Background())
			if l, err := c.Acquire(ctx, Request{Name: name, Capacity: capacity, Permits: permits}); err == nil {
				l.Release(context.Background())
			}
		}
	}
	for _, tc := range []struct {
		name  string
		wait  func(*testing.T, *Client, context.Context)
		event func(in time.Duration) bool
		says  string
	}{
		{"a held mutex", acquire(1, 1, 1), func(in time.Duration) bool { return in > 5*time.Second }, "the held lease's expiry (10s)"},
		{"a full semaphore of two permits", acquire(2, 2, 1), func(in time.Duration) bool { return in <= wttl }, "the waiters' liveness deadline (600ms)"},
		{"a permit free the head cannot take", acquire(2, 1, 2), func(in time.Duration) bool { return in <= wttl }, "the waiters' liveness deadline (600ms)"},
		{"a barrier's party", func(t *testing.T, c *Client, ctx context.Context) {
			_, _ = c.barrierAwait(ctx, "events-barrier", 2, time.Minute, nil)
		}, func(in time.Duration) bool { return in <= wttl }, "the waiters' liveness deadline (600ms)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(rdb, WithWaiterTTL(wttl))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			wctx, stop := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				defer close(done)
				tc.wait(t, c, wctx)
			}()
			defer func() { stop(); <-done }()
			var event time.Time
			for deadline := time.Now().Add(10 * time.Second); event.IsZero() && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				c.mu.Lock()
				for _, r := range c.waits.Rooms {
					for _, w := range r.Waiters {
						if w.Queued {
							event = r.Event
						}
					}
				}
				c.mu.Unlock()
			}
			if event.IsZero() {
				t.Fatal("the waiter's room noted no event")
			}
			if in := time.Until(event); !tc.event(in) {
				t.Errorf("the waiter's script put the next event in %v; want %s", in, tc.says)
			}
		})
	}
}

// A refresh script that Redis refused for one waiter's sake (another
// program's key at its multi-lock's other semaphore) is parted within the
// round that met the refusal: the waiters beside it are answered again in
// that round, whatever the pace of the rounds, and the one at fault is
// left alone in a refused script of its own. Parted over the rounds that
// follow, a busy Redis's rounds (each up to a waiter TTL) let those beside
// it run past their three TTLs and fail with it. A refusal that every
// part meets stops the parting; a refusal of the semaphore itself (its
// own key, Redis loading) parts nothing.
func TestRefusedRefreshPartedWithinTheRound(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	hook := &refuseTicket{}
	rdb.AddHook(hook)
	c, err := New(rdb, WithWaiterTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.keys("parted")
	if err != nil {
		t.Fatal(err)
	}
	// The script's forms learnt first, the scripts count one command each.
	empty := &wait.Room{C: c.waits, K: k, Kick: make(chan struct{}, 1), Waiters: map[string]*wait.Waiter{}}
	if _, err := empty.Round(false); err != nil {
		t.Fatal(err)
	}
	other := fault.ForeignErrPrefix + "string hash " + c.cfg.prefix + "{other}:s"
	const n = wait.RefreshBatch // one script
	for _, tc := range []struct {
		name, bad, reply string // bad "": every script refused
		scripts          int64
	}{
		// The script; its 8 parts of 16, 8 of 2, 2 of 1.
		{"one waiter's other semaphore", "w37", other, 1 + 8 + 8 + 2},
		// The script; its 8 parts, all refused alike.
		{"every waiter's other semaphore", "", other, 1 + 8},
		{"the semaphore's own key", "", fault.ForeignErrPrefix + "string hash " + k.All[0], 1},
		{"its derived key", "", fault.ForeignErrPrefix + "string list " + k.Base + keyspace.Sep + "w" + keyspace.Sep + "x", 1},
		{"its base (a latch's hash)", "", fault.ForeignErrPrefix + "string hash " + k.Base, 1},
		{"Redis loading", "", "LOADING Redis is loading the dataset in memory", 1},
	} {
		hook.bad, hook.all, hook.reply = tc.bad, tc.bad == "", tc.reply
		hook.sent.Store(0)
		r := &wait.Room{C: c.waits, K: k, Kick: make(chan struct{}, 1), Waiters: map[string]*wait.Waiter{}}
		ws := map[string]*wait.Waiter{}
		for i := range n {
			tk := fmt.Sprintf("w%d", i)
			ws[tk] = &wait.Waiter{Ticket: tk, Permits: 1, Lease: c.leaseMs, Queued: true, Alive: time.Now(), Ch: make(chan struct{}, 1)}
			r.Waiters[tk] = ws[tk]
		}
		if _, err := r.Round(false); err == nil {
			t.Fatalf("%s: a round with a refused script returned no error", tc.name)
		}
		c.mu.Lock()
		for tk, w := range ws {
			switch {
			case tc.bad == "" && (w.Failed == nil || w.Alone):
				t.Errorf("%s, every script refused: %s failed=%v alone=%v, want failed beside others", tc.name, tk, w.Failed, w.Alone)
			case tc.bad != "" && tk == tc.bad && (w.Failed == nil || !w.Alone):
				t.Errorf("%s: %s, the waiter at fault: failed=%v alone=%v, want refused in a script of its own", tc.name, tk, w.Failed, w.Alone)
			case tc.bad != "" && tk != tc.bad && w.Failed != nil:
				t.Errorf("%s: %s, beside the waiter at fault: still failed (%v) after the round", tc.name, tk, w.Failed)
			}
		}
		c.mu.Unlock()
		if got := hook.sent.Load(); got != tc.scripts {
			t.Errorf("%s: the round sent %d refresh scripts, want %d", tc.name, got, tc.scripts)
		}
	}
	// Past its limit, a round parts nothing more.
	r := &wait.Room{C: c.waits, K: k, Kick: make(chan struct{}, 1), Waiters: map[string]*wait.Waiter{}}
	args := c.waits.RefreshArgs(2, c.leaseMs)
	args = wait.AppendRefreshed(wait.AppendRefreshed(args, "x1", 1, ""), "x2", 1, "")
	sent := 0
	r.Narrow(args, &backend.ReplyError{Reply: other}, func([]string) error { sent++; return nil }, time.Now())
	if sent != 0 {
		t.Errorf("a parting past its limit sent %d scripts", sent)
	}
}

// refuseTicket refuses, with the error reply reply, each refresh script
// naming its bad ticket (or every one, with all).
type refuseTicket struct {
	bad, reply string
	all        bool
	sent       atomic.Int64
}

func (h *refuseTicket) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *refuseTicket) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *refuseTicket) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if slices.Contains(args, any(script.OpRefresh.Name)) {
			h.sent.Add(1)
			if h.all || slices.Contains(args, any(h.bad)) {
				err := replyError(h.reply)
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}
