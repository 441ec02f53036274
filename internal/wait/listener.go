package wait

import (
	"context"
	"log/slog"
	"runtime"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyslot"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/script"
)

// maxListenKeys caps the wake lists one BLPOP waits on. A full listener
// leaves new rooms to another listener of its group.
const maxListenKeys = 512

// A Listener receives the grants to the waiters of rooms of one client
// whose wake lists number up to maxListenKeys, with one BLPOP at a time,
// on one connection of the client's blocking client (see
// [Waits.blockingLocked]), never on the caller's pool, so waiting on any
// number of semaphores cannot delay renewals or releases. The rooms of one
// listener share a group: the keys one BLPOP may take together (any on a
// single node, one hash slot on Cluster). On a single node every room of
// the client has the same wake list (keyspace.Keys.Wake), so one listener reading
// two keys hears the grants on every semaphore the client waits on.
//
// Besides the rooms' wake lists the BLPOP takes the listener's control
// list, ctl. A room that joins while the BLPOP blocks, with a wake list
// the BLPOP does not take, pushes an empty entry there (a nudge), so the
// listener starts again with the new key at once rather than at the
// BLPOP's timeout. Only a change of the key set costs a nudge; a room
// keeps its place for listenTimeout after its last waiter leaves, so a
// semaphore waited on again and again costs none.
type Listener struct {
	group string
	Ctl   string

	// Guarded by c.mu.
	Rooms map[string]*Room // by keyspace.Keys.Base
	Wakes map[string]int   // the rooms' wake keys, each with its number of rooms
	keys  []string         // ctl, then the wake keys; nil: rebuild
	// foreign are wake keys another program wrote (a value that is not a
	// list, which fails the whole BLPOP): left out of it, so that the
	// other rooms still hear their grants; their own room hears its
	// grants through its refresh.
	foreign map[string]bool
	blocked bool      // a BLPOP without the rooms added since may run
	nudged  bool      // a nudge went out since that BLPOP started
	swept   time.Time // when idle rooms were last looked for
}

// listenGroup returns the group of a wake list: the keys of one group may
// share a BLPOP. Every group's keys are in one hash slot, and its
// listener's control list (ctlName, under the hash tag of the wake list
// it started with) is in that slot too, so no read is refused as
// CROSSSLOT: not on Cluster, and not on a cluster-enabled node that
// serves every slot behind a client that takes it for one server
// (backend.Single). On one server the rooms all share the client's one
// wake list, hence one group, except while that list holds another
// program's value and they listen on their semaphores' own lists (see
// useListsLocked): then one group per slot. For a Backend whose placement
// fairlock cannot know (backend.Other), every wake list is a group of its
// own: one BLPOP per semaphore, as the client routes single-key commands.
func (c *Waits) listenGroup(wakeKey string) string {
	if c.Info.Layout == backend.Single || c.Info.Layout == backend.Cluster {
		return strconv.Itoa(keyslot.Of(wakeKey))
	}
	return wakeKey
}

// blockingLocked returns the Backend the listeners block on, asking the
// client's Backend for it on first use (see Backend.Blocking: for
// go-redis, a client of the caller's kind with a pool of its own, so
// blocked reads never hold the caller's connections). If the Backend
// cannot make one, the listeners block on it. c.mu is held.
func (c *Waits) blockingLocked() backend.Backend {
	if c.blk != nil {
		return c.blk
	}
	blk, closeBlk, err := c.B.Blocking()
	if err != nil || blk == nil {
		if err != nil {
			c.Logf(slog.LevelWarn, "fairlock: no client of its own for blocking reads; they use the client's connections", nil, "", slog.Any("error", err))
		}
		blk, closeBlk = c.B, nil
	}
	c.blk, c.CloseBlk = blk, closeBlk
	return c.blk
}

// AttachLocked gives the running room r to a listener of its group,
// starting one if none has space. It returns the listener to nudge, if
// its BLPOP may be blocked without r's wake list. c.mu is held and c is
// not closed.
func (c *Waits) AttachLocked(r *Room) (nudge *Listener) {
	g := c.listenGroup(r.WakeKey)
	var l *Listener
	for _, x := range c.Listeners[g] {
		if x.Wakes[r.WakeKey] > 0 || len(x.Wakes) < maxListenKeys {
			l = x
			break
		}
	}
	if l == nil {
		c.listenerSeq++
		l = &Listener{
			group: g,
			// In the slot and under the hash tag of the room's wake list.
			Ctl:   c.CtlName(r.WakeKey, c.listenerSeq),
			Rooms: make(map[string]*Room),
			Wakes: make(map[string]int),
			swept: time.Now(),
		}
		c.Listeners[g] = append(c.Listeners[g], l)
		blk := c.blockingLocked()
		c.Wg.Add(1)
		go c.runListener(l, blk)
	}
	r.idleSince = time.Time{}
	if l.Rooms[r.K.Base] == r {
		return nil
	}
	l.Rooms[r.K.Base] = r
	l.Wakes[r.WakeKey]++
	if l.Wakes[r.WakeKey] > 1 {
		return nil // the BLPOP takes its wake key already
	}
	l.keys = nil
	if l.blocked && !l.nudged {
		l.nudged = true
		return l
	}
	return nil
}

// CtlName names a listener's control list, numbered seq, in the slot and
// under the hash tag of key: a derived key (keyspace.Keys.Derived) of kind
// keyspace.KindControl beside the base prefix{tag}, which no other kind of key
// uses, so it is never another object's key; the client id and seq tell
// two listeners' lists apart.
func (c *Waits) CtlName(key string, seq uint64) string {
	return keyspace.DerivedKey(c.Prefix+"{"+keyslot.HashTag(key)+"}", keyspace.KindControl, c.ID, strconv.FormatUint(seq, 10))
}

// nudge ends l's BLPOP so that it starts again with its new keys. If it
// fails, the new rooms are heard when the BLPOP times out (listenTimeout),
// and their grants are found by their refresh in any case.
func (c *Waits) nudge(l *Listener, via backend.Backend) {
	defer c.Wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), c.WaiterTTL)
	defer cancel()
	_ = script.NudgeScript.On(ctx, via, []string{c.CtlOf(l)}, c.WaiterMs)
}

// CtlOf returns l's control list (which leaveOutForeign may rename).
func (c *Waits) CtlOf(l *Listener) string {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	return l.Ctl
}

// runListener is l's goroutine: it BLPOPs on l's keys and hands each grant
// to its room, until l has no room left or c closes.
func (c *Waits) runListener(l *Listener, blk backend.Backend) {
	defer c.Wg.Done()
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	delay := time.Duration(0)
	for {
		c.processListBack(blk)
		c.Mu.Lock()
		c.sweepLocked(l)
		if c.Closed || len(l.Rooms) == 0 {
			c.dropListenerLocked(l)
			c.Mu.Unlock()
			return
		}
		keys := l.ReadKeysLocked()
		l.blocked, l.nudged = true, false
		c.Mu.Unlock()

		key, vals, many, err := c.blockingPop(blk, keys)

		c.Mu.Lock()
		l.blocked = false
		ctl := key == l.Ctl
		c.Mu.Unlock()
		if delay > 0 && err == nil {
			c.Logf(slog.LevelInfo, "fairlock: blocking read recovered", nil, "", slog.Int("semaphores", len(keys)-1))
		}
		switch {
		case err == nil && key == "": // timed out
			delay = 0
		case err == nil:
			delay = 0
			if !ctl {
				for _, v := range vals {
					c.deliverGrant(v)
				}
				if !many {
					c.drain(blk, key)
				}
				// The waiters just woken run before this goroutine sends
				// its next read: a handoff need not wait for that write.
				runtime.Gosched()
			}
		case fault.WrongType(err):
			// Another program wrote one of the wake keys: leave it out.
			if c.LeaveOutForeign(l, blk, keys) {
				continue
			}
			fallthrough
		default:
			// Redis unreachable (or c closed its blocking client): reconnect
			// with backoff. Waiters learn of an outage from their rooms'
			// maintain, which fails them after one liveness period.
			if delay == 0 && !c.isClosed() {
				c.Logf(slog.LevelWarn, "fairlock: blocking read failed; retrying with backoff", nil, "",
					slog.Int("semaphores", len(keys)-1), slog.Any("error", err))
			}
			delay = min(max(2*delay, 10*time.Millisecond), time.Second)
			backoff.Reset(delay)
			select {
			case <-backoff.C:
			case <-c.Done:
			}
		}
	}
}

// ReadKeysLocked returns the keys of l's next blocking read: its control
// list, then its rooms' wake lists but those another program wrote. They
// share one slot (see listenGroup). c.mu is held.
func (l *Listener) ReadKeysLocked() []string {
	if l.keys == nil {
		l.keys = make([]string, 0, 1+len(l.Wakes))
		l.keys = append(l.keys, l.Ctl)
		for k := range l.Wakes {
			if !l.foreign[k] {
				l.keys = append(l.keys, k)
			}
		}
	}
	return l.keys
}

// TypesScript returns the type of each of KEYS (TYPE): a read.
var TypesScript = script.NewEvalCode(`local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)
  if type(t) == 'table' then t = t.ok end
  out[i] = t
end
return out`)

// LeaveOutForeign finds the keys among keys (ctl first) that hold
// something other than a list, written by another program: a wake key is
// left out of l's blocking reads, the control list replaced by one of
// another name; the log says so. It reports whether it found any.
func (c *Waits) LeaveOutForeign(l *Listener, blk backend.Backend, keys []string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), c.WaiterTTL)
	defer cancel()
	types, err := TypesScript.On(ctx, blk, keys).Strings()
	if err != nil || len(types) != len(keys) {
		return false
	}
	c.Mu.Lock()
	defer c.Mu.Unlock()
	found := false
	if t := types[0]; t != "none" && t != "list" && keys[0] == l.Ctl {
		// The control list: the listener takes another name for it.
		c.listenerSeq++
		l.Ctl = c.CtlName(keys[0], c.listenerSeq)
		l.keys, found = nil, true
		c.Logf(slog.LevelError, "fairlock: a blocking read's control list holds a value another program wrote; the read takes another",
			nil, "", slog.String("key", keys[0]), slog.String("type", t))
	}
	for i, t := range types[1:] {
		k := keys[i+1]
		if t == "none" || t == "list" {
			continue
		}
		if !c.OwnLists && k == c.ProcessList() {
			c.UseListsLocked(true)
			found = true
			c.Logf(slog.LevelError, "fairlock: the client's wake list holds a value another program wrote; its grants arrive on each semaphore's own list, one blocking read per hash slot, until that value is gone",
				nil, "", slog.String("key", k), slog.String("type", t))
			continue
		}
		if l.foreign == nil {
			l.foreign = make(map[string]bool)
		}
		l.foreign[k], l.keys, found = true, nil, true
		c.Logf(slog.LevelError, "fairlock: a wake list holds a value another program wrote; its waiters hear their grants through their refresh until it is deleted",
			nil, "", slog.String("key", k), slog.String("type", t))
	}
	return found
}

// ProcessList returns the client's one wake list (keyspace.Keys.Wake), or "" when
// it has one per semaphore.
func (c *Waits) ProcessList() string {
	if _, ok := keyspace.ProcessListPrefix(c.ID); !ok {
		return ""
	}
	return keyspace.ProcessList(c.Prefix, c.ID)
}

// UseListsLocked moves every room to its semaphore's own wake list
// (own), where the scripts push grants while the client's one list holds
// another program's value (wake_list in lua/rules.lua), or back to the
// client's one list. The wake lists change groups (listenGroup), so every
// running room is attached afresh, to listeners of its new group with
// control lists in its new slot; the old listeners, left without rooms,
// end (those blocked in a read are nudged). c.mu is held.
func (c *Waits) UseListsLocked(own bool) {
	c.OwnLists, c.ownChecked = own, time.Now()
	c.Spare = nil // its wake list is the old one
	for _, r := range c.Rooms {
		r.WakeKey = c.WakeKeyLocked(r.K)
	}
	var running []*Room
	old := c.Listeners
	c.Listeners = make(map[string][]*Listener)
	for _, ls := range old {
		for _, l := range ls {
			for _, r := range l.Rooms {
				running = append(running, r)
			}
			l.Rooms, l.Wakes, l.keys = make(map[string]*Room), make(map[string]int), nil
			if l.blocked && !l.nudged && c.blk != nil {
				l.nudged = true
				c.Wg.Add(1)
				go c.nudge(l, c.blk)
			}
		}
	}
	for _, r := range running {
		r.WakeKey = c.WakeKeyLocked(r.K)
		if l := c.AttachLocked(r); l != nil && c.blk != nil {
			c.Wg.Add(1)
			go c.nudge(l, c.blk)
		}
	}
}

// processListBack moves the rooms back to the client's one wake list
// once another program's value there is gone: the scripts push there
// again as soon as it is. It looks at most once per listenTimeout, and
// reports whether it moved them.
func (c *Waits) processListBack(blk backend.Backend) bool {
	c.Mu.Lock()
	due := c.OwnLists && time.Since(c.ownChecked) >= listenTimeout
	if due {
		c.ownChecked = time.Now()
	}
	c.Mu.Unlock()
	if !due {
		return false
	}
	ctx, cancel := context.WithTimeout(c.Closing, c.WaiterTTL)
	defer cancel()
	list := c.ProcessList()
	types, err := TypesScript.On(ctx, blk, []string{list}).Strings()
	if err != nil || len(types) != 1 || types[0] != "none" && types[0] != "list" {
		return false
	}
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if !c.OwnLists {
		return false
	}
	c.UseListsLocked(false)
	c.Logf(slog.LevelInfo, "fairlock: the client's wake list no longer holds another program's value; its grants arrive there again",
		nil, "", slog.String("key", list))
	return true
}

// sweepLocked stops the rooms of l that have had no waiter for
// listenTimeout, looking at most four times per listenTimeout. c.mu is
// held.
func (c *Waits) sweepLocked(l *Listener) {
	now := time.Now()
	if now.Sub(l.swept) < listenTimeout/4 {
		return
	}
	l.swept = now
	for base, r := range l.Rooms {
		switch {
		case len(r.Waiters) > 0:
			r.idleSince = time.Time{}
		case r.idleSince.IsZero():
			r.idleSince = now
		case now.Sub(r.idleSince) >= listenTimeout:
			delete(l.Rooms, base)
			if l.Wakes[r.WakeKey]--; l.Wakes[r.WakeKey] <= 0 {
				delete(l.Wakes, r.WakeKey)
				delete(l.foreign, r.WakeKey)
				l.keys = nil
			}
			c.StopRoomLocked(r)
		}
	}
}

// dropListenerLocked stops l's remaining rooms and forgets l. c.mu is held.
func (c *Waits) dropListenerLocked(l *Listener) {
	for _, r := range l.Rooms {
		c.StopRoomLocked(r)
	}
	l.Rooms, l.Wakes = nil, nil
	ls := c.Listeners[l.group]
	for i, x := range ls {
		if x == l {
			ls = append(ls[:i:i], ls[i+1:]...)
			break
		}
	}
	if len(ls) == 0 {
		delete(c.Listeners, l.group)
	} else {
		c.Listeners[l.group] = ls
	}
}

// isClosed reports whether Close has begun.
func (c *Waits) isClosed() bool {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	return c.Closed
}

// drainBatch is the most wake-ups one read takes (BLMPOP's count, drain's
// LPOP count).
const drainBatch = 128

// blockingPop waits up to listenTimeout for entries on the first non-empty
// list of keys and returns them, or no key when none came. Where the
// server has BLMPOP, one command takes up to drainBatch entries (many is
// true: there is nothing to drain); where it does not (Redis 6.2,
// miniredis), the client falls back to BLPOP for good, one entry, which
// drain follows.
//
// The read's context ends a waiter TTL after its timeout, or when c
// closes: a client that gives a blocking read no deadline of its own
// (rueidis, valkey-go) cannot hang on a Redis that stopped answering, nor
// keep Close waiting for it.
func (c *Waits) blockingPop(blk backend.Backend, keys []string) (key string, vals []string, many bool, err error) {
	ctx, cancel := context.WithTimeout(c.Closing, listenTimeout+c.WaiterTTL)
	defer cancel()
	if !c.noBLMPop.Load() {
		key, vals, err = blk.BlockingPop(ctx, listenTimeout, drainBatch, keys)
		if err == nil || !fault.Unsupported(err) {
			return key, vals, true, err
		}
		c.noBLMPop.Store(true)
	}
	key, vals, err = blk.BlockingPop(ctx, listenTimeout, 0, keys)
	return key, vals, false, err
}

// drain hands on every wake-up already waiting on wake list key, many per
// command: after a release granted thousands of one process's waiters,
// their wake-ups arrive together, and one BLPOP each would cost a round
// trip each. A failure leaves them to the next BLPOP.
func (c *Waits) drain(blk backend.Backend, key string) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), c.WaiterTTL)
		got, err := blk.Pop(ctx, key, drainBatch)
		cancel()
		if err != nil {
			return
		}
		for _, p := range got {
			c.deliverGrant(p)
		}
		if len(got) < drainBatch {
			return
		}
	}
}
