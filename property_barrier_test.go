package fairlock

// The cyclic barrier in the property machine (property_test.go): one
// barrier per machine, beside its semaphores and its latch, with processes
// that arrive at it and wait (and cancel their wait, or crash while they
// wait). Its model is the current round, from 1, and its waiting parties in
// arrival order, each alive until its deadline unless its process
// refreshes it. An arrival that is the round's last completes it: its
// Await and every live waiting party's return the round and their arrival
// index. A waiting party whose context ends breaks the round: its Await
// returns the context's error and every other's the round broken. Either
// way the next round begins with nobody. No Await returns before.
//
// A crashed process's party stays in Redis, unrefreshed, and counts as
// arrived until its deadline: an arrival before then may complete the
// round with it. Past its deadline the round has lost a party, and breaks
// when a script notices. Nothing watches the round by itself: a live
// party's refresh notices (its process refreshes it while Redis's clock
// moves, and its re-ask breaks the round), so a round with a live party
// breaks as soon as the clock passes the deadline, for every live party
// of it. A round with no live party left stays as it was (its status read
// says it lost a party) until the next arrival, which breaks it and
// begins the next round, as its first party.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/internal/clock"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// mbarrier is the model of the machine's barrier.
type mbarrier struct {
	name    string
	parties int64
	ttl     time.Duration
	round   int64
	made    bool // the hash exists in Redis
	k       barrierKeys
	waiters []*bwaiter // the round's parties, in arrival order
}

// bwaiter is a process's Await on the barrier in the model.
type bwaiter struct {
	a      *actor
	ticket string
	index  int64
	at     int64 // liveness deadline (ms)
	dead   bool  // its process crashed
	cancel context.CancelFunc
	res    chan bresult
}

type bresult struct {
	arr arrival
	err error
}

// newBarrier draws the machine's barrier.
func (m *machine) newBarrier(t *rapid.T) {
	parties := rapid.SampledFrom([]int64{1, 2, 3, 3, 4}).Draw(t, "barrier parties")
	k, _ := m.obs.keys("b")
	m.barrier = &mbarrier{name: "b", parties: parties, ttl: time.Hour, round: 1, k: barrierKeysOf(k)}
}

// barrierAction is one action on the barrier: an Await (twice as
// likely) or a waiting party's cancel.
func (m *machine) barrierAction(t *rapid.T) {
	switch rapid.SampledFrom([]string{"await", "await", "cancel"}).Draw(t, "barrier op") {
	case "await":
		m.barrierAwait(t)
	case "cancel":
		m.barrierCancel(t)
	}
}

// barrierAwait makes an idle process arrive: the round's last party
// completes it (every party's Await returns the round and its index);
// any other waits, registered in Redis.
func (m *machine) barrierAwait(t *rapid.T) {
	as := m.solo(idle)
	if len(as) == 0 {
		t.Skip("no idle process")
	}
	a := pick(t, as)
	b := m.barrier
	m.logf("process %d: Await on the barrier (round %d, %d of %d parties waiting in the model, %d of them dead)",
		a.id, b.round, len(b.waiters), b.parties, b.deadCount())
	// A round that lost a party and is still running has no live party
	// left (a live one's refresh would have broken it): the arrival breaks
	// it, and begins the next.
	lost := m.barrierLost()
	lostRound, lostParties := b.round, b.waiters
	if lost {
		m.logf("(round %d lost a dead party: the arrival breaks it and begins round %d)", b.round, b.round+1)
		b.round, b.waiters = b.round+1, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &bwaiter{a: a, cancel: cancel, index: int64(len(b.waiters)), res: make(chan bresult, 1)}
	m.calls.Go(func() {
		arr, err := a.c.barrierAwait(ctx, b.name, b.parties, b.ttl, nil)
		w.res <- bresult{arr, err}
	})
	b.made = true
	if lost {
		m.barrierBroken(t, lostRound, lostParties, "the arrival")
		m.seen.lost = true
	}
	if w.index+1 == b.parties {
		woken := append(b.waiters, w)
		round := b.round
		b.round, b.waiters = round+1, nil
		for _, x := range woken {
			if x.dead {
				continue // (a dead process hears nothing)
			}
			r := m.barrierReceive(t, x)
			if r.err != nil || r.arr != (arrival{round: round, index: x.index}) {
				t.Fatalf("process %d: Await on the barrier = %+v, %v; the model completes round %d with it at index %d\n%s",
					x.a.id, r.arr, r.err, round, x.index, m.barrierDump())
			}
			x.cancel()
			if x != w {
				x.a.state, x.a.bw = idle, nil
			}
		}
		m.seen.completed = max(m.seen.completed, len(woken))
		m.settle(t)
		return
	}
	a.state, a.bw = barriering, w
	w.at = m.nowMs() + clock.MS(a.waiterTTL())
	b.waiters = append(b.waiters, w)
	m.waitFor(t, fmt.Sprintf("process %d waits at the barrier", a.id), func() bool {
		a.c.mu.Lock()
		defer a.c.mu.Unlock()
		if r := a.c.waits.Rooms[b.k.res.Base]; r != nil {
			for tk, x := range r.Waiters {
				if x.Queued && !m.known[tk] {
					w.ticket = tk
					m.known[tk] = true
					return true
				}
			}
		}
		select {
		case r := <-w.res:
			w.res <- r // let check see it
			return true
		default:
		}
		return false
	})
	m.settle(t)
}

// barrierReceive waits for w's Await to return.
func (m *machine) barrierReceive(t *rapid.T, w *bwaiter) bresult {
	select {
	case r := <-w.res:
		return r
	case <-time.After(m.wait):
		t.Fatalf("process %d's Await on the barrier did not return within %v\n%s", w.a.id, m.wait, m.barrierDump())
		return bresult{}
	}
}

// barrierCancel cancels a waiting party's Await, which must return
// context.Canceled; its leaving breaks the round: every other live
// party's Await returns the round broken, with its index.
func (m *machine) barrierCancel(t *rapid.T) {
	as := m.solo(barriering)
	if len(as) == 0 {
		t.Skip("no party waits at the barrier")
	}
	a := pick(t, as)
	m.logf("process %d: cancels its Await on the barrier", a.id)
	m.barrierCancelOne(t, a)
	m.settle(t)
}

func (m *machine) barrierCancelOne(t *rapid.T, a *actor) {
	b, w := m.barrier, a.bw
	w.cancel()
	if r := m.barrierReceive(t, w); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("process %d: cancelled Await on the barrier = %+v, %v; want context.Canceled", a.id, r.arr, r.err)
	}
	awaitCleanUp(t, a.c)
	a.state, a.bw = idle, nil
	others := slices.DeleteFunc(b.waiters, func(x *bwaiter) bool { return x == w })
	round := b.round
	b.round, b.waiters = round+1, nil
	n := m.barrierBroken(t, round, others, fmt.Sprintf("process %d's cancel", a.id))
	m.seen.broken = max(m.seen.broken, n)
}

// barrierBroken checks that round ended broken for its parties ws (by
// says what broke it): each live one's Await returns the round broken,
// with its index. It returns how many did.
func (m *machine) barrierBroken(t *rapid.T, round int64, ws []*bwaiter, by string) int {
	n := 0
	for _, x := range ws {
		if x.dead {
			continue // (a dead process hears nothing)
		}
		r := m.barrierReceive(t, x)
		if r.err != nil || r.arr != (arrival{round: round, index: x.index, broken: true}) {
			t.Fatalf("process %d: Await on the barrier = %+v, %v; %s broke round %d, where it is at index %d\n%s",
				x.a.id, r.arr, r.err, by, round, x.index, m.barrierDump())
		}
		x.cancel()
		x.a.state, x.a.bw = idle, nil
		n++
	}
	return n
}

// barrierLost reports whether the round has lost a party: one whose
// process crashed, past its deadline.
func (m *machine) barrierLost() bool {
	now := m.nowMs()
	return slices.ContainsFunc(m.barrier.waiters, func(w *bwaiter) bool { return w.dead && w.at <= now })
}

// deadCount returns how many of the round's parties belong to crashed
// processes.
func (b *mbarrier) deadCount() int {
	n := 0
	for _, w := range b.waiters {
		if w.dead {
			n++
		}
	}
	return n
}

// barrierCrash marks a crashed process's party dead: it stays in Redis,
// unrefreshed, and counts as arrived until its deadline.
func (m *machine) barrierCrash(a *actor) {
	if a.bw != nil {
		a.bw.dead = true
		a.bw = nil
	}
}

// barrierHeartbeat refreshes every live waiting party, as its process's
// timer does. A refresh that finds the round short of a party (one dead
// past its deadline) reports its party gone, whose re-ask breaks the
// round: once the clock has passed a dead party's deadline, every live
// party's Await returns the round broken.
func (m *machine) barrierHeartbeat(t *rapid.T) {
	now := m.nowMs()
	b := m.barrier
	lost := m.barrierLost() && len(m.live(barriering)) > 0
	if lost {
		m.logf("(round %d lost a dead party: its live parties' refresh breaks it)", b.round)
	}
	for _, a := range m.live(barriering) {
		a.c.mu.Lock()
		r := a.c.waits.Rooms[m.barrier.k.res.Base]
		a.c.mu.Unlock()
		if r == nil {
			continue // (check sees that its Await returned)
		}
		if _, err := r.Refresh(); err != nil {
			t.Fatalf("process %d's refresh of its barrier waiter: %v", a.id, err)
		}
	}
	if lost {
		round, ws := b.round, b.waiters
		b.round, b.waiters = round+1, nil
		n := m.barrierBroken(t, round, ws, "a dead party's deadline")
		m.seen.died = max(m.seen.died, n)
		return
	}
	for _, w := range b.waiters {
		if !w.dead && w.at > now {
			w.at = now + clock.MS(w.a.waiterTTL())
		}
	}
}

// barrierCheck compares the barrier in Redis with the model: no Await
// returned while the model has it waiting, the hash's round and arrivals
// the model's (a dead party counts until its round ends), its live waiting
// parties the model's in arrival order, and its status: the model's
// round, broken when the round lost a party, and its parties in arrival
// order.
func (m *machine) barrierCheck(t *rapid.T) {
	b := m.barrier
	now := m.nowMs()
	for _, a := range m.live(barriering) {
		select {
		case r := <-a.bw.res:
			t.Fatalf("process %d's Await on the barrier returned (%+v, %v) while the model has it wait in round %d\n%s",
				a.id, r.arr, r.err, b.round, m.barrierDump())
		default:
		}
	}
	st, err := m.rdb.HMGet(context.Background(), b.k.state, "parties", "round", "n").Result()
	if err != nil {
		t.Fatalf("barrier: HMGET: %v", err)
	}
	if !b.made {
		if st[0] != nil {
			t.Fatalf("barrier: hash %v in Redis before any arrival", st)
		}
		return
	}
	num := func(v any) int64 {
		s, _ := v.(string)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("barrier: hash %v in Redis: not numbers\n%s", st, m.barrierDump())
		}
		return n
	}
	if p, r, n := num(st[0]), num(st[1]), num(st[2]); p != b.parties || r != b.round || n != int64(len(b.waiters)) {
		t.Fatalf("barrier: parties %d, round %d, %d arrived in Redis; the model's %d, %d, %d\n%s",
			p, r, n, b.parties, b.round, len(b.waiters), m.barrierDump())
	}
	// redisCond leaves out the parties whose deadline Redis's clock has
	// reached: the dead ones past it.
	live := slices.DeleteFunc(slices.Clone(b.waiters), func(w *bwaiter) bool { return w.dead && w.at <= now })
	got := m.redisCond(&msem{name: b.name, k: b.k.res}, barrierCond)
	if len(got) != len(live) {
		t.Fatalf("barrier: %d live waiting parties in Redis, %d in the model\n%s", len(got), len(live), m.barrierDump())
	}
	for i, g := range got {
		if w := live[i]; g.ticket != w.ticket || g.client != w.a.c.id {
			t.Fatalf("barrier: party %d is %s (ticket %s) in Redis, %s (ticket %s) in the model",
				i, m.who(g.client), g.ticket, m.who(w.a.c.id), w.ticket)
		}
	}
	// A status read notices a dead party past its deadline, and breaks
	// nothing (the next check reads the hash after it).
	round, arrived, broken, stored, err := m.obs.barrierStatus(context.Background(), b.name, b.parties)
	if err != nil || stored != 0 || round != b.round || broken != m.barrierLost() {
		t.Fatalf("barrier status = round %d, broken %v (stored %d), %v; the model's round %d, broken %v\n%s",
			round, broken, stored, err, b.round, m.barrierLost(), m.barrierDump())
	}
	// It lists every party, dead ones too, until the round ends; once
	// every one is dead past its deadline, the keys that list them (kept
	// a while past the last deadline) may have expired, and it lists none.
	var want []string
	for _, w := range b.waiters {
		want = append(want, owner(w.a.c.id))
	}
	if !slices.Equal(arrived, want) && (len(arrived) > 0 || len(live) > 0) {
		t.Fatalf("barrier status lists %v; the model's parties are %v\n%s", arrived, want, m.barrierDump())
	}
}

// barrierFinish cancels the first live waiting party, which breaks the
// round for the others.
func (m *machine) barrierFinish() {
	if as := m.live(barriering); len(as) > 0 {
		m.barrierCancelOne(m.t, as[0])
	}
}

// barrierDump renders the barrier's Redis state for failure messages.
func (m *machine) barrierDump() string {
	ctx := context.Background()
	b := m.barrier
	st, err := m.rdb.HGetAll(ctx, b.k.state).Result()
	if errors.Is(err, redis.Nil) {
		st = nil
	}
	cond, _ := m.rdb.ZRangeWithScores(ctx, condKeys(b.k.res, barrierCond)[0], 0, -1).Result()
	return fmt.Sprintf("barrier: now=%d hash=%v waiters=%v resource: %s", m.nowMs(), st, cond, m.dump(&msem{k: b.k.res}))
}
