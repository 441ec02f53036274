package fairlock

// The countdown latch in the property machine (property_test.go): one
// latch per machine, beside its semaphores, with processes that wait on it
// (and cancel, or crash while they wait), count it down and read its
// count. Its model is a count that starts at init, falls by one per
// CountDown and never below 0, and forgets itself (back to init) once
// its key's TTL after the last CountDown or waiting Wait has passed; and
// the waiters, in arrival order, each alive until its deadline unless its
// process refreshes it. The CountDown that reaches 0 wakes every live
// waiter, once; none returns before.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// pLatchTTL is the latch count's TTL on miniredis: short enough for the
// machine's clock to reach it, and off the grid of the clock's moves
// (multiples of 200 ms), so that no step lands on its expiry.
const pLatchTTL = 30*time.Second + 7*time.Millisecond

// mlatch is the model of the machine's latch.
type mlatch struct {
	name    string
	init    int64
	count   int64
	made    bool  // the count exists in Redis
	expires int64 // when it stops existing (ms, Redis's clock)
	ttl     time.Duration
	k       latchKeys
	waiters []*lwaiter // in arrival order
}

// lwaiter is a process's Wait on the latch in the model.
type lwaiter struct {
	a      *actor
	ticket string
	at     int64 // liveness deadline (ms)
	dead   bool  // its process crashed
	cancel context.CancelFunc
	res    chan error
}

// newLatch draws the machine's latch.
func (m *machine) newLatch(t *rapid.T) {
	init := rapid.SampledFrom([]int64{1, 2, 2, 3}).Draw(t, "latch count")
	ttl := time.Hour
	if m.frozen {
		ttl = pLatchTTL
	}
	k, _ := m.obs.keys("l")
	m.latch = &mlatch{name: "l", init: init, count: init, ttl: ttl, k: latchKeysOf(k)}
}

// latchAction is one action on the latch other than a CountDown (an
// action of its own): a Wait (twice as likely), a Wait's cancel, or a
// Count.
func (m *machine) latchAction(t *rapid.T) {
	switch rapid.SampledFrom([]string{"wait", "wait", "cancel", "count"}).Draw(t, "latch op") {
	case "wait":
		m.latchWait(t)
	case "cancel":
		m.latchCancel(t)
	case "count":
		m.latchCount(t)
	}
}

// latchRun applies the model's time: a count whose TTL has passed is
// gone (the next call makes it at init), and so is a dead waiter whose
// deadline has.
func (m *machine) latchRun() {
	l, now := m.latch, m.nowMs()
	if m.frozen && l.made && l.expires <= now {
		l.made, l.count = false, l.init
		m.seen.remade = true
	}
	l.waiters = slices.DeleteFunc(l.waiters, func(w *lwaiter) bool { return w.at <= now })
}

// latchTouch records a script that kept the count alive its TTL.
func (m *machine) latchTouch() {
	m.latch.made = true
	m.latch.expires = m.nowMs() + clock.MS(m.latch.ttl)
}

// latchWait starts an idle process's Wait: on an open latch it returns
// nil at once; otherwise it waits, registered in Redis.
func (m *machine) latchWait(t *rapid.T) {
	as := m.solo(idle)
	if len(as) == 0 {
		t.Skip("no idle process")
	}
	a := pick(t, as)
	l := m.latch
	m.latchRun()
	m.logf("process %d: Wait on the latch (count %d in the model)", a.id, l.count)
	ctx, cancel := context.WithCancel(context.Background())
	w := &lwaiter{a: a, cancel: cancel, res: make(chan error, 1)}
	m.calls.Go(func() {
		stored, err := a.c.latchWait(ctx, l.name, l.init, l.ttl, nil)
		if err == nil && stored != 0 {
			err = fmt.Errorf("stored with count %d", stored)
		}
		w.res <- err
	})
	if l.count == 0 {
		if err := m.latchReceive(t, w); err != nil {
			t.Fatalf("process %d: Wait on an open latch = %v, want nil", a.id, err)
		}
		return
	}
	a.state, a.lw = latching, w
	w.at = m.nowMs() + clock.MS(a.waiterTTL())
	l.waiters = append(l.waiters, w)
	m.latchTouch()
	m.waitFor(t, fmt.Sprintf("process %d waits on the latch", a.id), func() bool {
		a.c.mu.Lock()
		defer a.c.mu.Unlock()
		if r := a.c.waits.Rooms[l.k.res.Base]; r != nil {
			for tk, x := range r.Waiters {
				if x.Queued && !m.known[tk] {
					w.ticket = tk
					m.known[tk] = true
					return true
				}
			}
		}
		select {
		case err := <-w.res:
			w.res <- err // let check see it
			return true
		default:
		}
		return false
	})
	m.settle(t)
}

// latchReceive waits for w's Wait to return.
func (m *machine) latchReceive(t *rapid.T, w *lwaiter) error {
	select {
	case err := <-w.res:
		return err
	case <-time.After(m.wait):
		t.Fatalf("process %d's Wait on the latch did not return within %v\n%s", w.a.id, m.wait, m.latchDump())
		return nil
	}
}

// latchDown counts the latch down from the observer or a live process:
// in the model, the count falls by one, never below 0, and the call that
// reaches 0 wakes every live waiter (each Wait returns nil) and drops the
// dead ones.
func (m *machine) latchDown(t *rapid.T) {
	cs := []*Client{m.obs}
	for _, a := range m.solo(idle, waiting, holding, latching) {
		cs = append(cs, a.c)
	}
	c := cs[rapid.IntRange(0, len(cs)-1).Draw(t, "count down by")]
	resent := rapid.Bool().Draw(t, "sent twice")
	l := m.latch
	m.latchRun()
	m.logf("%s: CountDown on the latch (count %d in the model; sent twice %v)", m.who(c.id), l.count, resent)
	l.count = max(l.count-1, 0)
	m.latchTouch()
	var woken []*lwaiter
	if l.count == 0 {
		woken, l.waiters = l.waiters, nil
	}
	var n, stored int64
	var err error
	if resent {
		n, err = m.latchDownTwice(c)
	} else {
		n, stored, err = c.latchDown(context.Background(), l.name, l.init, l.ttl)
	}
	if err != nil || stored != 0 || n != l.count {
		t.Fatalf("CountDown = %d (stored %d), %v; the model's count is %d\n%s", n, stored, err, l.count, m.latchDump())
	}
	m.seen.woken = max(m.seen.woken, len(woken))
	for _, w := range woken {
		if w.dead {
			continue
		}
		if err := m.latchReceive(t, w); err != nil {
			t.Fatalf("process %d: Wait on the latch = %v; the CountDown that reached 0 wakes it", w.a.id, err)
		}
		w.a.state, w.a.lw = idle, nil
	}
	m.settle(t)
}

// latchDownTwice runs one CountDown's script twice under one id, as
// go-redis sends it again when a connection drops after Redis ran it: the
// second run must find the first's reply and count nothing more. It
// returns the count of the second reply, the same as the first's.
func (m *machine) latchDownTwice(c *Client) (int64, error) {
	l, ctx, id := m.latch, context.Background(), keyspace.NewTicket()
	var got [2][3]int64
	for i := range got {
		o, ok := c.calls.Op(ctx, l.k.call(opLatchDown, l.init, ops.MsArg(l.ttl), id), nil)
		if !ok {
			return 0, o.Res.Err
		}
		r, err := latchReply(o.Res)
		if err != nil {
			return 0, err
		}
		if r[1] != 0 {
			return 0, fmt.Errorf("reply %v: waiters left to wake (the machine has at most a few)", r)
		}
		got[i] = r
	}
	if got[0] != got[1] {
		return 0, fmt.Errorf("sent once: %v, sent twice, the second reply: %v", got[0], got[1])
	}
	return got[1][0], nil
}

// latchCancel cancels a process's Wait, which must return
// context.Canceled, its waiter gone from Redis once its clean-up ran.
func (m *machine) latchCancel(t *rapid.T) {
	as := m.solo(latching)
	if len(as) == 0 {
		t.Skip("no latch waiter")
	}
	a := pick(t, as)
	m.logf("process %d: cancels its Wait on the latch", a.id)
	m.latchCancelOne(t, a)
	m.settle(t)
}

func (m *machine) latchCancelOne(t *rapid.T, a *actor) {
	w := a.lw
	w.cancel()
	if err := m.latchReceive(t, w); !errors.Is(err, context.Canceled) {
		t.Fatalf("process %d: cancelled Wait on the latch = %v; want context.Canceled", a.id, err)
	}
	awaitCleanUp(t, a.c)
	m.latch.waiters = slices.DeleteFunc(m.latch.waiters, func(x *lwaiter) bool { return x == w })
	a.state, a.lw = idle, nil
}

// latchCount reads the count through the observer: the model's (init
// when the latch does not exist).
func (m *machine) latchCount(t *rapid.T) {
	l := m.latch
	m.latchRun()
	n, stored, err := m.obs.latchCount(context.Background(), l.name, l.init)
	if err != nil || stored != 0 || n != l.count {
		t.Fatalf("Count = %d (stored %d), %v; the model's count is %d\n%s", n, stored, err, l.count, m.latchDump())
	}
}

// latchCrash marks a crashed process's latch waiter dead: it stays in
// Redis, unrefreshed, until its deadline.
func (m *machine) latchCrash(a *actor) {
	if a.lw != nil {
		a.lw.dead = true
		a.lw = nil
	}
}

// latchHeartbeat refreshes every live latch waiter, as its process's
// timer does.
func (m *machine) latchHeartbeat(t *rapid.T) {
	now := m.nowMs()
	for _, a := range m.live(latching) {
		a.c.mu.Lock()
		r := a.c.waits.Rooms[m.latch.k.res.Base]
		a.c.mu.Unlock()
		if r == nil {
			continue // (check sees that its Wait returned)
		}
		if _, err := r.Refresh(); err != nil {
			t.Fatalf("process %d's refresh of its latch waiter: %v", a.id, err)
		}
	}
	for _, w := range m.latch.waiters {
		if !w.dead && w.at > now {
			w.at = now + clock.MS(w.a.waiterTTL())
		}
	}
}

// latchCheck compares the latch in Redis with the model: no Wait returned
// while the model has it waiting, the count never below 0 and the
// model's (absent when the model's is not made), and its live waiters the
// model's in arrival order.
func (m *machine) latchCheck(t *rapid.T) {
	l := m.latch
	m.latchRun()
	for _, a := range m.live(latching) {
		select {
		case err := <-a.lw.res:
			t.Fatalf("process %d's Wait on the latch returned (%v) while the model's count is %d", a.id, err, l.count)
		default:
		}
	}
	ctx := context.Background()
	raw, err := m.rdb.HGet(ctx, l.k.count, "count").Result()
	switch {
	case errors.Is(err, redis.Nil):
		if l.made {
			t.Fatalf("latch: no count in Redis; the model's is %d\n%s", l.count, m.latchDump())
		}
	case err != nil:
		t.Fatalf("latch: HGET: %v", err)
	default:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 0 {
			t.Fatalf("latch: count %q in Redis, below 0 or not a number\n%s", raw, m.latchDump())
		}
		if !l.made || n != l.count {
			t.Fatalf("latch: count %d in Redis; the model's is %d (made %v)\n%s", n, l.count, l.made, m.latchDump())
		}
	}
	got := m.redisCond(&msem{name: l.name, k: l.k.res}, latchCond)
	if len(got) != len(l.waiters) {
		t.Fatalf("latch: %d live waiters in Redis, %d in the model\n%s", len(got), len(l.waiters), m.latchDump())
	}
	for i, g := range got {
		if w := l.waiters[i]; g.ticket != w.ticket || g.client != w.a.c.id {
			t.Fatalf("latch: waiter %d is %s (ticket %s) in Redis, %s (ticket %s) in the model",
				i, m.who(g.client), g.ticket, m.who(w.a.c.id), w.ticket)
		}
	}
}

// latchFinish cancels every live latch waiter.
func (m *machine) latchFinish() {
	for _, a := range m.live(latching) {
		a.lw.cancel()
		<-a.lw.res
		a.state, a.lw = idle, nil
	}
}

// latchDump renders the latch's Redis state for failure messages.
func (m *machine) latchDump() string {
	ctx := context.Background()
	l := m.latch
	count, _ := m.rdb.HGetAll(ctx, l.k.count).Result()
	cond, _ := m.rdb.ZRangeWithScores(ctx, condKeys(l.k.res, latchCond)[0], 0, -1).Result()
	return fmt.Sprintf("latch: now=%d count=%v waiters=%v resource: %s", m.nowMs(), count, cond, m.dump(&msem{k: l.k.res}))
}
