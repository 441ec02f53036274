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
//     permits they hold, nq the members of :q, nc those of the
//     condition variables' keys; :d holds exactly the waiters of :q and of
//     the conditions; a queued ticket has no field in the state hash (its
//     member in :q is its record), nor has the holder kept in the hash
//     (o is its record); every waiter's process has its liveness field
//     (LiveField) in the state hash;
//   - the bounds hmin and dmin are no later than the earliest expiry in :h
//     and the earliest deadline in :d;
//   - each key lives at least as long as what it records: :h its latest
//     lease expiry, :d its latest deadline, :q and each condition's key
//     the latest deadline of their waiters, :s all of those and the token
//     sequence (until Redis's clock passes the last token, and a second
//     more), :s and :t every tombstone (so that a call sent again finds
//     it for as long as it is kept);
//   - a semaphore with nothing held, queued or waiting on a condition
//     keeps only :s and :t, and those no longer than its tombstones and
//     its sequence need, or the moment it went idle, plus IdleMs;
//   - after a queue run that left no work (Purged), no lease or waiter
//     whose time had come by then is left in :h or :d.
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
	// Bases are the semaphores' key bases (keys.base: the prefix and the
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

// condMark is what follows a semaphore's base in the keys of its
// condition variables: the library's derived keys are base, U+001F, a
// kind ("c"), U+001F and a payload (the condition's name; keys.go's
// derived), so <base>␟c␟ is the default condition's (the one named "")
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
	// Waiters on a condition: those in its key, and those whose key has
	// expired with them in it. A condition's key outlives its waiters'
	// deadlines but not, as :d does, the keys' later moves: a waiter dead
	// since (its deadline in :d passed, not yet dropped) may have lost
	// it, and still counts until a script drops it by :d.
	nc := 0
	inKey := map[string]bool{}
	for _, c := range conds {
		nc += len(c)
		for _, z := range c {
			inKey[z.Member.(string)] = true
		}
	}
	for _, z := range q {
		inKey[z.Member.(string)] = true
	}
	for _, z := range d {
		m := z.Member.(string)
		if inKey[m] {
			continue
		}
		ticket, _, _ := strings.Cut(m, " ")
		mark := st[ticket]
		if int64(z.Score) > now || !strings.HasPrefix(mark, "c") {
			return fmt.Errorf("waiter %q (deadline %d, now %d, marked %q) is in no queue: only a dead waiter on a condition may have lost its condition's key", m, int64(z.Score), now, mark)
		}
		if key := b + condMark + mark[1:]; slices.Contains(condKeys, key) {
			return fmt.Errorf("waiter %q on the condition key %s, which exists, is not in it", m, key)
		}
		nc++
	}
	if num("nh") != int64(len(holders)) || num("used") != used || num("nq") != int64(len(q)) || num("nc") != int64(nc) {
		return fmt.Errorf("state counts nh %s used %s nq %s nc %s; the keys hold %d leases of %d permits, %d queued, %d on conditions",
			st["nh"], st["used"], st["nq"], st["nc"], len(holders), used, len(q), nc)
	}
	for _, f := range []string{"used", "nh", "nq", "nc", "tnext"} {
		if v, ok := st[f]; ok && v == "0" {
			return fmt.Errorf("the state hash keeps %s 0 (a count that is 0 is left out)", f)
		}
	}
	deadline := make(map[string]int64, len(d))
	dmax, dmin := int64(0), int64(math.MaxInt64)
	for _, z := range d {
		deadline[z.Member.(string)] = int64(z.Score)
		dmax, dmin = max(dmax, int64(z.Score)), min(dmin, int64(z.Score))
	}
	if len(d) != len(q)+nc {
		return fmt.Errorf(":d holds %d deadlines for %d waiters (%d queued, %d on conditions)", len(d), len(q)+nc, len(q), nc)
	}
	// Each waiter's deadline, and the latest of a key's waiters.
	waiters := func(key string, zs []redis.Z) (int64, error) {
		var last int64
		for _, z := range zs {
			m := z.Member.(string)
			at, ok := deadline[m]
			if !ok {
				return 0, fmt.Errorf("waiter %q of %s has no deadline", m, key)
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
	// Every waiter's process has its liveness field (LiveField).
	for j, zs := range append([][]redis.Z{q}, conds...) {
		key := Q
		if j > 0 {
			key = condKeys[j-1]
		}
		for _, z := range zs {
			f := strings.Fields(z.Member.(string))
			if len(f) < 5 {
				return fmt.Errorf("waiter %q of %s has a bad form", z.Member, key)
			}
			v, ok := st[LiveField(f[2])]
			if !ok {
				return fmt.Errorf("waiter %q of %s: its process %s has no liveness field", z.Member, key, f[2])
			}
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				return fmt.Errorf("the liveness field of process %s is %q", f[2], v)
			}
		}
	}
	// Bounds.
	if v, ok := st["hmin"]; ok && len(h) > 0 && num("hmin") > hmin {
		return fmt.Errorf("hmin %s is later than the earliest lease expiry %d", v, hmin)
	}
	if v, ok := st["dmin"]; ok && len(d) > 0 && num("dmin") > dmin {
		return fmt.Errorf("dmin %s is later than the earliest waiter deadline %d", v, dmin)
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
		{D, "its latest waiter deadline", dmax},
		{Q, "its latest waiter's deadline", qmax},
		{S, "the latest lease expiry", hmax},
		{S, "the latest waiter deadline", dmax},
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
		if len(d) > 0 && dmin <= purged {
			return fmt.Errorf("a waiter whose deadline passed at %d is still there after a queue run at %d", dmin, purged)
		}
	}
	return nil
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
