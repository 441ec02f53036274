// Package statecheck checks the invariants of a semaphore's keys in Redis
// at any moment, not only once everything is released: the model-based
// tests call Check after every step, so that a rule broken while
// processes hold and wait (a key left without a TTL, a count that drifted
// from its sorted set, a dead waiter left behind) is seen when it happens.
//
// The invariants are the design's (docs/design.md, queue.lua's key layout,
// rules.lua's keys_exp and expiring), stated on what Redis holds:
//
//   - every key under the prefix has a TTL;
//   - every state hash says its layout (Layout);
//   - the state hash's counts are its holders': nh the members of :h
//     and the holder kept in the hash (o, with its expiry oe), used the
//     permits they hold, nq the members of :q, nc the tickets marked
//     waiting on a condition (each in its condition's key while that key
//     exists); a queued ticket has no field in the state hash (its member
//     in :q is its record), nor has the holder kept in the hash (o is its
//     record); every waiter's process has its liveness field (LiveField,
//     "deadline born": a waiter older than born is dead); the third key
//     (:d in layouts 1 and 2) holds nothing, and no dmin is kept;
//   - the bounds hmin and lmin are no later than the earliest expiry in :h
//     and the earliest deadline of a live waiter;
//   - each key lives at least as long as what it records: :h its latest
//     lease expiry, :q and each condition's key the latest deadline of
//     their waiters, :s all of those and the token sequence (until Redis's
//     clock passes the last token, and a second more), :s and :t every
//     tombstone (so that a call sent again finds it for as long as it is
//     kept);
//   - a semaphore with nothing held, queued or waiting on a condition
//     keeps only :s and :t, and those no longer than its tombstones and
//     its sequence need, or the moment it went idle, plus IdleMs;
//   - after a queue run that left no work (Purged), no lease whose time
//     had come by then is left, nor a queue's head whose process's
//     deadline had passed by then, unless the semaphore is full (a queue
//     run reads no waiter then: dead waiters leave as they reach the
//     head).
package statecheck

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// TombMs is a tombstone's longest life (queue.lua's TOMB_MS); it lives at
// least half of it.
const TombMs = 20000

// IdleMs is how long past its need an idle semaphore's state may live
// (queue.lua's IDLE_MS).
const IdleMs = 120000

// Layout is the layout every state hash names (queue.lua's LAYOUT).
const Layout = "3"

// State says what Check is to check.
type State struct {
	// Prefix: every key that starts with it must have a TTL.
	Prefix string
	// Bases are the semaphores' key bases (keyspace.Keys.Base: the prefix and the
	// hash-tagged name): each one's keys are checked.
	Bases []string
	// Purged, when not zero, is a time (Redis's clock, ms) at or before
	// which a queue run of every base began and that ended with no work
	// left: no lease or waiter due by then may remain.
	Purged int64
	// At, when not zero, is the moment (ms) to check the keys at, on a
	// clock other than the server's, each key's expiry then read as its
	// PEXPIRETIME less Shift: a replay's database (internal/differential),
	// whose scripts run at recorded moments and set their keys to expire
	// Shift ms past what they meant.
	At, Shift int64
}

// LiveField names the field of a state hash that holds the liveness
// deadline of process client's waiters (members.lua's live_field).
func LiveField(client string) string { return "l\x1f" + client }

// parseLive reads a liveness field's value, "deadline born" (members.lua's
// live_value): the waiters of the process that joined at sequence born or
// later live until deadline (ms); older ones are dead.
func ParseLive(v string) (at, born int64, ok bool) {
	a, b, found := strings.Cut(v, " ")
	if !found {
		return 0, 0, false
	}
	at, err1 := strconv.ParseInt(a, 10, 64)
	born, err2 := strconv.ParseInt(b, 10, 64)
	return at, born, err1 == nil && err2 == nil
}

// condMark is what follows a semaphore's base in the keys of its
// condition variables: the library's derived keys are base, U+001F, a
// kind ("c"), U+001F and a payload (the condition's name;
// keyspace.Keys.Derived), so <base>␟c␟ is the default condition's (the one named "")
// and <base>␟c␟<name> the condition name's.
const condMark = "\x1fc\x1f"

// maxReads bounds Check's tries at one consistent read (see Check).
const maxReads = 20

// Check returns the first invariant that Redis's keys break, or nil. It
// reads each base's keys, every condition variable's among them, in one
// transaction, so that scripts running meanwhile are seen whole or not at
// all. The condition keys it reads are those found under s.Prefix before
// the transaction; the transaction lists the keys again, and if the
// condition keys it finds are not those it read (a script made or
// dropped one in between), Check reads again. Every base must be under
// s.Prefix.
func Check(ctx context.Context, rdb redis.Cmdable, s State) error {
	for _, b := range s.Bases {
		if !strings.HasPrefix(b, s.Prefix) {
			return fmt.Errorf("base %q is not under the prefix %q", b, s.Prefix)
		}
	}
	known, err := rdb.Keys(ctx, globEscape(s.Prefix)+"*").Result()
	if err != nil {
		return err
	}
	for range maxReads {
		again, keys, err := check(ctx, rdb, s, condKeysOf(s.Bases, known))
		if !again {
			return err
		}
		known = keys
	}
	return fmt.Errorf("the condition keys changed under each of %d reads", maxReads)
}

// condKeysOf returns, for each base, the keys among keys of its condition
// variables, sorted.
func condKeysOf(bases, keys []string) [][]string {
	out := make([][]string, len(bases))
	for i, b := range bases {
		for _, k := range keys {
			if strings.HasPrefix(k, b+condMark) {
				out[i] = append(out[i], k)
			}
		}
		slices.Sort(out[i])
	}
	return out
}

// globEscape escapes the characters that KEYS's pattern gives a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\*?[]^-`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// check is one try of Check, reading condKeys[i] as base i's condition
// keys. If the transaction found other condition keys, it returns again
// and the keys it found, to read again.
func check(ctx context.Context, rdb redis.Cmdable, s State, condKeys [][]string) (again bool, keys []string, err error) {
	type read struct {
		st                 *redis.MapStringStringCmd
		q, d, h, t         *redis.ZSliceCmd
		ts, tq, td, th, tt *redis.DurationCmd
		c                  []*redis.ZSliceCmd   // of condKeys[i]
		tc                 []*redis.DurationCmd // of condKeys[i]
	}
	reads := make([]read, len(s.Bases))
	tx := rdb.TxPipeline()
	// A key's expiry: its time to live, from the server's clock, or on
	// another clock (At) its moment.
	expiryOf := tx.PTTL
	if s.At != 0 {
		expiryOf = tx.PExpireTime
	}
	clock := tx.Time(ctx)
	all := tx.Keys(ctx, globEscape(s.Prefix)+"*")
	for i, b := range s.Bases {
		r := &reads[i]
		r.st = tx.HGetAll(ctx, b+":s")
		r.q = tx.ZRangeWithScores(ctx, b+":q", 0, -1)
		r.d = tx.ZRangeWithScores(ctx, b+":d", 0, -1)
		r.h = tx.ZRangeWithScores(ctx, b+":h", 0, -1)
		r.t = tx.ZRangeWithScores(ctx, b+":t", 0, -1)
		r.ts, r.tq, r.td = expiryOf(ctx, b+":s"), expiryOf(ctx, b+":q"), expiryOf(ctx, b+":d")
		r.th, r.tt = expiryOf(ctx, b+":h"), expiryOf(ctx, b+":t")
		for _, k := range condKeys[i] {
			r.c = append(r.c, tx.ZRangeWithScores(ctx, k, 0, -1))
			r.tc = append(r.tc, expiryOf(ctx, k))
		}
	}
	if _, err := tx.Exec(ctx); err != nil && err != redis.Nil {
		return false, nil, err
	}
	keys = all.Val()
	for i, found := range condKeysOf(s.Bases, keys) {
		if !slices.Equal(found, condKeys[i]) {
			return true, keys, nil
		}
	}
	now := clock.Val().UnixMilli()
	if s.At != 0 {
		now = s.At
	}
	// Every key has a TTL (read after the transaction: a script is
	// atomic, so no key is ever seen between its write and its TTL).
	pipe := rdb.Pipeline()
	ttls := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		ttls[i] = pipe.PTTL(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
		return false, nil, err
	}
	for i, k := range keys {
		if ttls[i].Val() == -1 {
			return false, nil, fmt.Errorf("key %s has no TTL", k)
		}
	}
	for i, b := range s.Bases {
		r := reads[i]
		// A key's expiry, as late as it can be (for the times it must
		// reach) and as early (for those it must not pass), allowing a
		// millisecond for the clock to move within the transaction; 0
		// if absent.
		late, early := map[string]int64{}, map[string]int64{}
		ttlOf := map[string]*redis.DurationCmd{b + ":s": r.ts, b + ":q": r.tq, b + ":d": r.td, b + ":h": r.th, b + ":t": r.tt}
		for j, k := range condKeys[i] {
			ttlOf[k] = r.tc[j]
		}
		for k, c := range ttlOf {
			switch ttl := c.Val(); {
			case ttl == -1:
				return false, nil, fmt.Errorf("key %s has no TTL", k)
			case ttl >= 0:
				at := now + ttl.Milliseconds()
				if s.At != 0 {
					at = ttl.Milliseconds() - s.Shift
				}
				late[k], early[k] = at+1, at-1
			}
		}
		var conds [][]redis.Z
		for _, c := range r.c {
			conds = append(conds, c.Val())
		}
		if err := checkBase(b, r.st.Val(), r.q.Val(), r.d.Val(), r.h.Val(), r.t.Val(), condKeys[i], conds, late, early, now, s.Purged); err != nil {
			return false, nil, fmt.Errorf("%s: %w", b, err)
		}
	}
	return false, nil, nil
}

func checkBase(b string, st map[string]string, q, d, h, t []redis.Z, condKeys []string, conds [][]redis.Z, late, early map[string]int64, now, purged int64) error {
	S, Q, D, H, T := b+":s", b+":q", b+":d", b+":h", b+":t"
	num := func(f string) int64 {
		n, _ := strconv.ParseInt(st[f], 10, 64)
		return n
	}
	if len(st) == 0 {
		for _, k := range append([]string{Q, D, H}, condKeys...) {
			if late[k] != 0 {
				return fmt.Errorf("key %s outlives the state hash", k)
			}
		}
		return nil
	}
	if st["layout"] != Layout {
		return fmt.Errorf("state hash says layout %q, want %q", st["layout"], Layout)
	}
	// Counts. hmin is :h's earliest expiry, first the earliest of all.
	var used int64
	hmax, hmin, hmaxH := int64(0), int64(math.MaxInt64), int64(0)
	holders := h
	if o, ok := st["o"]; ok {
		oe, err := strconv.ParseInt(st["oe"], 10, 64)
		if err != nil {
			return fmt.Errorf("the holder kept in the state hash, %q, has expiry %q", o, st["oe"])
		}
		holders = append([]redis.Z{{Member: o, Score: float64(oe)}}, h...)
		// Its member is its record: its ticket has no field.
		ticket, _, _ := strings.Cut(o, " ")
		if v, ok := st[ticket]; ok {
			return fmt.Errorf("the holder kept in the state hash, %q, has a field %q of its ticket", o, v)
		}
	} else if _, ok := st["oe"]; ok {
		return fmt.Errorf("the state hash has an expiry oe %s and no holder o", st["oe"])
	}
	first := int64(math.MaxInt64)
	for i, z := range holders {
		f := strings.Fields(z.Member.(string))
		if len(f) != 4 {
			return fmt.Errorf("holder %q has a bad form", z.Member)
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		used += n
		hmax, first = max(hmax, int64(z.Score)), min(first, int64(z.Score))
		if i > 0 || len(holders) == len(h) {
			hmin, hmaxH = min(hmin, int64(z.Score)), max(hmaxH, int64(z.Score))
		}
	}
	// The third key (:d in layouts 1 and 2) is unused.
	if len(d) > 0 || late[D] != 0 {
		return fmt.Errorf("key %s holds %d members: layout %s keeps nothing there", D, len(d), Layout)
	}
	// Liveness fields (LiveField): "deadline born" each.
	type live struct{ at, born int64 }
	lives := map[string]live{}
	for f, v := range st {
		client, ok := strings.CutPrefix(f, LiveField(""))
		if !ok {
			continue
		}
		at, born, ok := ParseLive(v)
		if !ok {
			return fmt.Errorf("the liveness field of process %s is %q", client, v)
		}
		lives[client] = live{at, born}
	}
	zq := num("zq")
	// deadlineOf returns a waiter's deadline: its process's, unless it is
	// older than its process's field (then it is dead: 0).
	deadlineOf := func(key string, z redis.Z) (int64, error) {
		f := strings.Fields(z.Member.(string))
		if len(f) < 5 {
			return 0, fmt.Errorf("waiter %q of %s has a bad form", z.Member, key)
		}
		l, ok := lives[f[2]]
		if !ok && int64(z.Score) >= zq {
			return 0, fmt.Errorf("waiter %q of %s (from zq %d on): its process %s has no liveness field", z.Member, key, zq, f[2])
		}
		// (Older ones may have lost theirs: a field found dead goes.)
		if !ok || int64(z.Score) < l.born {
			return 0, nil
		}
		return l.at, nil
	}
	// Waiters on a condition: those in its key, each marked with it in
	// the state hash; a mark counts its waiter (nc) while the condition's
	// key exists with it, or after the key expired with it in it (a key
	// outlives its waiters' deadlines, not the keys' later moves).
	marks := map[string]string{} // ticket -> condition key
	for f, v := range st {
		if len(f) > 0 && (f[0] < 'a' || f[0] > 'z') && strings.HasPrefix(v, "c") {
			marks[f] = b + condMark + v[1:]
		}
	}
	inCond := map[string]bool{} // ticket -> in its condition's key
	for j, c := range conds {
		for _, z := range c {
			ticket, _, _ := strings.Cut(z.Member.(string), " ")
			if marks[ticket] != condKeys[j] {
				return fmt.Errorf("waiter %q of %s is marked %q", z.Member, condKeys[j], st[ticket])
			}
			inCond[ticket] = true
		}
	}
	// (A mark whose waiter is in no key counts too: its condition's key
	// expired with it, and may have been made again since by another
	// waiter; its refresh or leave drops it.)
	nc := len(marks)
	if num("nh") != int64(len(holders)) || num("used") != used || num("nq") != int64(len(q)) || num("nc") != int64(nc) {
		return fmt.Errorf("state counts nh %s used %s nq %s nc %s; the keys hold %d leases of %d permits, %d queued, %d on conditions",
			st["nh"], st["used"], st["nq"], st["nc"], len(holders), used, len(q), nc)
	}
	for _, f := range []string{"used", "nh", "nq", "nc", "tnext"} {
		if v, ok := st[f]; ok && v == "0" {
			return fmt.Errorf("the state hash keeps %s 0 (a count that is 0 is left out)", f)
		}
	}
	// The latest deadline of a key's waiters.
	waiters := func(key string, zs []redis.Z) (int64, error) {
		var last int64
		for _, z := range zs {
			at, err := deadlineOf(key, z)
			if err != nil {
				return 0, err
			}
			last = max(last, at)
		}
		return last, nil
	}
	qmax, err := waiters(Q, q)
	if err != nil {
		return err
	}
	for _, z := range q {
		ticket, _, _ := strings.Cut(z.Member.(string), " ")
		if v, ok := st[ticket]; ok {
			return fmt.Errorf("queued ticket %s has a field %q in the state hash", ticket, v)
		}
	}
	// Bounds.
	if v, ok := st["hmin"]; ok && len(h) > 0 && num("hmin") > hmin {
		return fmt.Errorf("hmin %s is later than the earliest lease expiry %d", v, hmin)
	}
	if v, ok := st["dmin"]; ok {
		return fmt.Errorf("the state hash keeps dmin %s (layout %s has no :d)", v, Layout)
	}
	// lmin is no later than any live waiter's deadline.
	if v, ok := st["lmin"]; ok && len(q)+nc > 0 {
		lmin := num("lmin")
		for j, zs := range append([][]redis.Z{q}, conds...) {
			key := Q
			if j > 0 {
				key = condKeys[j-1]
			}
			for _, z := range zs {
				if at, _ := deadlineOf(key, z); at > now && at < lmin {
					return fmt.Errorf("lmin %s is later than waiter %q's deadline %d", v, z.Member, at)
				}
			}
		}
	}
	// A waiter from zq on (queued or on a condition) is alive while lmin
	// is not due, with nothing more read (a release hands on to it so):
	// its process has a field that counts it, with a deadline lmin
	// bounds.
	for _, z := range slices.Concat(append([][]redis.Z{q}, conds...)...) {
		if int64(z.Score) < zq {
			continue
		}
		f := strings.Fields(z.Member.(string))
		l, ok := lives[f[2]]
		switch {
		case !ok:
			return fmt.Errorf("waiter %q (from zq %d on) has no liveness field", z.Member, zq)
		case int64(z.Score) < l.born:
			return fmt.Errorf("waiter %q (from zq %d on) is older than its process's field (born %d)", z.Member, zq, l.born)
		case st["lmin"] != "" && l.at < num("lmin"):
			return fmt.Errorf("waiter %q (from zq %d on) has deadline %d, before lmin %s", z.Member, zq, l.at, st["lmin"])
		}
	}
	// TTLs cover what the keys record.
	covers := func(key string, at int64, what string) error {
		if at > 0 && late[key] < at {
			return fmt.Errorf("key %s expires at %d, before %s at %d", key, late[key], what, at)
		}
		return nil
	}
	var tmax int64
	for _, z := range t {
		tmax = max(tmax, int64(z.Score))
	}
	seqNeed := int64(0)
	if seq := num("seq"); seq > 0 {
		seqNeed = seq/1000 + 1000
	}
	for _, c := range []struct {
		key, what string
		at        int64
	}{
		{H, "its latest lease expiry", hmaxH},
		{Q, "its latest waiter's deadline", qmax},
		{S, "the latest lease expiry", hmax},
		{S, "its latest queued waiter's deadline", qmax},
		{S, "the token sequence's end", seqNeed},
		{S, "its latest tombstone", tmax},
		{T, "its latest tombstone", tmax},
	} {
		if err := covers(c.key, c.at, c.what); err != nil {
			return err
		}
	}
	for j, key := range condKeys {
		last, err := waiters(key, conds[j])
		if err != nil {
			return err
		}
		if err := covers(key, last, "its latest waiter's deadline"); err != nil {
			return err
		}
		if err := covers(S, last, "the latest deadline of the waiters of "+key); err != nil {
			return err
		}
	}
	// An idle semaphore keeps only :s and :t, and those not for long.
	if len(holders) == 0 && len(q) == 0 && nc == 0 {
		for _, k := range append([]string{Q, D, H}, condKeys...) {
			if late[k] != 0 {
				return fmt.Errorf("key %s stays on an idle semaphore", k)
			}
		}
		bound := max(tmax, seqNeed, now) + IdleMs
		for _, k := range []string{S, T} {
			if e := early[k]; e != 0 && e > bound {
				return fmt.Errorf("key %s of an idle semaphore expires at %d, past %d (its tombstones' and sequence's need, or now, and IdleMs)", k, e, bound)
			}
		}
	}
	// Dead leases and waiters are gone after a queue run.
	if purged > 0 {
		if len(holders) > 0 && first <= purged {
			return fmt.Errorf("a lease that expired at %d is still held after a queue run at %d", first, purged)
		}
		// A queue runs past its dead heads unless it is full (a queue
		// run reads no waiter then).
		if len(q) > 0 && st["cap"] != "" && used < num("cap") {
			f := strings.Fields(q[0].Member.(string))
			if l, ok := lives[f[2]]; ok && int64(q[0].Score) >= l.born && l.at <= purged {
				return fmt.Errorf("the queue's head %q, whose process's deadline passed at %d, is still there after a queue run at %d with %d of %s permits used", q[0].Member, l.at, purged, used, st["cap"])
			}
		}
	}
	return nil
}

// WaiterDeadline returns the deadline (ms) of waiter member m, which
// joined at sequence seq, as its process's liveness field in the state
// hash st says (0: dead, older than the field, or before zq without one:
// a field found dead is deleted), and false when its process should have
// a field and has none, or m has a bad form.
func WaiterDeadline(st map[string]string, m string, seq int64) (int64, bool) {
	head, _, _ := strings.Cut(m, "\t")
	f := strings.Fields(head)
	if len(f) != 5 {
		return 0, false
	}
	v, ok := st[LiveField(f[2])]
	if !ok {
		zq, _ := strconv.ParseInt(st["zq"], 10, 64)
		return 0, seq < zq
	}
	at, born, ok := ParseLive(v)
	if !ok {
		return 0, false
	}
	if seq < born {
		return 0, true
	}
	return at, true
}

// Holders returns a semaphore's holders as Redis keeps them: the one in
// its state hash (fields o and oe), if any, then those of :h, each scored
// by its lease expiry (ms).
func Holders(ctx context.Context, rdb redis.Cmdable, base string) ([]redis.Z, error) {
	kept, err := rdb.HMGet(ctx, base+":s", "o", "oe").Result()
	if err != nil {
		return nil, err
	}
	var zs []redis.Z
	if o, ok := kept[0].(string); ok {
		oe, _ := kept[1].(string)
		at, err := strconv.ParseInt(oe, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("the holder kept in %s:s, %q, has expiry %q", base, o, oe)
		}
		zs = append(zs, redis.Z{Member: o, Score: float64(at)})
	}
	h, err := rdb.ZRangeWithScores(ctx, base+":h", 0, -1).Result()
	if err != nil {
		return nil, err
	}
	return append(zs, h...), nil
}
