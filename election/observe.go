package election

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/engine"
)

// expiryMargin is how long after a leader's lease ends, as Redis said
// when it was read, an observer reads the leader again: Redis counts in
// whole milliseconds.
const expiryMargin = 2 * time.Millisecond

// healthEvery is how long an observer's subscription may stay silent
// before it PINGs its connection, so that a connection that died without a
// word is found and replaced. It checks the connection, not the leader.
const healthEvery = 30 * time.Second

// Observe returns a channel that delivers every change of leader until ctx
// ends, and is then closed. It first delivers the current leader, if any.
// Each later change arrives as Redis pushes it, without polling: an Info
// for each new leader (in increasing term order) and the zero Info when
// nobody leads: a leader resigned, and its successor, if any, has not yet
// taken office (it may follow a moment later). The channel is
// unbuffered; a slow reader delays later changes, and when Redis drops a
// subscriber that fell too far behind, the observer resubscribes and
// resynchronises as below.
//
// Mechanism: Observe subscribes to the election's pub/sub channel, where
// a new leader's Campaign and a Resign publish in the same script that
// changes the record. After every subscription and resubscription (the
// client reconnects and subscribes again after a lost connection) it reads the
// leader with [Election.Leader] and delivers it if it changed, so an
// observer that was disconnected, or that subscribed after a change, still
// delivers the latest leader; the changes it missed in between are not
// replayed. While Redis cannot be reached it retries, backing off up to a
// second. A silent connection is PINGed every 30 s. After each new leader
// it reads the leader too, to learn when its lease ends.
//
// Every way a leadership ends reaches observers. [Leadership.Resign], and
// the leader's [fairlock.Client.Close] or Shutdown (which release the
// election's mutex), publish the change: observers deliver no leader (the
// zero Info), then the successor when it takes office, as Redis pushes
// them. A lease that ends with no process to say so (its leader crashed,
// was paused past its lease, or Abandoned its client) publishes nothing:
// the observer, which has read when the leader's lease ends unless
// renewed, reads the leader again then, and so delivers no leader within
// a round trip to Redis of the lease's expiry by Redis's clock (and the
// successor, if one was queued, when it takes office at that expiry). So
// while a leader leads, each observer reads it once per renewal period or
// so of the leader's lease (a third to all of its TTL), besides what Redis
// pushes.
//
// Observe starts one goroutine and one pub/sub connection, both ended
// when ctx ends.
func (e *Election) Observe(ctx context.Context) <-chan Info {
	ch := make(chan Info)
	s, err := engine.Subscribe(ctx, e.c, e.channel)
	if err != nil { // (New checked that the client can subscribe)
		close(ch)
		return ch
	}
	sub := s.(backend.Subscription)
	stop := context.AfterFunc(ctx, func() { _ = sub.Close() }) // ends a blocked Receive
	go func() {
		defer close(ch)
		defer stop()
		defer sub.Close()
		o := observer{e: e, ch: ch}
		o.run(ctx, sub)
	}()
	return ch
}

// observer is the state of one Observe goroutine.
type observer struct {
	e      *Election
	ch     chan<- Info
	last   int64 // the term last delivered; 0: none, or no leader
	newest int64 // the highest term delivered
}

func (o *observer) run(ctx context.Context, sub backend.Subscription) {
	retry := time.NewTimer(0)
	<-retry.C
	backoff := 50 * time.Millisecond
	wait := func() bool {
		retry.Reset(backoff)
		backoff = min(2*backoff, time.Second)
		select {
		case <-ctx.Done():
			retry.Stop()
			return false
		case <-retry.C:
			return true
		}
	}
	resync := false
	// due is when the leader's lease, as last read, ends unless renewed:
	// the leader is read again then (zero: no leader to watch).
	var due time.Time
	for ctx.Err() == nil {
		if !due.IsZero() && !time.Now().Before(due) {
			resync = true
		}
		if resync {
			sent := time.Now()
			l, err := engine.LeaderGet(ctx, o.e.c, o.e.name)
			if err != nil {
				if !wait() {
					return
				}
				continue
			}
			resync, due = false, time.Time{}
			info := Info{Value: l.Value, Term: l.Term}
			if l.Term != 0 {
				due = sent.Add(l.Left + expiryMargin)
			}
			if !o.deliver(ctx, info) {
				return
			}
		}
		timeout := healthEvery
		if !due.IsZero() {
			timeout = max(min(timeout, time.Until(due)), time.Millisecond)
		}
		payload, subscribed, ok, err := sub.Receive(ctx, timeout)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// The subscription subscribes again on the next Receive.
			if !wait() {
				return
			}
			continue
		}
		if !ok { // silence, the connection checked
			continue
		}
		backoff = 50 * time.Millisecond
		if subscribed {
			resync = true
			continue
		}
		info, ok := parse(payload)
		if !ok || info.Term == 0 {
			// A resignation: whether a successor took office at once
			// is in the record.
			resync = true
			continue
		}
		if !o.deliver(ctx, info) {
			return
		}
		// Read the new leader's lease, to watch it.
		resync = true
	}
}

// deliver sends info unless it is no change, or a leader older than one
// already delivered. It reports false when ctx ended first.
func (o *observer) deliver(ctx context.Context, info Info) bool {
	if info.Term == o.last || (info.Term != 0 && info.Term < o.newest) {
		return true
	}
	select {
	case o.ch <- info:
	case <-ctx.Done():
		return false
	}
	o.last, o.newest = info.Term, max(o.newest, info.Term)
	return true
}

// parse reads a change published by the engine's leader ops: "term value", or "0".
func parse(payload string) (Info, bool) {
	t, v, _ := strings.Cut(payload, " ")
	term, err := strconv.ParseInt(t, 10, 64)
	if err != nil || term < 0 {
		return Info{}, false
	}
	return Info{Value: v, Term: term}, true
}
