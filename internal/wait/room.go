// Package wait is where a client's acquisitions wait for their grants:
// a room per semaphore waited on, which keeps its waiters alive in Redis
// (refresh) and runs the queue when a lease or a waiter deadline passes,
// and the listeners, whose blocking reads hear the grants the scripts push
// onto the client's wake lists and hand each to its waiter. It reaches
// Redis through the client's call path (internal/callpath) and Backend
// only, and imports nothing of the root package: the root package builds
// a Waits into each Client and reads each waiter's wake-up.
package wait

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/script"
)

// listenTimeout is how long one BLPOP blocks. It only bounds how long an
// idle listener lingers after its last waiter left; wake-ups and nudges end
// the block at once. go-redis rounds shorter timeouts up to a second anyway.
const listenTimeout = time.Second

// Waits is how a client's acquisitions wait for their grants: a room per
// semaphore waited on (its waiters, their liveness refresh, the queue's
// timed events) and the listeners (listener.go) whose blocking reads hear
// the grants. It shares the client's lock, and reaches Redis through the
// client's call path (refreshes) and Backend (blocking reads, nudges).
type Waits struct {
	Mu        *sync.Mutex     // the client's
	Wg        Group           // the client's: goroutines Close waits for
	Closing   context.Context // the client's: ends at Close
	Done      <-chan struct{} // closing's
	Calls     *callpath.Caller
	B         backend.Backend
	Info      backend.Info
	WaiterTTL time.Duration // the client's
	Prefix    string        // the client's key prefix
	ID        string        // the client's: names its wake and control lists
	// The TTLs as script arguments (the client's).
	LeaseMs, WaiterMs string
	Logf              func(level slog.Level, msg string, names []string, token string, attrs ...slog.Attr)

	// Guarded by mu.
	Closed  bool             // Close has begun: no room starts
	Rooms   map[string]*Room // by keyspace.Keys.Base
	Tickets map[string]*Room // by ticket: the room each waiter waits in
	// Spare is a room that was made and forgotten without ever running
	// (its acquisition was granted at once, as most are), kept for the
	// next room: nothing but its waiters' acquisitions ever held it, and
	// they have all left it (see Unregister).
	Spare *Room
	// OwnLists: the client's one wake list (keyspace.Keys.Wake) holds another
	// program's value, so the scripts push its grants onto each
	// semaphore's own list, and its rooms listen there; ownChecked is
	// when that was last looked at (see processListBack).
	OwnLists    bool
	ownChecked  time.Time
	Listeners   map[string][]*Listener // by listenGroup
	listenerSeq uint64                 // names listeners' control lists
	blk         backend.Backend        // where listeners block; see blockingLocked
	CloseBlk    func() error           // closes blk if the Client's Backend made it

	noBLMPop atomic.Bool // blk's server lacks BLMPOP: listeners use BLPOP

	// Grants counts the grants this client's acquisitions took, by how
	// each learned of its grant (for tests: a grant that a wake-up
	// should carry and a refresh found instead is a lost wake-up), and
	// the grants they gave back as heard too late (for tests: a process
	// that did not stall gives none back).
	Grants grantCounts
}

// A Room gathers one client's waiters on one semaphore. While it has
// waiters it belongs to one of the client's listeners (listener.go), whose
// blocking read receives every grant to them, and it runs maintain, which
// refreshes their liveness and runs the queue when a lease or a waiter
// deadline passes.
type Room struct {
	C       *Waits
	K       keyspace.Keys
	WakeKey string        // where it hears grants (Waits.WakeKeyLocked; guarded by c.mu once running)
	Kick    chan struct{} // wakes maintain to look at due again

	// Guarded by c.mu.
	Waiters   map[string]*Waiter
	Running   bool          // maintain runs and a listener hears wakeKey
	due       time.Time     // when maintain runs next
	Stop      chan struct{} // closed when maintain must end
	idleSince time.Time     // when its listener first saw it without waiters
	clock     clock.Sample  // the latest reading of the semaphore's Redis clock
	Answered  time.Time     // when a script of the room last answered (see failStale)
	// Event is the earliest moment a script's reply put the queue's next
	// event at (a lease's expiry, a waiter's deadline) that no answered
	// round has run the queue past yet; zero for none (see round).
	Event time.Time
}

type Waiter struct {
	Ticket  string
	Box     any           // ticket, boxed once for every call that names it
	Permits int64         // of the room's semaphore
	group   string        // the plan's group, for a request over several semaphores
	Lease   string        // the plan's lease TTL as a script argument (its member holds it)
	Ch      chan struct{} // buffered; signalled at most once, once wk is set
	Wk      wakeup        // what ch signals: written once, before the signal
	// Queued is set (under c.mu) once the acquire script has queued the
	// ticket. Only queued tickets are refreshed: a refresh that reached
	// Redis before the ticket's own acquire script would report it gone.
	Queued bool
	// Alive is when the ticket was last known alive in Redis (queued, or
	// a refresh that covered it answered), and failed the error of the
	// refreshes that covered it since, if they all failed (both guarded
	// by c.mu). See failStale.
	Alive  time.Time
	Failed error
	// Alone: the last refresh that failed covered this waiter alone, so
	// its failure is this waiter's own (guarded by c.mu).
	Alone bool
}

// wakeup is what a waiter learns: granted (a token per semaphore), dropped
// from the queue (requeue), or cut off from Redis for longer than its
// liveness (err).
type wakeup struct {
	Grant   Grant
	sample  clock.Sample // relates grant.expiry to the local clock
	Via     grantVia     // how a grant was learned
	Requeue bool
	Err     error
}

// grantVia is how an acquisition learned of its grant.
type grantVia int

const (
	ViaReply   grantVia = iota // its own acquire script's reply
	viaWake                    // a wake-up popped from its wake list
	viaRefresh                 // its room's refresh
)

// grantCounts counts grants by how they were learned (grantVia), and
// those given back as heard too late.
type grantCounts struct {
	n    [3]atomic.Int64
	Late atomic.Int64
}

func (g *grantCounts) Add(v grantVia) { g.n[v].Add(1) }

// GaveBack counts a grant given back because it was heard after the
// moment its lease could have ended.
func (g *grantCounts) GaveBack() { g.Late.Add(1) }

// Get returns the grants learned by each way: reply, wake-up, refresh.
func (g *grantCounts) Get() (reply, wake, refresh int64) {
	return g.n[ViaReply].Load(), g.n[viaWake].Load(), g.n[viaRefresh].Load()
}

// Enter makes a ticket for one acquisition of permits of the
// semaphore of keys k (the first of a request over several, whose group
// is group), whose lease TTL is lease as a script argument ("" for the
// client's); when it may wait, the ticket also gets a waiter in that
// semaphore's room.
func (c *Waits) Enter(k keyspace.Keys, permits int64, group, lease string, wait bool) (*Room, *Waiter, error) {
	if lease == "" {
		lease = c.LeaseMs
	}
	t := keyspace.NewTicket()
	w := &Waiter{Ticket: t, Box: t, Permits: permits, group: group, Lease: lease, Ch: make(chan struct{}, 1)}
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if c.Closed {
		return nil, nil, fault.ErrClosed
	}
	if !wait {
		return nil, w, nil
	}
	r := c.Rooms[k.Base]
	if r == nil {
		r = c.newRoomLocked(k)
		c.Rooms[k.Base] = r
	}
	r.Waiters[w.Ticket] = w
	c.Tickets[w.Ticket] = r
	return r, w, nil
}

// newRoomLocked returns a room for the semaphore of keys k, without
// waiters: the spare one if there is one (its wake list kept when it was
// made for k, as the wake lists change only with useListsLocked, which
// drops the spare), else a new one. c.mu is held.
func (c *Waits) newRoomLocked(k keyspace.Keys) *Room {
	r := c.Spare
	if r == nil {
		return &Room{C: c, K: k, WakeKey: c.WakeKeyLocked(k), Kick: make(chan struct{}, 1), Waiters: make(map[string]*Waiter)}
	}
	c.Spare = nil
	wakeKey := r.WakeKey
	if r.K.Base != k.Base {
		wakeKey = c.WakeKeyLocked(k)
	}
	*r = Room{C: c, K: k, WakeKey: wakeKey, Kick: r.Kick, Waiters: r.Waiters}
	return r
}

// WakeKeyLocked returns the list on which the client hears grants on the
// semaphore of keys k. c.mu is held.
func (c *Waits) WakeKeyLocked(k keyspace.Keys) string {
	if c.OwnLists {
		return k.OwnWake(c.ID)
	}
	return k.Wake(c.ID)
}

func (c *Waits) Unregister(r *Room, w *Waiter) {
	if r == nil {
		return
	}
	c.Mu.Lock()
	defer c.Mu.Unlock()
	r.forgetLocked(w.Ticket)
	if len(r.Waiters) == 0 && !r.Running && c.Rooms[r.K.Base] == r {
		delete(c.Rooms, r.K.Base)
		// A room that never ran was held by its waiters' acquisitions
		// alone (no maintain, no listener), and each has left it; one
		// that ran may still be in its maintain's or a listener's hands.
		if r.Stop == nil {
			c.Spare = r
		}
	}
}

// NoteQueued records that w is queued, makes sure r runs (maintain, and a
// listener that hears its wake list), and that maintain runs no later than
// after the given time (the queue's next event, or < 0 for none). A room
// that starts running may nudge its listener, in the background. sample is
// the reading of Redis's clock the acquire script reported.
func (c *Waits) NoteQueued(r *Room, w *Waiter, next time.Duration, sample clock.Sample) {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	// The script set the ticket's deadline after it was sent.
	w.Queued, w.Alive = true, time.Now()
	if !sample.Sent.IsZero() {
		w.Alive = sample.Sent
	}
	r.Answered = w.Alive
	r.noteClockLocked(sample)
	r.noteEventLocked(sample.Sent, next)
	if c.Closed {
		return
	}
	if !r.Running {
		r.Running = true
		r.Stop = make(chan struct{})
		r.due = time.Now().Add(c.RefreshEvery())
		c.Wg.Add(1)
		go r.maintain(r.Stop)
		if l := c.AttachLocked(r); l != nil {
			c.Wg.Add(1)
			go c.nudge(l, c.blk)
		}
	}
	r.scheduleLocked(next)
}

func (c *Waits) RefreshEvery() time.Duration { return c.WaiterTTL / RenewDivisor }

// ClockOf returns the reading of Redis's clock by which wake-up wk's grant
// is counted: the one it came with, or, for a grant heard before its room
// had any (announced and heard the moment its ticket was queued, before
// the process read its acquire's reply), the room's latest, which that
// reply has given it since (noteQueued runs before the grant is awaited).
func (c *Waits) ClockOf(r *Room, wk wakeup) clock.Sample {
	if !wk.sample.Sent.IsZero() {
		return wk.sample
	}
	c.Mu.Lock()
	defer c.Mu.Unlock()
	return r.clock
}

// noteClockLocked keeps the latest reading of Redis's clock.
func (r *Room) noteClockLocked(s clock.Sample) {
	if s.Sent.After(r.clock.Sent) {
		r.clock = s
	}
}

// noteEventLocked notes the queue's next event as a script sent at sent
// reported it: next from then (< 0 for none). c.mu is held.
func (r *Room) noteEventLocked(sent time.Time, next time.Duration) {
	if next < 0 || sent.IsZero() {
		return
	}
	if at := sent.Add(next); r.Event.IsZero() || at.Before(r.Event) {
		r.Event = at
	}
}

// scheduleLocked moves maintain's next run earlier, to next from now.
func (r *Room) scheduleLocked(next time.Duration) {
	if next < 0 {
		return
	}
	if at := time.Now().Add(next); at.Before(r.due) {
		r.due = at
		select {
		case r.Kick <- struct{}{}:
		default:
		}
	}
}

// StopRoomLocked ends r's maintain and, once r has no waiters, forgets r,
// so a later waiter starts afresh. r's listener has let it go. c.mu is
// held.
func (c *Waits) StopRoomLocked(r *Room) {
	if !r.Running {
		return
	}
	r.Running = false
	close(r.Stop)
	if len(r.Waiters) == 0 && c.Rooms[r.K.Base] == r {
		delete(c.Rooms, r.K.Base)
	}
}

// forgetLocked removes ticket's waiter from r. c.mu is held.
func (r *Room) forgetLocked(ticket string) {
	delete(r.Waiters, ticket)
	if r.C.Tickets[ticket] == r {
		delete(r.C.Tickets, ticket)
	}
}

// deliverGrant hands a wake-up payload popped from a wake list to its
// waiter, in whichever room it waits; it is the one place payloads reach
// waiters. A payload for a ticket that no longer waits is dropped (see
// deliver).
func (c *Waits) deliverGrant(payload string) {
	ticket, g, ok := parseWake(payload)
	if !ok {
		return
	}
	c.Mu.Lock()
	r := c.Tickets[ticket]
	var sample clock.Sample
	if r != nil {
		sample = r.clock
	}
	c.Mu.Unlock()
	if r != nil {
		r.deliver(ticket, wakeup{Grant: g, sample: sample, Via: viaWake})
	}
}

// deliver hands w to the waiter of ticket, if it still waits. A wake-up for
// a ticket that no longer waits (cancelled, or from an earlier life of the
// wake list) is dropped: tickets are never reused, so it cannot be
// mistaken for a grant to anybody else.
func (r *Room) deliver(ticket string, wk wakeup) {
	r.C.Mu.Lock()
	w := r.Waiters[ticket]
	r.forgetLocked(ticket)
	r.C.Mu.Unlock()
	if w != nil {
		w.Wk = wk
		w.Ch <- struct{}{}
	}
}

// maintain keeps the room's waiters alive in Redis and runs the queue's
// timed events: a lease expiring or a dead waiter's deadline passing, after
// which the queue may move though nobody released. It wakes only at those
// moments and a third of the waiter TTL after each round; it never polls
// for grants. (Not a third after each round began, as a lease's renewals
// are timed: a round of thousands of waiters on a busy Redis may take
// that long, and rounds back to back then took the time of the grants
// they were keeping alive. A waiter whose answers take two thirds of the
// waiter TTL is lost, and queues again.)
func (r *Room) maintain(stop chan struct{}) {
	c := r.C
	defer c.Wg.Done()
	timer := time.NewTimer(clock.Never) // reset below
	defer timer.Stop()
	for {
		c.Mu.Lock()
		due := r.due
		c.Mu.Unlock()
		timer.Reset(time.Until(due))
		select {
		case <-stop:
			return
		case <-c.Done:
			return
		case <-r.Kick:
			continue
		case <-timer.C:
		}
		c.Mu.Lock()
		if time.Now().Before(r.due) {
			c.Mu.Unlock()
			continue
		}
		r.due = time.Now().Add(clock.Never) // lowered by the result below or by schedule
		c.Mu.Unlock()

		next, err := r.Round(true)
		if err != nil {
			r.FailStale(time.Now())
			next = min(next, c.WaiterTTL/RetryDivisor)
		}
		c.Mu.Lock()
		r.scheduleLocked(next)
		c.Mu.Unlock()
	}
}

// RefreshBatch is the most tickets one refresh script takes, so that a
// room of any size refreshes in scripts of bounded length.
const RefreshBatch = 128

// suspectScripts is the most refresh scripts a round sends for the
// waiters whose last refresh failed.
const suspectScripts = 8

// staleTimeouts is how many waiter TTLs a waiter's refreshes may time out,
// all of them, before it fails though its semaphore's other scripts are
// answered: a Redis that stays that busy for it is not coming back soon.
const staleTimeouts = 10

// refreshParallel is how many of a room's refresh scripts are in flight at
// once. Sent one after the other, each waits its turn behind the other
// commands in Redis and in the connection pool: with thousands of waiters
// and their acquisitions in flight, a round of 20 scripts took longer than
// a waiter's TTL, and the waiters it had not reached yet died.
const refreshParallel = 8

// RefreshBatchesLocked returns the arguments of the refresh scripts of a
// round over r's queued waiters (at least one script, which runs the
// queue even when none is queued). With a non-zero young, a round in
// which every queued waiter was last known alive after young sends no
// script, and returns when the first of them is due a refresh, one
// refresh period after it was last known alive; a round that refreshes
// any waiter names them all, so that none is refreshed more often than
// every period. c.mu is held.
func (r *Room) RefreshBatchesLocked(young time.Time) (batches [][]string, due time.Time) {
	c := r.C
	if !young.IsZero() {
		for _, w := range r.Waiters {
			if !w.Queued {
				continue
			}
			if w.Failed != nil || !w.Alive.After(young) {
				due = time.Time{}
				break
			}
			if at := w.Alive.Add(c.RefreshEvery()); due.IsZero() || at.Before(due) {
				due = at
			}
		}
		if !due.IsZero() {
			return nil, due
		}
	}
	// Waiters whose last refresh failed go in batches of their own,
	// shuffled, in at most suspectScripts scripts (of at most
	// RefreshBatch tickets), sent first: so the batches halve and more as
	// the suspects dwindle, and one waiter whose refresh fails for what it
	// reaches (see failStale) parts from the others within a few rounds
	// (128, 16, 2, 1 tickets); and on a busy Redis the scripts that timed
	// out are not the ones queued last again.
	//
	// One refresh names one lease TTL, which the waiters' members hold:
	// waiters whose requests gave TTLs of their own (Request.LeaseTTL) go
	// in batches of their TTL.
	open := map[string][]string{} // by lease TTL: the batch being filled
	var suspects []string
	for t, w := range r.Waiters {
		if !w.Queued {
			continue
		}
		if w.Failed != nil {
			suspects = append(suspects, t)
			continue
		}
		args := open[w.Lease]
		if args == nil {
			args = c.RefreshArgs(min(len(r.Waiters), RefreshBatch), w.Lease)
		}
		args = AppendRefreshed(args, t, w.Permits, w.group)
		if RefreshCount(args) >= RefreshBatch {
			batches = append(batches, args)
			args = nil
		}
		open[w.Lease] = args
	}
	for _, args := range open {
		if args != nil {
			batches = append(batches, args)
		}
	}
	rand.Shuffle(len(suspects), func(i, j int) { suspects[i], suspects[j] = suspects[j], suspects[i] })
	var lead [][]string
	for chunk := range slices.Chunk(suspects, min(RefreshBatch, max(1, (len(suspects)+suspectScripts-1)/suspectScripts))) {
		byLease := map[string][]string{}
		for _, t := range chunk {
			w := r.Waiters[t]
			args := byLease[w.Lease]
			if args == nil {
				args = c.RefreshArgs(len(chunk), w.Lease)
			}
			byLease[w.Lease] = AppendRefreshed(args, t, w.Permits, w.group)
		}
		for _, args := range byLease {
			lead = append(lead, args)
		}
	}
	batches = append(lead, batches...)
	if len(batches) == 0 {
		batches = append(batches, c.RefreshArgs(0, c.LeaseMs))
	}
	return batches, time.Time{}
}

// Refresh keeps r's waiters alive in Redis, runs the queue (dropping dead
// waiters and expired leases, granting what fits), hands on what it learns
// about r's tickets, notes each queued waiter alive or failed, and returns
// when it should run next and the first error of its scripts that failed.
// (A round of many scripts may see some answered and some not: on a busy
// Redis, those queued behind the others' traffic run out of time.)
func (r *Room) Refresh() (next time.Duration, first error) { return r.Round(false) }

// YoungFor is how long after a waiter was last known alive a periodic
// round may leave it to the next: its deadline is then more than five
// sixths of a waiter TTL away, and the round that refreshes it comes by
// the time it is one refresh period old, as a waiter's first refresh
// always came.
func (c *Waits) YoungFor() time.Duration { return c.RefreshEvery() / 2 }

// Round is a round of refresh. A periodic one (maintain's) whose waiters
// were all known alive within youngFor, when no event of the queue is
// due, sends no script, and comes back before the first of them is one
// refresh period old or at the next event, whichever is first; a round
// that refreshes some waiter refreshes them all. A busy semaphore's
// waiters mostly wait less than a refresh period: their rooms then send
// no refresh at all. (The queue's events are run at their time, by a
// round then; the waiters' acquire scripts, and any release, run the
// queue besides.)
func (r *Room) Round(periodic bool) (next time.Duration, first error) {
	c := r.C
	c.Mu.Lock()
	now := time.Now()
	ahead := !r.Event.IsZero() && now.Before(r.Event) // an event, not yet due
	var young time.Time
	if periodic && (r.Event.IsZero() || ahead) {
		// (A round at an event names every waiter: the script reports
		// those a lost party or an opened latch ends.)
		young = now.Add(-c.YoungFor())
	}
	batches, due := r.RefreshBatchesLocked(young)
	next = c.RefreshEvery()
	if !due.IsZero() {
		next = max(0, min(next, due.Sub(now)))
	}
	if ahead {
		next = min(next, r.Event.Sub(now))
	}
	c.Mu.Unlock()
	if len(batches) == 0 {
		return next, nil
	}
	var mu sync.Mutex // next, first
	one := func(args []string) error {
		ctx, cancel := context.WithTimeout(context.Background(), c.WaiterTTL)
		sent := time.Now()
		res, _ := c.Calls.Run(ctx, script.Call{Op: script.OpRefresh, Keys: r.K.List(), Args: args}) // unreplicated refreshes are refreshed again
		cancel()
		rep, err := parseRefreshReply(res)
		r.noteRefreshed(args, sent, err)
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			err = r.apply(rep, sent, &next)
		}
		if err != nil && first == nil {
			first = err
		}
		return err
	}
	// Parting a refused script stops a waiter TTL into the round: the
	// rounds that follow go on with what is left (see narrow).
	until := time.Now().Add(c.WaiterTTL)
	send := func(args []string) { r.Narrow(args, one(args), one, until) }
	if len(batches) == 1 {
		send(batches[0])
		return next, first
	}
	var wg sync.WaitGroup
	work := make(chan []string)
	for range min(len(batches), refreshParallel) {
		wg.Go(func() {
			for args := range work {
				send(args)
			}
		})
	}
	for _, args := range batches {
		work <- args
	}
	close(work)
	wg.Wait()
	return next, first
}

// Narrow parts a refresh script that Redis refused for some of its
// waiters (err: another program's key at a multi-lock waiter's other
// semaphore, see refusedForSome) into suspectScripts smaller ones, sent
// side by side by one, and goes on parting those refused while others
// were answered (the partings side by side too). So the waiter at fault
// is parted from the waiters beside it within the round (128, 16, 2, 1
// tickets: 19 scripts, 4 round trips), and they are answered again in the
// round that found it. Parted over the rounds that follow instead, as a
// busy Redis's rounds took close to a waiter TTL each, the last of them
// beside it ran past their three TTLs and failed with it. The parting
// stops where every part is refused alike, and at until (a waiter TTL
// into the round: a Redis that slow leaves the rest to the rounds that
// follow, which part the suspects as refreshBatchesLocked says); a
// refusal of the semaphore itself (its own key, its layout, a Redis
// loading) parts nothing, rather than send Redis eight scripts for each
// it refused.
func (r *Room) Narrow(args []string, err error, one func([]string) error, until time.Time) {
	if !r.refusedForSome(err) || RefreshCount(args) < 2 || !time.Now().Before(until) {
		return
	}
	n := RefreshCount(args)
	k := min(n, suspectScripts)
	parts := make([][]string, k)
	for i := range parts {
		lo, hi := n*i/k, n*(i+1)/k
		parts[i] = append(slices.Clip(args[:4]), args[4+3*lo:4+3*hi]...)
	}
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i, part := range parts {
		wg.Go(func() { errs[i] = one(part) })
	}
	wg.Wait()
	if !slices.Contains(errs, nil) {
		return
	}
	for i, part := range parts {
		if errs[i] != nil {
			wg.Go(func() { r.Narrow(part, errs[i], one, until) })
		}
	}
	wg.Wait()
}

// refusedForSome reports whether err, a refresh script's, is a refusal
// that may concern some of its waiters and not others: another program's
// key (FAIRLOCK_FOREIGN_KEY <found> <kept> <key>) that is not one of r's
// own keys (its base too: a latch's or a barrier's hash), so at another
// semaphore that a waiter's multi-lock request names.
func (r *Room) refusedForSome(err error) bool {
	msg, ok := fault.ReplyOf(err)
	if !ok {
		return false
	}
	rest, ok := strings.CutPrefix(msg, fault.ForeignErrPrefix)
	if !ok {
		return false
	}
	f := strings.SplitN(rest, " ", 3)
	if len(f) < 3 {
		return false
	}
	key := f[2]
	return key != r.K.Base && !slices.Contains(r.K.All, key) && !strings.HasPrefix(key, r.K.Base+keyspace.Sep)
}

// apply hands on what a refresh reply says: the queue's next event and
// the tickets that stopped waiting (granted, or dropped).
func (r *Room) apply(rep refreshReply, sent time.Time, next *time.Duration) error {
	if rep.next >= 0 {
		*next = min(*next, time.Duration(rep.next)*time.Millisecond)
	}
	sample := clock.Sample{Sent: sent, Redis: rep.now}
	r.C.Mu.Lock()
	r.noteClockLocked(sample)
	if !r.Event.IsZero() && !r.Event.After(sent) {
		r.Event = time.Time{} // this script ran the queue past it
	}
	r.noteEventLocked(sent, time.Duration(rep.next)*time.Millisecond)
	r.C.Mu.Unlock()
	for _, t := range rep.gone {
		if t.grant == nil {
			r.deliver(t.ticket, wakeup{Requeue: true})
			continue
		}
		r.deliver(t.ticket, wakeup{Grant: *t.grant, sample: sample, Via: viaRefresh})
	}
	return nil
}

// noteRefreshed notes the waiters of the refresh args alive at sent if
// the refresh was answered (err nil), else failed with err.
func (r *Room) noteRefreshed(args []string, sent time.Time, err error) {
	r.C.Mu.Lock()
	defer r.C.Mu.Unlock()
	if err == nil {
		r.Answered = sent
	}
	for i := range RefreshCount(args) {
		w := r.Waiters[RefreshedTicket(args, i)]
		switch {
		case w == nil:
		case err == nil:
			w.Alive, w.Failed, w.Alone = sent, nil, false
		default:
			w.Failed, w.Alone = fault.ScriptError(err), RefreshCount(args) == 1
		}
	}
}

// FailStale ends, with an error matching fault.ErrRedis, the wait of each queued
// waiter that refreshes can no longer keep alive: its ticket has died in
// Redis, or will, and its Acquire must not wait on in ignorance.
//
// A waiter whose refreshes were all refused (an error Redis answered, or
// a connection it could not make) since it was last known alive, one
// waiter TTL ago, fails if the last of them covered it alone; if that
// covered others too, it fails three waiter TTLs after it was last
// alive. So a refresh that fails for what it reaches for one waiter, such
// as another program's key at a multi-lock's other semaphore, fails that
// waiter, not the room: refresh parts the waiters of failed scripts into
// smaller ones round by round (see refresh), the one at fault ends alone
// and fails, and those that were beside it are answered again before
// their limit. A refresh that timed out says only that Redis, or the pool, is
// busy: its waiters fail once no script of the room has been answered for
// three waiter TTLs either. While some are answered, Redis is up, and a
// waiter whose ticket died meanwhile is reported gone by the next refresh
// that covers it and queues again; but one whose refreshes have all timed
// out for staleTimeouts waiter TTLs fails.
func (r *Room) FailStale(now time.Time) {
	c := r.C
	var stale []*Waiter
	c.Mu.Lock()
	for t, w := range r.Waiters {
		if !w.Queued || w.Failed == nil {
			continue
		}
		lost := now.Sub(w.Alive) >= c.WaiterTTL && w.Alone || now.Sub(w.Alive) >= 3*c.WaiterTTL
		if fault.Slow(w.Failed) {
			limit := 3 * c.WaiterTTL
			lost = now.Sub(w.Alive) >= limit && now.Sub(r.Answered) >= limit ||
				now.Sub(w.Alive) >= staleTimeouts*c.WaiterTTL
		}
		if lost {
			r.forgetLocked(t)
			stale = append(stale, w)
		}
	}
	c.Mu.Unlock()
	for _, w := range stale {
		w.Wk = wakeup{Err: fmt.Errorf("%w: waiter could not be kept alive for %v: %w", fault.ErrRedis, now.Sub(w.Alive).Round(time.Millisecond), w.Failed)}
		w.Ch <- struct{}{}
	}
}
