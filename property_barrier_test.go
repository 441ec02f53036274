package fairlock

// The cyclic barrier in the property machine (property_test.go): one
// barrier per machine, beside its semaphores and its latch, with
// processes that arrive at it and wait (and cancel their wait). Its model
// is the current round, from 1, and its waiting parties in arrival
// order. An arrival that is the round's last completes it: its Await and
// every waiting party's return the round and their arrival index. A
// waiting party whose context ends breaks the round: its Await returns
// the context's error and every other's the round broken. Either way the
// next round begins with nobody. No Await returns before.

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
	m.logf("process %d: Await on the barrier (round %d, %d of %d parties waiting in the model)", a.id, b.round, len(b.waiters), b.parties)
	ctx, cancel := context.WithCancel(context.Background())
	w := &bwaiter{a: a, cancel: cancel, index: int64(len(b.waiters)), res: make(chan bresult, 1)}
	m.calls.Go(func() {
		arr, err := a.c.barrierAwait(ctx, b.name, b.parties, b.ttl, nil)
		w.res <- bresult{arr, err}
	})
	b.made = true
	if w.index+1 == b.parties {
		woken := append(b.waiters, w)
		round := b.round
		b.round, b.waiters = round+1, nil
		for _, x := range woken {
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
		if r := a.c.waits.rooms[b.k.res.Base]; r != nil {
			for tk, x := range r.waiters {
				if x.queued && !m.known[tk] {
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
// context.Canceled; its leaving breaks the round: every other party's
// Await returns the round broken, with its index.
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
	for _, x := range others {
		r := m.barrierReceive(t, x)
		if r.err != nil || r.arr != (arrival{round: round, index: x.index, broken: true}) {
			t.Fatalf("process %d: Await on the barrier = %+v, %v; process %d's cancel broke round %d, where it is at index %d\n%s",
				x.a.id, r.arr, r.err, a.id, round, x.index, m.barrierDump())
		}
		x.cancel()
		x.a.state, x.a.bw = idle, nil
	}
	m.seen.broken = max(m.seen.broken, len(others))
}

// barrierHeartbeat refreshes every waiting party, as its process's timer
// does.
func (m *machine) barrierHeartbeat(t *rapid.T) {
	now := m.nowMs()
	for _, a := range m.live(barriering) {
		a.c.mu.Lock()
		r := a.c.waits.rooms[m.barrier.k.res.Base]
		a.c.mu.Unlock()
		if r == nil {
			continue // (check sees that its Await returned)
		}
		if _, err := r.refresh(); err != nil {
			t.Fatalf("process %d's refresh of its barrier waiter: %v", a.id, err)
		}
	}
	for _, w := range m.barrier.waiters {
		if w.at > now {
			w.at = now + clock.MS(w.a.waiterTTL())
		}
	}
}

// barrierCheck compares the barrier in Redis with the model: no Await
// returned while the model has it waiting, the hash's round and arrivals
// the model's, and its waiting parties the model's in arrival order.
func (m *machine) barrierCheck(t *rapid.T) {
	b := m.barrier
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
	got := m.redisCond(&msem{name: b.name, k: b.k.res}, barrierCond)
	if len(got) != len(b.waiters) {
		t.Fatalf("barrier: %d waiting parties in Redis, %d in the model\n%s", len(got), len(b.waiters), m.barrierDump())
	}
	for i, g := range got {
		if w := b.waiters[i]; g.ticket != w.ticket || g.client != w.a.c.id {
			t.Fatalf("barrier: party %d is %s (ticket %s) in Redis, %s (ticket %s) in the model",
				i, m.who(g.client), g.ticket, m.who(w.a.c.id), w.ticket)
		}
	}
}

// barrierFinish cancels the first waiting party, which breaks the round
// for the others.
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
