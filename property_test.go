package fairlock

// Model-based property tests: a rapid state machine drives several
// simulated processes (one Client each) against one or two semaphores, with
// single requests and, given two semaphores, multi-requests for both, and
// checks, after every step, what Redis holds against a plain in-memory
// model: FIFO weighted semaphores with leases and liveness deadlines, where
// a multi-request is granted only when it heads both queues and fits in
// both.
//
// Time is Redis's clock: on miniredis it is frozen and moved only by the
// "advance" action, in chunks of at most half the shortest waiter TTL. After
// each chunk every live process renews its leases and refreshes its waiters
// synchronously, which is what a live process does in real time at a third
// of each TTL; a crashed process (its connection cut) does not. After every
// step an observer runs the queue once, as any waiting process's timer
// would, so the model may assume that whatever can be granted is granted.

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/halfrun"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/fairlock/fairlock/internal/wait"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

const (
	// On miniredis's frozen clock only the ratios of the machine's times
	// matter to the model; pScale sets their size, which is also real
	// time to the processes: a holder gives its lease up a TTL after its
	// last renewal by its own clock. Miniredis interprets every script
	// in Go, and under -race on two busy cores a renewal has been seen
	// to wait more than a second behind other scripts; at 4, it takes a
	// stall of over 2.6 s to lose a lease that Redis still holds.
	pScale  = 4
	pLease  = pScale * 1000 * time.Millisecond
	pWaiter = pScale * 600 * time.Millisecond
	// On miniredis each process draws its TTLs, so that entries joining
	// later can expire earlier than those before them (which the bounds on
	// the earliest expiry and deadline must follow).
	pLeaseMax  = pScale * 1500 * time.Millisecond
	pWaiterMax = pScale * 1200 * time.Millisecond
	pChunk     = pScale * 150 * time.Millisecond
	pWait      = 5 * time.Second // for an expected asynchronous grant
)

func TestPropertyFairSafe(t *testing.T) {
	// Miniredis interprets every script in Go, which the race detector
	// slows about fivefold: under -race the machines run from the
	// package's tests built without it, beside the other tests (the
	// client's goroutines meet the detector in the real-Redis machine).
	if redistest.OffRace(t) {
		return
	}
	// The machines run in two halves side by side, each on a miniredis of
	// its own (a machine moves its server's clock): the same count in
	// about half the time on two cores.
	n, _ := strconv.Atoi(flag.Lookup("rapid.checks").Value.String())
	setFlag(t, "rapid.checks", strconv.Itoa(max((n+1)/2, 1)))
	st := &propStats{}
	t.Cleanup(func() { st.log(t) }) // after both halves
	for i := range 2 {
		t.Run(fmt.Sprintf("half %d", i+1), func(t *testing.T) {
			t.Parallel()
			b := redistest.Mini(t)
			rapid.Check(t, func(rt *rapid.T) {
				runMachine(rt, b, mconfig{frozen: true, wait: pWait, maxCap: 8, crowd: 0, stats: st})
			})
		})
	}
}

// The same machine on a real redis-server, in real time: no clock moves and
// no crashes (whose timing real time would decide), TTLs long enough that
// nothing expires while a run lasts.
func TestPropertyRealRedis(t *testing.T) {
	b := redistest.RealBackend(t)
	halfrun.Check(t, b.Client(t), "*")
	n, _ := strconv.Atoi(flag.Lookup("rapid.checks").Value.String())
	setFlag(t, "rapid.checks", strconv.Itoa(max(n/10, 10)))
	st := &propStats{}
	rapid.Check(t, func(rt *rapid.T) { runMachine(rt, b, mconfig{wait: pWait, maxCap: 8, crowd: 6, stats: st}) })
	st.log(t)
}

// Show that the checker bites: each deliberately broken rule is caught,
// and rapid shrinks it to a short list of actions. The semaphore's rules
// here, the latch's and the barrier's in
// TestPropertyCatchesBrokenLatchAndBarrierRules: two tests, so that under
// -race their two children share the machine's cores.
func TestPropertyCatchesBrokenRules(t *testing.T) {
	catchBrokenRules(t, func(file string) bool { return !latchOrBarrier(file) })
}

func TestPropertyCatchesBrokenLatchAndBarrierRules(t *testing.T) {
	catchBrokenRules(t, latchOrBarrier)
}

func latchOrBarrier(file string) bool {
	return file == "lua/ops/latch.lua" || file == "lua/ops/barrier.lua"
}

// catchBrokenRules runs the catalogue's rules whose file pick takes.
func catchBrokenRules(t *testing.T, pick func(file string) bool) {
	redistest.Long(t)
	if redistest.Race {
		// The broken rules are Lua, caught by the checker; the race
		// detector checks Go code and only slows the thousands of
		// machines (about fivefold). Under -race they run in a test
		// binary of their own, built without it.
		redistest.RunWithoutRace(t)
		return
	}
	ran := 0
	for _, tc := range []struct {
		name, file, old, new string
		// Machines to try: 1,000 for a fast path's mutation (the
		// differential test catches each within about 60), 3,000 for
		// the checker's unless given. A run that catches the mutation
		// stops at the first machine that does, so a high cap costs time
		// only when the checker misses it. Of the checker's, an announced
		// grant's TTL and a signal waking the newest waiter take 50 to
		// 100 machines on average and were seen at 400; multi-request
		// barging, below, has the longest tail.
		checks int
		fast   bool // the call machine must see it: a fast path's copy of a rule, or a rule it checks
	}{
		// The fast paths (lua/fast.lua) must do exactly what the general
		// path does: each mutation breaks one fast path's use of a rule.
		// (checks -1: a written-out scenario, writtenOut: a dead head
		// before zq, which the machines seldom reach.)
		{"fast release hands on to a dead head", "lua/fast.lua",
			"      ok = (hw.client ~= client and hseq >= st[ZQ]) or waiter_alive(hseq, lat, born)\n", "      ok = true\n", -1, true},
		// (checks -1: a written-out scenario, writtenOut: a multi-request
		// at the head of a mutex's queue, which a release pops and must put
		// back. The random machines reach a popped head that is alive and
		// may not be served too seldom: one run missed it in 1,000.)
		{"a popped head not put back", "lua/fast.lua",
			"    redis.call('ZADD', K[KQ], hscore, head)\n", "\n", -1, true},
		// (checks -1: a written-out scenario, writtenOut: a head put back
		// whose key went with it.)
		{"a popped head put back without the keys' expiry", "lua/fast.lua",
			"    fast.expire(K[KQ], exp0)\n", "\n", -1, true},
		{"fast release trusts zq with the liveness bound due", "lua/fast.lua",
			"not trim_due(st[TNEXT]) and (nq + nc <= 0 or nothing_due(lmin))\n  local at = nil", "not trim_due(st[TNEXT])\n  local at = nil", 0, true},
		{"fast acquire writes a dead field anew without moving zq", "lua/fast.lua",
			"      if anew then f[k + 3], f[k + 4] = 'zq', ts end\n", "\n", 0, true},
		// (checks -1: a written-out scenario, writtenOut: a process
		// paused past its TTL that queues again.)
		{"a dead field written anew does not move zq", "lua/resource.lua",
			"    if anew then r.zq = math.max(r.zq, seq) end\n", "\n", -1, false},
		// The rule both of those follow: a dead field written anew says
		// so (live_write), broken for both paths at once.
		{"a dead field written anew is not told", "lua/rules.lua",
			"  if not alive(at) or born == nil then return seq, at ~= nil end\n", "  if not alive(at) or born == nil then return seq, false end\n", -1, false},
		// (checks -1: a written-out scenario, writtenOut: dead fields
		// the machines' checks allow either way.)
		{"dead liveness fields stay", "lua/resource.lua",
			"        d[#d + 1] = all[i]\n", "\n", -1, false},
		// (checks -1: written-out scenarios, writtenOut: another
		// program's mistakes, which the machines do not make.)
		{"a fast acquire takes a lost state for a new one", "lua/fast.lua",
			"  if ok and fresh and redis.call('EXISTS', K[KH], K[KQ]) > 0 then ok = false end\n", "\n", -1, true},
		{"a head popped from a state without the keys' expiry", "lua/fast.lua",
			"    if cap == 1 and exp0 > 0 then\n", "    if cap == 1 then\n", -1, true},
		{"a garbled liveness field reads as none", "lua/members.lua",
			"  if not at then return 0, 0 end\n", "\n", -1, false},
		// (checks -1: a written-out scenario, writtenOut: a lost state
		// hash.)
		{"a rebuilt state forgets its leases' expiry", "lua/resource.lua",
			"    r.horizon = math.max(r.horizon, tonumber(h[i + 1]) or 0)\n", "\n", -1, false},
		// (checks -1: a written-out scenario, writtenOut: a process
		// paused past its TTL that queues again. The machines took 207 of
		// them, 68 s, in one run.)
		{"a waiter before zq is taken alive unread", "lua/resource.lua",
			"not r.off and seq >= r.zq and nothing_due(r.lmin)", "not r.off and nothing_due(r.lmin)", -1, false},
		{"a waiter zq covers is taken alive with the liveness bound due", "lua/resource.lua",
			"seq >= r.zq and nothing_due(r.lmin) then return math.huge, 0 end", "seq >= r.zq then return math.huge, 0 end", 0, false},
		{"a dead field left out of lmin does not move zq", "lua/resource.lua",
			"        r.zq = math.max(r.zq, r.seq + 1)\n", "\n", 0, false},
		{"fast acquire does not lower the deadline bound", "lua/fast.lua",
			"    if lat then low = lowered(lmin, lat) end\n", "\n", 0, true},
		{"fast acquire barges", "lua/fast.lua",
			"  local grant = n and may_grant_now(nq, used, n, cap)\n", "  local grant = n and fits_in(used, n, cap)\n", 0, true},
		{"fast grant's TTL", "lua/fast.lua",
			"    ttl = grant_ttl(w.lease, w.wait, true)\n", "    ttl = grant_ttl(w.lease, w.wait, false)\n", 0, true},
		{"fast release leaves a tombstone", "lua/fast.lua",
			"  local f, d = {}, {}\n", "  local f, d = { ticket, ENDED }, {}\n", 0, true},
		{"fast handoff leaves the hash's place empty", "lua/fast.lua",
			"  local free = mine or not o\n", "  local free = mine\n", -1, true},
		{"fast release deletes an idle state that has tombstones", "lua/fast.lua",
			"  if idle and (st[TNEXT] or 0) > 0 and not idle_exp_known(exp0, seq) then return fast.defer(clock, S, st, a) end\n", "", 0, true},
		{"an idle release with tombstones keeps an expiry the latest decides", "lua/rules.lua",
			"    return exp >= need and exp <= math.max(need, now) + IDLE_MS\n", "    return true\n", 0, true},
		{"lean release with tombstones leaves the keys' expiry unchecked", "lua/fast.lua",
			"    if not idle_exp_known(exp0, seq) then return false end\n", "", 0, true},
		{"lean acquire grants beside a tombstone due to be trimmed", "lua/fast.lua",
			"  if row[7] and not (tnext and tnext > 0 and not trim_due(tnext)) then return nil end\n", "", 0, true},
		// Rules of the state's life and of the tombstones, which the call
		// machine checks after every call (its clock reaches expiries and
		// tombstones' ends far more often than whole clients do).
		{"a lease that ended unreleased leaves no tombstone", "lua/grant.lua",
			"  else\n    record(r, ticket, ENDED)\n", "  else\n    record(r, ticket, false)\n", 0, true},
		{"idle keys expire before their tombstones", "lua/resource.lua",
			"      r.horizon = math.max(r.horizon, tonumber(last[2]) or 0)\n", "", -1, false},
		// (checks -1: a written-out scenario, writtenOut.)
		{"fast acquire ignores ZADD NX's answer (a resend queues twice)", "lua/fast.lua",
			"    if redis.call('ZADD', K[KQ], 'NX', ts, member) == 0 then\n", "    if redis.call('ZADD', K[KQ], 'NX', ts, member) == 2 then\n", 0, true},
		{"fast release's idle TTL", "lua/fast.lua",
			"  local idle = not w and is_idle(nh - 1, nq, nc)\n", "  local idle = false\n", 0, true},
		// The lean paths, which decide the commonest calls from the
		// state row's strings before the fast paths convert it.
		// (Its check of the ticket's own field is not here: every record a
		// ticket keeps comes with a count or tnext the lean acquire also
		// checks, so breaking it alone changes nothing.)
		{"lean acquire grants with a waiter queued", "lua/fast.lua",
			"  if row[2] or row[3] or row[4] or row[9]", "  if row[2] or row[3] or row[9]", 0, true},
		{"lean acquire leaves the keys' TTL where it was", "lua/fast.lua",
			"  if exp == exp0 then\n", "  if true then\n", 0, true},
		{"lean release frees an expired lease", "lua/fast.lua",
			"  if not alive(tonumber(row[12])) then return false end\n", "", 0, true},
		{"lean release hands on to nobody with a waiter queued", "lua/fast.lua",
			"  if row[3] ~= '1' or row[4] or row[9]", "  if row[3] ~= '1' or row[9]", 0, true},
		// The rules themselves (lua/rules.lua and the general path), which
		// both paths share: the property checker must see each.
		{"barging", "lua/rules.lua",
			"  return nq <= 0 and fits_in(used, n, cap)\n", "  return fits_in(used, n, cap)\n", 0, false},
		// (checks -1: a written-out scenario, writtenOut. The machines
		// took 316 of them, 139 s, in one run.)
		{"announced grant lasts the lease TTL", "lua/rules.lua",
			"  if announced then return math.min(lease, wait) end\n", "", -1, false},
		{"permit lost on cancel", "release.lua",
			"      if unqueue(p.r, waiter_member(ticket, p.n, client, lease, wait, group), false) then result = 1 end\n",
			"      if unqueue(p.r, waiter_member(ticket, p.n, client, lease, wait, group), false) then result = 1 end\n      p.r.used = p.r.used + 1\n", 0, false},
		{"lease bound not lowered", "lua/resource.lua",
			// A grant announced to a process that then dies expires before
			// the leases around it. With the first lease kept in the state
			// hash, it matters only for a second lease in :h, which the
			// random machines reach too seldom to count on.
			"  r.hmin = lowered(r.hmin, at)\n", "\n", -1, false},
		{"multi-request barging", "lua/grant.lua",
			"    if not (fits(r, p.n) and head(r) == want) then\n", "    if not fits(r, p.n) then\n",
			// It takes three requests with the right sizes in the right
			// order; one machine in a few hundred draws them (21 runs:
			// median 97 machines, 4 past 900, the most 1,418).
			6000, false},
		{"multi-request partly granted", "lua/grant.lua",
			"      local ok, broken = ready(w)\n", "      local ok, broken = fits(r, w.n), false\n", 0, false},
		{"token not monotonic", "lua/rules.lua",
			"    return math.max(exact(seq) + 1, now_us)\n", "    return now_us\n", 0, false},
		// (checks -1: a written-out scenario, writtenOut. The machines
		// took 148 of them, 48 s, in one run.)
		{"signal wakes the newest waiter", "lua/cond.lua",
			"redis.call('ZRANGEBYSCORE', cv.C, '-inf', max, 'WITHSCORES', 'LIMIT', 0, limit + skip)",
			"redis.call('ZREVRANGEBYSCORE', cv.C, max, '-inf', 'WITHSCORES', 'LIMIT', 0, limit + skip)", -1, false},
		{"queued at the head", "lua/grant.lua",
			"  write('ZADD', r.Q, num(seq), m)\n", "  write('ZADD', r.Q, '1', m)\n", 0, false},
		{"liveness field not written by a process's first acquire", "lua/rules.lua",
			"  if at ~= nil and at >= now + wait then return nil, false end\n", "  if at == nil or at >= now + wait then return nil, false end\n", 0, false},
		{"condition waiter not refreshed", "lua/ops/refresh.lua",
			"      keep_alive(first, client, wait)\n      -- The condition's key", "      -- The condition's key", 0, false},
		{"condition waiter not a user of its mutex", "acquire.lua",
			"  if not r.cap or is_idle(r.nh, r.nq, r.nc) then\n", "  if not r.cap or is_idle(r.nh, r.nq, 0) then\n", 0, false},
		{"cancelled condition waiter stays", "release.lua",
			"        cond_drop(p.r, c, m)\n", "", 0, false},
		// Rules seen only while the machine runs, not once all is
		// released: checkState after every step must see each.
		{"queue key left without a TTL", "lua/rules.lua",
			"  if has_q and (moved or new_q) then f(K[KQ], x) end\n", "  if has_q and moved then f(K[KQ], x) end\n", 0, false},
		{"keys' horizon not moved by the lease kept in the state hash", "lua/grant.lua",
			"    r.o, r.oe = m, at\n    r.horizon = math.max(r.horizon, at)\n", "    r.o, r.oe = m, at\n", 0, false},
		{"the lease kept in the state hash is never purged", "lua/grant.lua",
			"  if r.o and due(r.oe) then\n", "  if false then\n", 0, false},
		// (checks -1: a written-out scenario, writtenOut: a process's
		// wait on one condition moves the keys' expiry past another's
		// key, which the machines reach seldom.)
		{"condition keys stay behind a move of the keys' expiry", "lua/resource.lua",
			"  if moved and r.nc > 0 then cond_keys_follow(r, at) end\n", "\n", -1, false},
		{"fast acquire moves the keys' expiry with condition waiters", "lua/fast.lua",
			"  if exp ~= exp0 and nc > 0 then return fast.defer(clock, S, st, a) end\n", "", 0, true},
		{"named condition's key expires before its waiters", "lua/resource.lua",
			"    if cv.wrote then expire_at(cv.C, at) end\n",
			"    if cv.wrote then expire_at(cv.C, cv.name == '' and at or num(now + 1)) end\n", 0, false},

		// A waiter's liveness is its process's field (rules.lua's
		// waiter_alive), checked where a waiter would be granted.
		{"liveness not checked at the grant", "lua/grant.lua",
			"          if waiter_alive(tonumber(page[r.pos + 1]), live_of(r, w.client, false, tonumber(page[r.pos + 1]))) then return m, w end\n",
			"          if true then return m, w end\n", 0, false},
		// (checks -1: a written-out scenario, writtenOut: a process's
		// late refresh, which the machines seldom send in two calls.)
		{"a late refresh keeps a dead queued waiter", "lua/ops/refresh.lua",
			"  elseif inq[k] and not waiter_alive(inq[k], lat, lborn) then\n", "  elseif false then\n", -1, false},
		// (checks -1: writtenOut. The machines caught it after 179 s and
		// 227 s in two runs, and missed it in 3,000 machines, 463 s, in a
		// third: since 3368bc0 a live process's field dies less often.)
		{"a refresh brings a dead process's waiters back", "lua/resource.lua",
			"    if not alive(at) or born == nil then return end\n", "    born = born or 0\n", -1, false},
		// (checks -1: a written-out scenario, writtenOut: a process
		// paused past its TTL that queues again.)
		{"a dead process's field written anew keeps its old waiters alive", "lua/rules.lua",
			"  if not alive(at) or born == nil then return seq, at ~= nil end\n", "  if born == nil then return seq, at ~= nil end\n", -1, false},
		// (checks -1: writtenOut: the field was written in the same
		// millisecond, before a release left the resource idle.)
		{"a liveness field left as it was does not keep the keys", "lua/resource.lua",
			"        r.horizon = math.max(r.horizon, at)\n      end\n      return\n", "      end\n      return\n", -1, false},
		// (checks -1: writtenOut: a process queues again under a third of
		// its waiter TTL after its field was written, then pauses.)
		{"a new waiter's liveness field is not moved on while young", "lua/rules.lua",
			"  if at ~= nil and at >= now + wait then return nil, false end\n",
			"  if at ~= nil and at >= now + wait - math.floor(wait / 3) then return nil, false end\n", -1, false},
		// The countdown latch's rules (lua/ops/latch.lua), which the
		// machine's latch model checks (property_latch_test.go).
		// (checks -1: writtenOut: the condition's key was made again
		// after it expired with a dead waiter's member in it.)
		{"a latch's opening keeps lost marks", "lua/ops/latch.lua",
			"    if budget > 0 and r.nc > 0 then purge_waiters(r) end\n", "\n", -1, false},
		// (checks -1: writtenOut: the marks cond_marks finds in the state
		// hash, read by the latch's purge and by a move of the keys' expiry.)
		{"condition marks unread by a latch's opening", "lua/members.lua",
			"    if b and (b < 97 or b > 122) and string.sub(v, 1, 1) == CONDITION then\n", "    if false then\n", -1, false},
		{"condition marks unread by a move of the keys' expiry", "lua/members.lua",
			"    if b and (b < 97 or b > 122) and string.sub(v, 1, 1) == CONDITION then\n", "    if false then\n", -1, false},
		{"latch count falls below 0", "lua/ops/latch.lua",
			"if count > 0 then count = count - 1 end\n", "count = count - 1\n", 0, false},
		{"latch opens before its count is 0", "lua/ops/latch.lua",
			"if count == 0 and r.nc > 0 then\n  -- Open:", "if r.nc > 0 then\n  -- Open:", 0, false},
		{"latch counts a resent count down again", "lua/ops/latch.lua",
			"if is_signalled(r.grant) then\n", "if false then\n", 0, false},
		{"latch wait on an open latch waits", "lua/ops/latch.lua",
			"  if count <= 0 then return { 0 } end\n", "  if count < 0 then return { 0 } end\n", 0, false},
		{"latch wait neither makes nor keeps the count", "lua/ops/latch.lua",
			"  cond_add(r, cv, ticket, 1, client, lease, wait)\n  keep_count(count)\n",
			"  cond_add(r, cv, ticket, 1, client, lease, wait)\n", 0, false},
		{"latch waiter dropped by its refresh while the count is above 0", "lua/ops/refresh.lua",
			"is_open = redis.call('HGET', first.base, 'count') == '0'", "is_open = true", 0, false},
		// The cyclic barrier's rules (lua/ops/barrier.lua), which the
		// call machine checks (differential_barrier_test.go).
		{"barrier completes a round before its last party", "lua/ops/barrier.lua",
			"if n + 1 >= parties then", "if n + 2 >= parties then", 0, true},
		{"barrier arrival joins a round that lost a party", "lua/ops/barrier.lua",
			"if not intact() then end_round(BROKEN, nil) end\n", "\n", 0, true},
		{"barrier break leaves its round running", "lua/ops/barrier.lua",
			"    end_round(BROKEN, ticket)\n    record(r, ticket, signalled(round - 1, 0, BROKEN, 0))\n",
			"    record(r, ticket, signalled(round, 0, BROKEN, 0))\n", 0, true},
		// (checks -1: a written-out scenario, writtenOut. The call
		// machines caught it after 534 in one run, missed it in 1,000 in
		// another, and took 160 s in a third; its twin below, on the
		// barrier model, is caught sooner.)
		{"barrier wakes a broken round's waiters completed", "lua/ops/barrier.lua",
			"wake(list, fallback, wake_entry(w.ticket, now, { num(outcome) }), w.wait)",
			"wake(list, fallback, wake_entry(w.ticket, now, { num(COMPLETED) }), w.wait)", -1, true},
		{"barrier status lists its waiters out of arrival order", "lua/ops/barrier.lua",
			"ipairs(redis.call('ZRANGE', cv.C, 0, -1))", "ipairs(redis.call('ZREVRANGE', cv.C, 0, -1))", 0, true},
		// The same rules, which the machine's barrier model checks
		// (property_barrier_test.go) through whole clients.
		{"barrier model: a round completes before its last party", "lua/ops/barrier.lua",
			"if n + 1 >= parties then", "if n + 2 >= parties then", 0, false},
		{"barrier model: a cancel leaves its round running", "lua/ops/barrier.lua",
			"    end_round(BROKEN, ticket)\n    record(r, ticket, signalled(round - 1, 0, BROKEN, 0))\n",
			"    record(r, ticket, signalled(round, 0, BROKEN, 0))\n", 0, false},
		{"barrier model: a broken round's parties woken completed", "lua/ops/barrier.lua",
			"wake(list, fallback, wake_entry(w.ticket, now, { num(outcome) }), w.wait)",
			"wake(list, fallback, wake_entry(w.ticket, now, { num(COMPLETED) }), w.wait)", 0, false},
		// A party whose process died, past its deadline, breaks its round
		// when a script notices: a live party's refresh (refresh.lua's
		// broken, whose party's re-ask breaks the round), the next arrival,
		// and a status read, which reports it and breaks nothing. (The
		// refresh's rule, in refresh.lua, runs with the semaphores' rules,
		// in TestPropertyCatchesBrokenRules.)
		{"barrier model: a live party's refresh counts a dead party alive", "lua/ops/refresh.lua",
			"          if waiter_alive(seqs[j], live_of(first, w.client, true)) then live = live + 1 end\n",
			"          live = live + 1\n", 0, false},
		{"barrier model: an arrival joins a round whose party died", "lua/ops/barrier.lua",
			"if not intact() then end_round(BROKEN, nil) end\n", "\n", 0, false},
		{"barrier model: a status read counts a dead party alive", "lua/ops/barrier.lua",
			"      if w and waiter_alive(seqs[i], live_of(r, w.client, false, seqs[i])) then live = live + 1 end\n",
			"      if w then live = live + 1 end\n", 0, false},
	} {
		if !pick(tc.file) {
			continue
		}
		ran++
		t.Run(tc.name, func(t *testing.T) {
			restore := breakScript(t, tc.file, tc.old, tc.new)
			defer restore()
			if tc.checks < 0 {
				// A rule the random machines reach too seldom: its
				// scenario, written out.
				if err := writtenOut[tc.name](t, mutate(tc.file, tc.old, tc.new)); err == nil {
					t.Fatalf("the scenario did not catch %s", tc.name)
				} else {
					t.Logf("caught %s: %v", tc.name, err)
				}
				return
			}
			setFlag(t, "rapid.nofailfile", "true")
			// The counterexample is logged, not checked: a short shrink.
			setFlag(t, "rapid.shrinktime", "4s")
			if tc.fast {
				// A broken fast path is seen as a difference from the
				// general path (TestFastPathsMatchGeneralPath's call
				// machine), on every backend.
				rec := &recorder{name: t.Name()}
				diffCalls(t, rec, cmp.Or(tc.checks, 1000), mutate(tc.file, tc.old, tc.new))
				if !rec.failed {
					t.Fatalf("the differential test did not catch %s", tc.name)
				}
				t.Logf("caught %s; shrunk counterexample:\n%s", tc.name, rec.report())
				return
			}
			setFlag(t, "rapid.steps", "12")
			setFlag(t, "rapid.checks", strconv.Itoa(cmp.Or(tc.checks, 3000)))
			rec := &recorder{name: t.Name()}
			b := redistest.Mini(t)
			// A grant the model expects and the broken rule withholds is
			// given up on sooner, so shrinking stays quick. Small
			// capacities make the queues contended, where rules matter.
			rapid.Check(rec, func(rt *rapid.T) {
				runMachine(rt, b, mconfig{frozen: true, wait: 300 * time.Millisecond, maxCap: 3})
			})
			if !rec.failed {
				t.Fatalf("the checker did not catch %s", tc.name)
			}
			t.Logf("caught %s; shrunk counterexample:\n%s", tc.name, rec.report())
		})
	}
	if ran == 0 {
		t.Fatal("no rule of the catalogue picked")
	}
}

// writtenOut are the scenarios of the catalogue's rules that the random
// machines reach too seldom, by the rule's name: each returns what broke.
var writtenOut = map[string]func(*testing.T, func(string) string) error{
	"idle keys expire before their tombstones": func(t *testing.T, _ func(string) string) error {
		return idleStateOutlivesTombstones(t)
	},
	"fast handoff leaves the hash's place empty":                      handoffToTheFreedPlace,
	"lease bound not lowered":                                         leaseBoundLowered,
	"a dead process's field written anew keeps its old waiters alive": deadProcessWaitersStayDead,
	"fast release hands on to a dead head":                            deadProcessWaitersStayDead,
	"a popped head put back without the keys' expiry":                 poppedHeadPutBack,
	"a popped head not put back":                                      poppedHeadPutBack,
	"dead liveness fields stay":                                       deadFieldsGo,
	"a rebuilt state forgets its leases' expiry":                      rebuiltStateKeepsItsKeys,
	"a late refresh keeps a dead queued waiter":                       refreshLeavesDeadWaitersDead,
	"a dead field written anew does not move zq":                      deadProcessWaitersStayDead,
	"a dead field written anew is not told":                           deadProcessWaitersStayDead,
	"a fast acquire takes a lost state for a new one":                 lostStateHashKeepsTheCapacity,
	"a garbled liveness field reads as none":                          garbageFieldWrittenAnewMovesZq,
	"a head popped from a state without the keys' expiry":             poppedHeadKeepsItsKeysTTL,
	"a refresh brings a dead process's waiters back":                  refreshLeavesADeadFieldDead,
	"a new waiter's liveness field is not moved on while young":       newWaiterLivesAWholeTTL,
	"a latch's opening keeps lost marks":                              latchOpensPastLostMarks,
	"condition marks unread by a latch's opening":                     latchOpensPastLostMarks,
	"condition marks unread by a move of the keys' expiry":            conditionKeysFollowTheKeysExpiry,
	"barrier wakes a broken round's waiters completed":                brokenRoundWakesItsPartiesBroken,
	"announced grant lasts the lease TTL":                             announcedGrantLastsTheWaiterTTL,
	"signal wakes the newest waiter":                                  signalWakesTheOldestWaiter,
	"a waiter before zq is taken alive unread":                        deadProcessWaitersStayDead,
	"a liveness field left as it was does not keep the keys":          queuedBehindAFreshFieldKeepsTheKeys,
	"condition keys stay behind a move of the keys' expiry":           conditionKeysFollowTheKeysExpiry,
}

// leaseBoundLowered runs, through the general path (fast paths off,
// scripts transformed by inner), a semaphore of capacity 3 held by three
// leases of 10 s: the first kept in the state hash, two in :h. A fourth
// waiter, whose process then dies, waits with a waiter TTL of 300 ms; one
// holder's release hands it the permit by announcement, so that its lease
// lasts 300 ms, earlier than every lease in :h. The bound hmin must be
// lowered to it (statecheck), and a fifth request made once it has expired
// must be granted at once. It returns what broke.
func leaseBoundLowered(t *testing.T, inner func(string) string) error {
	b := redistest.Mini(t)
	b.Freeze(t)
	ctx := context.Background()
	rdb := b.Client(t)
	prefix := redistest.Prefix(t)
	c, err := New(rdb, WithPrefix(prefix), testhook.Transform[Option](differential.Compose(inner, testhook.NoFastPaths)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base := prefix + "{lb}"
	keys := []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	run := func(args ...string) ([]any, error) {
		out, err := testhook.RunScript(ctx, c, args[0], keys, args)
		r, _ := out.([]any)
		return r, err
	}
	check := func(what string) error {
		if err := statecheck.Check(ctx, rdb, statecheck.State{Prefix: prefix, Bases: []string{base}}); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	tokens := map[string]string{}
	for _, p := range []string{"A", "B", "X"} {
		r, err := run("acquire", "T"+p, "P"+p, "10000", "3000", "", "1", "3")
		if err != nil || len(r) < 4 {
			t.Fatalf("acquire %s = %v, %v; want a grant", p, r, err)
		}
		tokens[p] = fmt.Sprint(r[3])
	}
	if r, err := run("acquire", "TC", "PC", "10000", "300", "", "1", "3"); err != nil || len(r) >= 4 {
		t.Fatalf("acquire C = %v, %v; want it queued", r, err)
	}
	b.Advance(t, 10*time.Millisecond)
	if _, err := run("release", "TX", "PX", "10000", "3000", "", "0", "1", tokens["X"]); err != nil {
		t.Fatal(err)
	}
	if err := check("after the grant announced to C"); err != nil {
		return err
	}
	b.Advance(t, 400*time.Millisecond) // C's process died: its lease is over
	r, err := run("acquire", "TD", "PD", "10000", "3000", "", "1", "3")
	if err != nil {
		t.Fatal(err)
	}
	if len(r) < 4 {
		return fmt.Errorf("D was queued (%v) though only two of the three permits are held by live leases", r)
	}
	return check("after D's acquisition")
}

// TestLeaseBoundLowered: see leaseBoundLowered.
func TestLeaseBoundLowered(t *testing.T) {
	if err := leaseBoundLowered(t, nil); err != nil {
		t.Fatal(err)
	}
}

// handoffToTheFreedPlace runs, on a pair of replayers (fast paths on and
// off, scripts transformed by inner), a semaphore of capacity 2 whose
// lease kept in the state hash is released while another lease, in :h,
// holds; the next waiter, asking for both permits, is then handed them
// by the :h lease's release, and takes the hash's free place. It returns
// the first difference between the paths.
func handoffToTheFreedPlace(t *testing.T, inner func(string) string) error {
	p := newReplayPair(t, false, inner)
	ctx := context.Background()
	now := time.Now().UnixMicro()
	keys := []string{"hf:{s}:s", "hf:{s}:q", "hf:{s}:d", "hf:{s}:h", "hf:{s}:t"}
	step := 0
	run := func(args ...string) (string, error) {
		step++
		now += 1000
		c := call{Keys: keys, Args: args, Time: []string{strconv.FormatInt(now/1e6, 10), strconv.FormatInt(now%1e6, 10)}}
		out, err := p.Step(ctx, c, step)
		if r, _ := out.([]any); len(r) > 3 {
			return fmt.Sprint(r[3]), err
		}
		return "0", err
	}
	a, err := run("acquire", "TA", "PA", "5000", "3000", "", "1", "2") // kept in the state hash
	if err != nil {
		return err
	}
	b, err := run("acquire", "TB", "PB", "5000", "3000", "", "1", "2") // in :h
	if err != nil {
		return err
	}
	if _, err := run("release", "TA", "PA", "5000", "3000", "", "0", "1", a); err != nil { // the place is free
		return err
	}
	if _, err := run("acquire", "TC", "PC", "5000", "3000", "", "2", "2"); err != nil { // queued: 2 do not fit
		return err
	}
	_, err = run("release", "TB", "PB", "5000", "3000", "", "0", "1", b) // hands both permits on
	return err
}

// TestHandoffToTheFreedPlace: see handoffToTheFreedPlace.
func TestHandoffToTheFreedPlace(t *testing.T) {
	if err := handoffToTheFreedPlace(t, nil); err != nil {
		t.Fatal(err)
	}
}

// idleStateOutlivesTombstones runs a semaphore that goes idle while its
// keys' TTL lies minutes ahead (a lease of minutes was granted) and a
// tombstone an earlier script wrote lives on: the release that leaves it
// idle moves the TTL down (keys_exp), and must keep the state, with the
// tombstone, until the tombstone's end. It returns what broke that.
func idleStateOutlivesTombstones(t *testing.T) error {
	b := redistest.Mini(t)
	b.Freeze(t)
	ctx := context.Background()
	rdb := b.Client(t)
	prefix := redistest.Prefix(t)
	client := func(ttl time.Duration) *Client {
		c, err := New(rdb, WithPrefix(prefix), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	req := Request{Name: "idle", Capacity: 2, Permits: 1}
	long, err := client(200*time.Second).Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	short := client(100 * time.Millisecond)
	if _, err := short.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	_ = short.Abandon() // its lease ends at its TTL, unreleased
	b.Advance(t, 200*time.Millisecond)
	other, err := client(10*time.Second).Acquire(ctx, req) // drops it: its tombstone
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := long.Release(ctx); err != nil { // idle now
		t.Fatal(err)
	}
	at, err := rdb.PExpireTime(ctx, prefix+"{idle}:s").Result()
	if err != nil {
		t.Fatal(err)
	}
	last, err := rdb.ZRangeWithScores(ctx, prefix+"{idle}:t", -1, -1).Result()
	if err != nil || len(last) != 1 {
		t.Fatalf("the tombstones' index %v (%v), want the dropped lease's", last, err)
	}
	if end := int64(last[0].Score); at.Milliseconds() < end {
		return fmt.Errorf("the idle state expires at %d, before its tombstone's end at %d", at.Milliseconds(), end)
	}
	return nil
}

// TestIdleStateOutlivesTombstones: see idleStateOutlivesTombstones.
func TestIdleStateOutlivesTombstones(t *testing.T) {
	if err := idleStateOutlivesTombstones(t); err != nil {
		t.Fatal(err)
	}
}

// setFlag sets a flag for the test's duration.
func setFlag(t *testing.T, name, value string) {
	old := flag.Lookup(name).Value.String()
	_ = flag.Set(name, value)
	t.Cleanup(func() { _ = flag.Set(name, old) })
}

// breakScript makes clients created until the returned function is called
// run a mutated copy of one script file.
func breakScript(t *testing.T, file, old, new string) func() {
	t.Helper()
	if !strings.Contains(script.Source(file), old) {
		t.Fatalf("%s no longer contains %q", file, old)
	}
	return setTestTransform(mutate(file, old, new))
}

// mutate returns a script transform that replaces old by new in one
// script file's text.
func mutate(file, old, new string) func(string) string {
	src := script.Source(file)
	broken := strings.Replace(src, old, new, 1)
	return func(s string) string { return strings.Replace(s, src, broken, 1) }
}

// recorder is a rapid.TB that records a failure instead of failing.
type recorder struct {
	name   string
	mu     sync.Mutex
	failed bool
	logs   []string
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return r.name }
func (r *recorder) Logf(f string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(f, a...))
}
func (r *recorder) Log(a ...any)             { r.Logf("%s", fmt.Sprint(a...)) }
func (r *recorder) Skipf(f string, a ...any) { r.Logf(f, a...) }
func (r *recorder) Skip(a ...any)            { r.Log(a...) }
func (r *recorder) SkipNow()                 {}
func (r *recorder) Errorf(f string, a ...any) {
	r.Logf(f, a...)
	r.Fail()
}
func (r *recorder) Error(a ...any)            { r.Errorf("%s", fmt.Sprint(a...)) }
func (r *recorder) Fatalf(f string, a ...any) { r.Errorf(f, a...) }
func (r *recorder) Fatal(a ...any)            { r.Error(a...) }
func (r *recorder) FailNow()                  { r.Fail() }
func (r *recorder) Fail() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
}
func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}
func (r *recorder) report() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, l := range r.logs {
		if !strings.HasPrefix(l, "[rapid] draw") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// cut is a go-redis hook that severs a client from Redis: a crash. A
// crash waits for the commands in flight, so none lands after it, as none
// can from a dead process. (BLPOPs only take wake-ups, and may block.)
type cut struct {
	mu       sync.Mutex
	drained  *sync.Cond // signalled when inflight falls to 0
	down     bool
	inflight int // commands under way, which crash waits for
}

var errCut = errors.New("property test: process crashed")

// crash cuts the process off: no command starts after it returns, and
// every command under way has ended. A command that opens a connection
// runs nested commands (HELLO) through the hook; they count as under way
// too, so no lock is held across a command and nothing waits in a cycle.
func (c *cut) crash() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = true
	for c.inflight > 0 {
		if c.drained == nil {
			c.drained = sync.NewCond(&c.mu)
		}
		c.drained.Wait()
	}
}

func (c *cut) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cut) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (c *cut) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		if c.down {
			c.mu.Unlock()
			cmd.SetErr(errCut)
			return errCut
		}
		if cmd.Name() == "blpop" || cmd.Name() == "blmpop" {
			// A blocked read may outlast the crash; its wake-up, if
			// any, goes unheard as a dead process's would.
			c.mu.Unlock()
			return next(ctx, cmd)
		}
		c.inflight++
		c.mu.Unlock()
		defer func() {
			c.mu.Lock()
			c.inflight--
			if c.inflight == 0 && c.drained != nil {
				c.drained.Broadcast()
			}
			c.mu.Unlock()
		}()
		return next(ctx, cmd)
	}
}

// The model.

type mstate int

const (
	idle mstate = iota
	waiting
	holding
	crashed
	latching   // waits on the machine's latch (property_latch_test.go)
	barriering // waits at the machine's barrier (property_barrier_test.go)
)

type actor struct {
	id    int
	c     *Client
	rdb   *redis.Client
	cut   *cut
	state mstate
	// The request in progress (waiting or holding): its parts in name
	// order; sem and n are the first part's.
	parts  []mpart
	sem    *msem
	n      int64
	cancel context.CancelFunc
	res    chan acqResult
	lease  *Lease
	ticket string
	crowd  *crowd   // the crowd it belongs to, or nil for a process of its own
	lw     *lwaiter // its Wait on the latch (latching)
	bw     *bwaiter // its Await on the barrier (barriering)
}

// A crowd is one process (one Client) with many requests at once, each of
// the same size on one semaphore: the way to reach hundreds or thousands of
// waiters, bulk grants and mass expiry. Its members are actors that share
// the Client; the solo actions never pick them.
type crowd struct {
	id      int
	c       *Client
	cut     *cut
	members []*actor
	crashed bool
}

type acqResult struct {
	l   *Lease
	err error
}

type mpart struct {
	s *msem
	n int64
}

// mentry is a waiter or a holder in the model: one part of a request.
type mentry struct {
	a      *actor
	s      *msem
	n      int64
	group  []*mentry // all parts of a multi-request; nil for a single one
	ticket string
	at     int64  // waiter: liveness deadline; holder: lease expiry (ms)
	cond   string // condition waiter: the condition variable's name
	dead   bool   // its process crashed
}

type msem struct {
	name    string
	cap     int64
	k       keyspace.Keys
	queue   []*mentry // arrival order
	holders []*mentry
	cond    []*mentry // waiters on its condition variables (see mconds), in order
	token   int64     // last token seen
}

// mconfig sets what one machine draws.
type mconfig struct {
	frozen bool          // clock and crashes under the test's control (miniredis)
	wait   time.Duration // for an expected asynchronous grant
	maxCap int64         // capacities are drawn up to maxCap
	// scale draws capacities up to 10,000 (with the sizes around Lua's
	// unpack limit of ~8,000 often) and permits biased to 1 and to the
	// whole capacity.
	scale bool
	crowd int // largest crowd; 0 for none
	// doom adds an action that fills a semaphore with a crowd's leases,
	// crashes it and waits in real time for them to expire together.
	doom  bool
	stats *propStats // sizes reached; may be nil
}

type machine struct {
	t       *rapid.T
	cfg     mconfig
	wait    time.Duration // for an expected asynchronous grant
	b       *redistest.Backend
	frozen  bool // clock and crashes under the test's control
	crowds  []*crowd
	seen    runStats
	now     time.Time
	prefix  string
	obs     *Client
	rdb     *redis.Client
	sems    []*msem
	latch   *mlatch
	barrier *mbarrier
	actors  []*actor
	byCID   map[string]*actor
	known   map[string]bool // tickets the model has learned
	clients []*Client
	calls   sync.WaitGroup // Acquire calls running in goroutines
	// purged is when (Redis's clock, ms) the observer's last queue run
	// began, which left no work: nothing due then may remain.
	purged int64
}

func (m *machine) nowMs() int64 { return m.now.UnixMilli() }

func (m *machine) logf(format string, args ...any) { m.t.Logf(format, args...) }

// runMachine runs one state machine.
func runMachine(rt *rapid.T, b *redistest.Backend, cfg mconfig) {
	m := &machine{t: rt, b: b, cfg: cfg, frozen: cfg.frozen, wait: cfg.wait, byCID: map[string]*actor{}, known: map[string]bool{}}
	if b.Mini != nil {
		// Each run starts on an empty server and a clock on a whole ms.
		b.Mini.FlushAll()
		m.now = time.Now().Truncate(time.Millisecond)
		b.Mini.SetTime(m.now)
	}
	m.prefix = fmt.Sprintf("prop%d:", time.Now().UnixNano())
	m.rdb = redis.NewClient(&redis.Options{Addr: b.Addr})
	defer m.rdb.Close()
	m.obs = m.newClient(nil)
	defer func() {
		// A crashed process's BLPOP may still block at the server, out of
		// reach of Close's nudge; closing its connections ends it.
		for _, a := range m.live(crashed) {
			a.rdb.Close()
		}
		var wg sync.WaitGroup
		for _, c := range m.clients {
			wg.Go(func() { c.Close() })
		}
		wg.Wait()
		// Closed clients end every Acquire; wait for them, so that none
		// still runs a script when the next test swaps the scripts.
		m.calls.Wait()
		for _, a := range m.actors {
			a.rdb.Close()
		}
		cfg.stats.add(m.seen)
	}()
	for i := range rapid.IntRange(1, 2).Draw(rt, "semaphores") {
		capGen := rapid.Int64Range(1, cfg.maxCap)
		if cfg.scale {
			// Most runs get a capacity where bulk sizes cross Lua's
			// unpack limit (8,000 values: 4,000 grants, 8,000 expiries).
			capGen = rapid.OneOf(capGen, rapid.Int64Range(1, 10000),
				rapid.SampledFrom([]int64{4000, 5000, 8000, 9000, 10000}), rapid.SampledFrom([]int64{8000, 10000}))
		}
		capacity := capGen.Draw(rt, fmt.Sprintf("capacity%d", i))
		m.seen.cap = max(m.seen.cap, capacity)
		name := fmt.Sprintf("s%d", i)
		k, _ := m.obs.keys(name)
		m.sems = append(m.sems, &msem{name: name, cap: capacity, k: k})
	}
	m.newLatch(rt)
	m.newBarrier(rt)
	for range 3 {
		m.spawn(rt)
	}

	actions := map[string]func(*rapid.T){
		"acquire": m.acquire,
		"try":     m.try,
		"release": m.release,
		"cancel":  m.cancelWait,
		"spawn":   m.spawn,
		"flush":   m.flush,
		// Condition variables (cond.go): waiters are woken in the order
		// they began to wait and queue behind those already queued.
		"wait":      m.condWait,
		"signal":    func(t *rapid.T) { m.condSignal(t, false) },
		"broadcast": func(t *rapid.T) { m.condSignal(t, true) },
		// A caller with another capacity: refused while anybody uses the
		// semaphore (holders, queued waiters, condition waiters).
		"other capacity": m.otherCapacity,
		// The countdown latch (property_latch_test.go): CountDown, and one
		// action whose draw picks Wait, a Wait's cancel or Count, so that
		// the semaphores keep most of the actions.
		"latch":      m.latchAction,
		"count down": m.latchDown,
		// The cyclic barrier (property_barrier_test.go): one action whose
		// draw picks an Await or a waiting party's cancel.
		"barrier": m.barrierAction,
		"":        m.check,
	}
	if m.frozen {
		actions["crash"] = m.crash
		actions["advance"] = m.advance
		actions["pause"] = m.pauseRelease
	}
	if cfg.crowd > 0 {
		actions["crowd"] = m.crowdAcquire
		actions["crowd release"] = m.crowdRelease
		actions["crowd cancel"] = m.crowdCancel
	}
	if cfg.doom {
		actions["doom"] = m.doom
	}
	rt.Repeat(actions)
	m.finish()
}

func (m *machine) newClient(hook redis.Hook) *Client {
	ttl, wttl := pLease, pWaiter
	if !m.frozen {
		ttl, wttl = time.Hour, time.Hour
	}
	return m.newClientTTL(hook, ttl, wttl)
}

func (m *machine) newClientTTL(hook redis.Hook, ttl, wttl time.Duration) *Client {
	rdb := redis.NewClient(&redis.Options{Addr: m.b.Addr})
	var blocking Option
	if hook != nil {
		// The hook reaches the client's BLPOPs too, which run on a
		// go-redis client of their own.
		rdb.AddHook(hook)
		blocking = withBlockingHooks(hook)
	}
	c, err := New(rdb, WithPrefix(m.prefix), WithLeaseTTL(ttl), WithWaiterTTL(wttl), blocking)
	if err != nil {
		m.t.Fatal(err)
	}
	m.clients = append(m.clients, c)
	return c
}

func (m *machine) spawn(t *rapid.T) {
	if len(m.solo(idle, waiting, holding, latching, barriering)) >= 6 {
		return
	}
	cu := &cut{}
	var c *Client
	if m.frozen {
		// The longest waiter TTL outlives the shortest lease, so that a
		// grant announced to a process lasts either TTL.
		ttl := rapid.SampledFrom([]time.Duration{pLease, pLeaseMax}).Draw(t, "lease TTL")
		wttl := rapid.SampledFrom([]time.Duration{pScale * 300 * time.Millisecond, pWaiter, pScale * 900 * time.Millisecond, pWaiterMax}).Draw(t, "waiter TTL")
		c = m.newClientTTL(cu, ttl, wttl)
	} else {
		c = m.newClient(cu)
	}
	a := &actor{id: len(m.actors), c: c, rdb: goRedisOf(c).(*redis.Client), cut: cu}
	m.actors = append(m.actors, a)
	m.byCID[c.id] = a
	m.logf("process %d starts (lease TTL %v, waiter TTL %v)", a.id, a.leaseTTL(), a.waiterTTL())
}

// leaseTTL and waiterTTL are a's process's TTLs.
func (a *actor) leaseTTL() time.Duration  { return a.c.cfg.leaseTTL }
func (a *actor) waiterTTL() time.Duration { return a.c.cfg.waiterTTL }

// solo returns the actors in one of the given states that are processes of
// their own, not crowd members.
func (m *machine) solo(states ...mstate) []*actor {
	return slices.DeleteFunc(m.live(states...), func(a *actor) bool { return a.crowd != nil })
}

// who names the process of a client id, for failure messages.
func (m *machine) who(cid string) string {
	if a := m.byCID[cid]; a != nil {
		return fmt.Sprintf("process %d", a.id)
	}
	for _, c := range m.crowds {
		if c.c.id == cid {
			return fmt.Sprintf("crowd %d", c.id)
		}
	}
	return "client " + cid
}

// live returns the actors in one of the given states.
func (m *machine) live(states ...mstate) []*actor {
	var out []*actor
	for _, a := range m.actors {
		if slices.Contains(states, a.state) {
			out = append(out, a)
		}
	}
	return out
}

func (m *machine) pickSem(t *rapid.T) *msem {
	return m.sems[rapid.IntRange(0, len(m.sems)-1).Draw(t, "semaphore")]
}

// pick draws one of the given processes by its number.
func pick(t *rapid.T, as []*actor) *actor {
	ids := make([]int, len(as))
	for i, a := range as {
		ids[i] = a.id
	}
	id := rapid.SampledFrom(ids).Draw(t, "process")
	return as[slices.Index(ids, id)]
}

// diagnose tells what a process that should have heard of a grant has in
// Redis and in its client.
func (m *machine) diagnose(a *actor) string {
	if a.sem == nil {
		return ""
	}
	ctx := context.Background()
	wake := a.sem.k.Wake(a.c.id)
	list, _ := m.rdb.LRange(ctx, wake, 0, -1).Result()
	ttl, _ := m.rdb.PTTL(ctx, wake).Result()
	a.c.mu.Lock()
	r := a.c.waits.Rooms[a.sem.k.Base]
	room := "no room"
	if r != nil {
		room = fmt.Sprintf("room running=%v waiters=%d", r.Running, len(r.Waiters))
	}
	a.c.mu.Unlock()
	return fmt.Sprintf("%s\nwake list %v (TTL %v), %s", m.dump(a.sem), list, ttl, room)
}

// dump renders a semaphore's Redis state for failure messages.
func (m *machine) dump(s *msem) string {
	ctx := context.Background()
	st, _ := m.rdb.HGetAll(ctx, s.k.List()[keyState]).Result()
	q, _ := m.rdb.ZRangeWithScores(ctx, s.k.List()[keyQueue], 0, -1).Result()
	h, _ := statecheck.Holders(ctx, m.rdb, s.k.Base)
	t, _ := m.rdb.ZRangeWithScores(ctx, s.k.List()[keyTombs], 0, -1).Result()
	return fmt.Sprintf("now=%d state=%v queue=%v holders=%v tombstones=%v", m.nowMs(), st, q, h, t)
}

// request draws an idle process, one or both semaphores and a number of
// permits of each for the operation op, and reports whether the model
// would grant them now.
func (m *machine) request(t *rapid.T, op string) (*actor, []mpart, bool) {
	as := m.solo(idle)
	if len(as) == 0 {
		t.Skip("no idle process")
	}
	a := pick(t, as)
	sems := []*msem{m.pickSem(t)}
	if len(m.sems) == 2 && rapid.Bool().Draw(t, "multi") {
		sems = m.sems
	}
	var parts []mpart
	var desc []string
	for _, s := range sems {
		gen := rapid.Int64Range(1, s.cap)
		if m.cfg.scale {
			gen = rapid.OneOf(gen, rapid.Just(s.cap), rapid.Int64Range(s.cap-s.cap/10, s.cap))
		}
		n := gen.Draw(t, "permits")
		m.seen.weight = max(m.seen.weight, n)
		parts = append(parts, mpart{s, n})
		desc = append(desc, fmt.Sprintf("%d of %s (capacity %d)", n, s.name, s.cap))
	}
	m.logf("process %d: %s(%s)", a.id, op, strings.Join(desc, ", "))
	m.modelRun()
	grant := true
	for _, pt := range parts {
		grant = grant && len(pt.s.queue) == 0 && pt.s.used()+pt.n <= pt.s.cap
	}
	a.parts, a.sem, a.n = parts, parts[0].s, parts[0].n
	return a, parts, grant
}

// entries makes the model's entries for a's request, expiring at at.
func (m *machine) entries(a *actor, ticket string, at int64) []*mentry {
	var es []*mentry
	for _, pt := range a.parts {
		es = append(es, &mentry{a: a, s: pt.s, n: pt.n, ticket: ticket, at: at})
	}
	if len(es) > 1 {
		for _, e := range es {
			e.group = es
		}
	}
	return es
}

// group returns every part of e's request.
func (e *mentry) parts() []*mentry {
	if e.group == nil {
		return []*mentry{e}
	}
	return e.group
}

func requests(parts []mpart) []Request {
	var reqs []Request
	for _, pt := range parts {
		reqs = append(reqs, Request{Name: pt.s.name, Capacity: pt.s.cap, Permits: pt.n})
	}
	return reqs
}

func (m *machine) acquire(t *rapid.T) {
	a, parts, grant := m.request(t, "Acquire")
	m.begin(t, a, parts, grant)
	m.settle(t)
}

// begin starts a's Acquire of parts in a goroutine. If the model grants it
// at once (grant), begin waits for the lease; otherwise it waits until the
// ticket is queued, in Redis and in its client (which refreshes only
// tickets it knows are queued; this test moves Redis's clock faster than
// real time could between the two), and learns the ticket.
func (m *machine) begin(t *rapid.T, a *actor, parts []mpart, grant bool) {
	ctx, cancel := context.WithCancel(context.Background())
	a.state, a.cancel, a.res = waiting, cancel, make(chan acqResult, 1)
	m.calls.Go(func() {
		l, err := a.c.AcquireAll(ctx, requests(parts)...)
		a.res <- acqResult{l, err}
	})
	if grant {
		m.expectGrant(t, a)
		for _, e := range m.entries(a, a.ticket, m.nowMs()+clock.MS(a.leaseTTL())) {
			e.s.holders = append(e.s.holders, e)
		}
		return
	}
	es := m.entries(a, "", m.nowMs()+clock.MS(a.waiterTTL()))
	for _, e := range es {
		e.s.queue = append(e.s.queue, e)
	}
	m.waitFor(t, fmt.Sprintf("process %d queued", a.id), func() bool {
		// The client marks a ticket queued once the script's reply says
		// Redis queued it. Requests start one at a time, so a client's
		// one queued ticket not yet known is a's.
		if tk := m.newQueued(a); tk != "" {
			for _, e := range es {
				e.ticket = tk
			}
			a.ticket = tk
			m.known[tk] = true
			return true
		}
		select {
		case r := <-a.res:
			a.res <- r // let check see it
			return true
		default:
		}
		return false
	})
}

// newQueued returns a ticket that a's client knows is queued on a's first
// semaphore and that the model does not know yet, or "".
func (m *machine) newQueued(a *actor) string {
	a.c.mu.Lock()
	defer a.c.mu.Unlock()
	if r := a.c.waits.Rooms[a.sem.k.Base]; r != nil {
		for tk, w := range r.Waiters {
			if w.Queued && !m.known[tk] {
				return tk
			}
		}
	}
	return ""
}

func (m *machine) try(t *rapid.T) {
	a, parts, want := m.request(t, "TryAcquire")
	l, err := a.c.TryAcquireAll(context.Background(), requests(parts)...)
	switch {
	case want && err != nil:
		t.Fatalf("TryAcquire = %v; the model has room and no queue", err)
	case !want && err == nil:
		t.Fatalf("TryAcquire granted; the model has no room or a queue")
	case !want && !errors.Is(err, ErrNotAcquired):
		t.Fatalf("TryAcquire = %v, want ErrNotAcquired", err)
	case want:
		a.state, a.lease, a.ticket = holding, l, l.ticket
		m.sawTokens(t, a, l)
		for _, e := range m.entries(a, l.ticket, m.nowMs()+clock.MS(a.leaseTTL())) {
			e.s.holders = append(e.s.holders, e)
		}
	}
	m.settle(t)
}

// otherCapacity makes an idle process try a semaphore with a capacity
// other than the one in use. The model refuses it while the semaphore has
// a live holder, a live queued waiter or a live condition waiter; an idle
// semaphore takes the new capacity (the process takes a permit and gives
// it back at once), and every later request gives that capacity.
func (m *machine) otherCapacity(t *rapid.T) {
	as := m.solo(idle)
	if len(as) == 0 {
		t.Skip("no idle process")
	}
	a := pick(t, as)
	s := m.pickSem(t)
	capacity := s.cap + rapid.SampledFrom([]int64{-1, 1, 2}).Draw(t, "capacity change")
	if capacity < 1 {
		capacity = s.cap + 1
	}
	m.modelRun()
	inUse := len(s.holders)+len(s.queue)+len(s.cond) > 0
	m.logf("process %d: TryAcquire(1 of %s, capacity %d; in use with %d: %d holders, %d queued, %d on the condition)",
		a.id, s.name, capacity, s.cap, len(s.holders), len(s.queue), len(s.cond))
	ctx := context.Background()
	l, err := a.c.TryAcquire(ctx, Request{Name: s.name, Capacity: capacity, Permits: 1})
	switch {
	case inUse && !errors.Is(err, ErrCapacityMismatch):
		t.Fatalf("TryAcquire with capacity %d = %v; the model has it in use with capacity %d: want ErrCapacityMismatch", capacity, err, s.cap)
	case !inUse && err != nil:
		t.Fatalf("TryAcquire with capacity %d = %v; the model has it idle", capacity, err)
	case !inUse:
		if l.Token() <= s.token {
			t.Fatalf("%s granted token %d after token %d", s.name, l.Token(), s.token)
		}
		s.token = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release of the lease with capacity %d: %v", capacity, err)
		}
		s.cap = capacity
		m.seen.cap = max(m.seen.cap, capacity)
	}
	m.settle(t)
}

// holding returns a's holder entries in the model, one per part, or none
// if its lease expired there.
func (m *machine) holding(t *rapid.T, a *actor) []*mentry {
	var es []*mentry
	for _, pt := range a.parts {
		if i := slices.IndexFunc(pt.s.holders, func(e *mentry) bool { return e.a == a }); i >= 0 {
			es = append(es, pt.s.holders[i])
		}
	}
	if len(es) != 0 && len(es) != len(a.parts) {
		t.Fatalf("model: process %d holds %d of its %d parts", a.id, len(es), len(a.parts))
	}
	return es
}

func (m *machine) release(t *rapid.T) {
	as := m.solo(holding)
	if len(as) == 0 {
		t.Skip("no holder")
	}
	a := pick(t, as)
	m.logf("process %d: Release", a.id)
	m.releaseOne(t, a)
}

// releaseOne releases a's lease, checks the answer against the model and
// settles whatever the release lets through.
func (m *machine) releaseOne(t *rapid.T, a *actor) {
	m.modelRun()
	m.releaseHeld(t, a, m.holding(t, a))
}

// releaseHeld releases a's lease, of which the model holds held, checks
// the answer and settles whatever the release lets through.
func (m *machine) releaseHeld(t *rapid.T, a *actor, held []*mentry) {
	err := a.lease.Release(context.Background())
	switch {
	case len(held) == 0 && !errors.Is(err, ErrLeaseLost):
		t.Fatalf("Release of a lease the model says expired = %v, want ErrLeaseLost", err)
	case len(held) > 0 && err != nil:
		t.Fatalf("Release of a live lease = %v", err)
	}
	for _, e := range held {
		e.s.holders = slices.DeleteFunc(e.s.holders, func(x *mentry) bool { return x == e })
	}
	a.state, a.lease = idle, nil
	m.settle(t)
}

// pauseRelease stops every process at once (a stalled network, a pause
// of everyone) while Redis's clock moves on, but for no longer than any
// live process's lease or deadline lasts; then one holder releases. Its
// release is the first script to see the new time: it must drop what died
// meanwhile (a crashed waiter at the head of the queue, leases of crashed
// holders) before it hands anything on, and the model's next run grants
// what it freed.
func (m *machine) pauseRelease(t *rapid.T) {
	as := m.solo(holding)
	if len(as) == 0 {
		t.Skip("no holder")
	}
	a := pick(t, as)
	// Nothing has run since the last step settled, so the model's view
	// is Redis's; it is not run again before the release.
	// The pause leaves every live entry alive: each has more time left
	// than a chunk of the clock.
	now := m.nowMs()
	most := int64(pScale * 2000)
	for _, s := range m.sems {
		for _, e := range slices.Concat(s.queue, s.holders, s.cond) {
			if !e.dead && e.at > now {
				most = min(most, e.at-now-clock.MS(pChunk)-1)
			}
		}
	}
	for _, w := range m.latch.waiters {
		if !w.dead && w.at > now {
			most = min(most, w.at-now-clock.MS(pChunk)-1)
		}
	}
	for _, w := range m.barrier.waiters {
		if !w.dead && w.at > now {
			most = min(most, w.at-now-clock.MS(pChunk)-1)
		}
	}
	if most < 1 {
		t.Skip("a live entry is about to expire")
	}
	// The longest pause lets the most die.
	d := rapid.OneOf(rapid.Int64Range(1, most), rapid.Just(most)).Draw(t, "pause ms")
	m.logf("every process pauses while Redis's clock moves %d ms; then process %d releases", d, a.id)
	m.now = m.now.Add(time.Duration(d) * time.Millisecond)
	m.b.Mini.SetTime(m.now)
	m.releaseHeld(t, a, m.holding(t, a))
	// Then every process resumes, and its overdue timers renew and
	// refresh at once. Left to the timers alone, a refresh would move a
	// deadline in Redis that the model did not move (the timers run in
	// real time, which a slow run gives them), and a process crashing
	// later would be dropped by the model before Redis drops it.
	m.heartbeat(t)
	m.settle(t)
}

func (m *machine) cancelWait(t *rapid.T) {
	as := m.solo(waiting)
	if len(as) == 0 {
		t.Skip("no waiter")
	}
	a := pick(t, as)
	m.logf("process %d: cancels its wait", a.id)
	m.cancelOne(t, a)
}

// cancelOne cancels a's Acquire, which must return context.Canceled, and
// settles whatever its leaving lets through.
func (m *machine) cancelOne(t *rapid.T, a *actor) {
	a.cancel()
	r := m.receive(t, a)
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled Acquire = %v, %v; want context.Canceled", r.l != nil, r.err)
	}
	awaitCleanUp(t, a.c)
	for _, pt := range a.parts {
		pt.s.queue = slices.DeleteFunc(pt.s.queue, func(e *mentry) bool { return e.a == a })
		pt.s.cond = slices.DeleteFunc(pt.s.cond, func(e *mentry) bool { return e.a == a })
	}
	a.state = idle
	m.settle(t)
}

// awaitCleanUp waits for the clean-up c runs in the background: a
// cancelled Acquire whose withdrawal did not answer within the grace
// returns before it lands (on a loaded machine), and the model counts the
// waiter gone once it has.
func awaitCleanUp(t *rapid.T, c *Client) {
	for deadline := time.Now().Add(pWait); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		n := c.tasks
		c.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client's clean-up still ran %v after the call returned", pWait)
		}
	}
}

func (m *machine) crash(t *rapid.T) {
	if cs := m.liveCrowds(func(*actor) bool { return true }); len(cs) > 0 && rapid.Bool().Draw(t, "crash a crowd") {
		c := cs[rapid.IntRange(0, len(cs)-1).Draw(t, "crowd")]
		m.logf("crowd %d crashes", c.id)
		m.crashCrowd(c)
		m.settle(t)
		return
	}
	as := m.solo(idle, waiting, holding, latching, barriering)
	if len(as) == 0 {
		t.Skip("nobody to crash")
	}
	a := pick(t, as)
	m.logf("process %d crashes (state %d)", a.id, a.state)
	a.cut.crash()
	a.state = crashed
	m.latchCrash(a)
	m.barrierCrash(a)
	for _, s := range m.sems {
		for _, e := range slices.Concat(s.queue, s.holders, s.cond) {
			if e.a == a {
				e.dead = true
			}
		}
	}
	m.settle(t)
}

func (m *machine) advance(t *rapid.T) {
	d := time.Duration(rapid.IntRange(1, 25).Draw(t, "advance")) * pScale * 100 * time.Millisecond
	m.logf("Redis's clock moves %v", d)
	for d > 0 {
		step := min(d, pChunk)
		d -= step
		m.now = m.now.Add(step)
		m.b.Mini.SetTime(m.now)
		m.heartbeat(t)
		m.settle(t)
	}
}

func (m *machine) flush(t *rapid.T) {
	m.logf("SCRIPT FLUSH")
	if err := m.rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

func (m *machine) leaseTTL() time.Duration  { return m.obs.cfg.leaseTTL }
func (m *machine) waiterTTL() time.Duration { return m.obs.cfg.waiterTTL }

func (s *msem) used() int64 {
	var n int64
	for _, e := range s.holders {
		n += e.n
	}
	return n
}

// modelRun applies the model's rules at the current time: expired leases
// and dead waiters go, then each queue's head is granted while it fits, a
// multi-request only once it heads both queues and fits in both. It
// returns the first part of each request it granted.
func (m *machine) modelRun() (granted []*mentry) {
	now := m.nowMs()
	gone := 0
	for _, s := range m.sems {
		n := len(s.holders) + len(s.queue)
		s.holders = slices.DeleteFunc(s.holders, func(e *mentry) bool { return e.at <= now })
		s.queue = slices.DeleteFunc(s.queue, func(e *mentry) bool { return e.at <= now })
		gone += n - len(s.holders) - len(s.queue)
		// A dead condition waiter is gone too; Redis drops it when a
		// signal reaches it (check looks past it until then).
		s.cond = slices.DeleteFunc(s.cond, func(e *mentry) bool { return e.at <= now })
	}
	m.seen.expired = max(m.seen.expired, gone)
	defer func() { m.seen.bulk = max(m.seen.bulk, len(granted)) }()
	for moved := true; moved; {
		moved = false
		for _, s := range m.sems {
			for len(s.queue) > 0 && ready(s.queue[0]) {
				parts := s.queue[0].parts()
				for _, e := range parts {
					e.s.queue = e.s.queue[1:]
					// A grant announced to a process lasts one waiter TTL
					// until the process confirms it; a live one does so
					// before the next step.
					e.at = now + clock.MS(min(e.a.leaseTTL(), e.a.waiterTTL()))
					if !e.dead {
						e.at = now + clock.MS(e.a.leaseTTL())
					}
					e.s.holders = append(e.s.holders, e)
				}
				granted = append(granted, parts[0])
				moved = true
			}
		}
	}
	return granted
}

// ready reports whether every part of e's request heads its queue and fits.
func ready(e *mentry) bool {
	for _, x := range e.parts() {
		if x.s.queue[0] != x || x.s.used()+x.n > x.s.cap {
			return false
		}
	}
	return true
}

func (m *machine) settle(t *rapid.T) {
	began, err := m.rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	ks := make([]keyspace.Keys, 0, len(m.sems)+1)
	for _, s := range m.sems {
		ks = append(ks, s.k)
	}
	if m.latch != nil {
		ks = append(ks, m.latch.k.res) // its waiters' resource: purged as any
	}
	for _, k := range ks {
		// One script does a bounded part of the work (grants, purges);
		// its reply's next event is 0 while work is left, and a waiting
		// process refreshes again at once, as this does.
		for i := 0; ; i++ {
			res, err := runTest(context.Background(), m.obs.calls.Scripts.Named("refresh"), m.rdb, k.List(), "refresh", m.obs.id,
				clock.MS(m.leaseTTL()), clock.MS(m.waiterTTL())).Slice()
			if err != nil {
				t.Fatalf("observer's refresh: %v", err)
			}
			if next, err := script.Reply(res).Int(0); err != nil || next != 0 {
				break
			}
			if i == 1000 {
				t.Fatalf("observer's refresh: work left after 1,000 scripts")
			}
		}
	}
	m.purged = began.UnixMilli()
	for _, e := range m.modelRun() {
		if e.dead {
			continue
		}
		m.expectGrant(t, e.a)
		// Confirm now, as its renewal timer does at once.
		e.a.lease.renew()
	}
}

// heartbeat makes every live process renew its leases and refresh its
// waiters now, as its timers do at a third of each TTL.
func (m *machine) heartbeat(t *rapid.T) {
	refreshed := map[*wait.Room]bool{} // crowd members share their rooms
	for _, a := range m.live(waiting, holding) {
		switch a.state {
		case holding:
			a.lease.renew()
			if err := a.lease.Err(); err != nil {
				t.Fatalf("process %d's lease ended on renewal: %v", a.id, err)
			}
		case waiting:
			a.c.mu.Lock()
			r := a.c.waits.Rooms[a.sem.k.Base]
			a.c.mu.Unlock()
			if r == nil || refreshed[r] {
				continue // granted by an earlier heartbeat (settle checks it), or refreshed
			}
			refreshed[r] = true
			if _, err := r.Refresh(); err != nil {
				t.Fatalf("process %d's refresh: %v", a.id, err)
			}
		}
	}
	now := m.nowMs()
	for _, s := range m.sems {
		// Entries already past their time stay as they are: the model
		// drops them at its next run, as Redis does.
		for _, e := range s.holders {
			if !e.dead && e.at > now {
				e.at = now + clock.MS(e.a.leaseTTL())
			}
		}
		for _, e := range slices.Concat(s.queue, s.cond) {
			if !e.dead && e.at > now {
				e.at = now + clock.MS(e.a.waiterTTL())
			}
		}
	}
	m.latchHeartbeat(t)
	m.barrierHeartbeat(t)
}

func (m *machine) receive(t *rapid.T, a *actor) acqResult {
	select {
	case r := <-a.res:
		return r
	case <-time.After(m.wait):
		t.Fatalf("process %d's Acquire did not return within %v\n%s", a.id, m.wait, m.diagnose(a))
		return acqResult{}
	}
}

// expectGrant waits for a live waiter's Acquire to return its lease.
func (m *machine) expectGrant(t *rapid.T, a *actor) {
	r := m.receive(t, a)
	if r.err != nil {
		t.Fatalf("process %d: Acquire of %d parts = %v; the model grants it", a.id, len(a.parts), r.err)
	}
	a.state, a.lease, a.ticket = holding, r.l, r.l.ticket
	m.sawTokens(t, a, r.l)
	for _, pt := range a.parts {
		for _, e := range pt.s.holders {
			if e.a == a {
				e.ticket = r.l.ticket
			}
		}
	}
}

// sawTokens checks that each part of a's new lease has a token above any
// seen before on its semaphore.
func (m *machine) sawTokens(t *rapid.T, a *actor, l *Lease) {
	parts := l.Parts()
	if len(parts) != len(a.parts) {
		t.Fatalf("lease has %d parts, the request %d", len(parts), len(a.parts))
	}
	for i, p := range parts {
		s := a.parts[i].s
		if p.Name != s.name || p.Permits != a.parts[i].n {
			t.Fatalf("lease part %d is %+v, the request %s for %d", i, p, s.name, a.parts[i].n)
		}
		if p.Token <= s.token {
			t.Fatalf("%s granted token %d after token %d", s.name, p.Token, s.token)
		}
		s.token = p.Token
	}
}

func (m *machine) waitFor(t *rapid.T, what string, cond func() bool) {
	deadline := time.Now().Add(m.wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

type rentry struct {
	ticket, client string
	n              int64
	at             int64
}

// redisQueue and redisHolders read a semaphore's state as Redis holds it,
// keeping only entries whose time has not passed.
func (m *machine) redisQueue(s *msem) []rentry {
	ctx := context.Background()
	// Two reads, not one per member: queues grow to thousands.
	members, err := m.rdb.ZRangeWithScores(ctx, s.k.List()[keyQueue], 0, -1).Result()
	if err != nil {
		m.t.Fatal(err)
	}
	st, err := m.rdb.HGetAll(ctx, s.k.List()[keyState]).Result()
	if err != nil {
		m.t.Fatal(err)
	}
	var out []rentry
	for _, z := range members {
		mem := z.Member.(string)
		head, _, _ := strings.Cut(mem, "\t") // a multi-request's group follows a tab
		f := strings.Fields(head)
		// Its deadline: its process's liveness field's.
		at, ok := statecheck.WaiterDeadline(st, mem, int64(z.Score))
		if !ok || len(f) != 5 {
			m.t.Fatalf("queue member %q has no deadline or a bad form", mem)
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		if int64(at) > m.nowMs() || !m.frozen {
			out = append(out, rentry{ticket: f[0], n: n, client: f[2], at: int64(at)})
		}
	}
	return out
}

func (m *machine) redisHolders(s *msem) []rentry {
	zs, err := statecheck.Holders(context.Background(), m.rdb, s.k.Base)
	if err != nil {
		m.t.Fatal(err)
	}
	var out []rentry
	for _, z := range zs {
		f := strings.Fields(z.Member.(string))
		n, _ := strconv.ParseInt(f[1], 10, 64)
		if int64(z.Score) > m.nowMs() || !m.frozen {
			out = append(out, rentry{ticket: f[0], n: n, client: f[2], at: int64(z.Score)})
		}
	}
	return out
}

// check compares Redis with the model after every step, and checks the
// invariants of the keys (statecheck) as they are now.
func (m *machine) check(t *rapid.T) {
	m.checkState(t)
	m.latchCheck(t)
	m.barrierCheck(t)
	for _, s := range m.sems {
		// Safety: live leases never hold more than the capacity, and they
		// are exactly the model's holders: none the model says expired.
		hs := m.redisHolders(s)
		var held int64
		got := map[string]int64{}
		for _, h := range hs {
			held += h.n
			got[h.ticket] = h.n
		}
		if held > s.cap {
			t.Fatalf("%s: leases hold %d permits, capacity %d", s.name, held, s.cap)
		}
		want := map[string]int64{}
		for _, e := range s.holders {
			want[e.ticket] = e.n
		}
		if len(got) != len(want) {
			var who []string
			for _, h := range hs {
				who = append(who, fmt.Sprintf("%s (ticket %s, until %d)", m.who(h.client), h.ticket, h.at))
			}
			t.Fatalf("%s: Redis has %d live leases %v, the model %d %v\nRedis's holders: %v\n%s",
				s.name, len(got), got, len(want), want, who, m.dump(s))
		}
		for tk, n := range want {
			if got[tk] != n {
				t.Fatalf("%s: lease %s holds %d in Redis, %d in the model", s.name, tk, got[tk], n)
			}
		}
		// FIFO: the live waiters in Redis are the model's, in its order.
		qs := m.redisQueue(s)
		m.seen.queue = max(m.seen.queue, len(qs))
		if len(qs) != len(s.queue) {
			var who, mw []string
			for _, q := range qs {
				who = append(who, fmt.Sprintf("%s for %d", m.who(q.client), q.n))
			}
			for _, e := range s.queue {
				mw = append(mw, fmt.Sprintf("%s for %d (dead %v)", m.who(e.a.c.id), e.n, e.dead))
			}
			t.Fatalf("%s: Redis queues %d %v, the model %d %v\n%s", s.name, len(qs), who, len(s.queue), mw, m.dump(s))
		}
		for i, q := range qs {
			e := s.queue[i]
			if q.client == e.a.c.id && e.ticket != "" && q.ticket != e.ticket {
				t.Fatalf("%s: %s waits with ticket %s, not %s: it was queued again", s.name, m.who(q.client), q.ticket, e.ticket)
			}
			if q.client != e.a.c.id || q.n != e.n {
				t.Fatalf("%s: queue position %d is %s for %d in Redis, %s for %d in the model",
					s.name, i, m.who(q.client), q.n, m.who(e.a.c.id), e.n)
			}
		}
		// Condition waiters: the live ones in Redis are the model's, in
		// its order, on each condition variable.
		for _, cond := range mconds {
			cs := m.redisCond(s, cond)
			var model []*mentry
			for _, e := range s.cond {
				if e.cond == cond {
					model = append(model, e)
				}
			}
			if len(cs) != len(model) {
				t.Fatalf("%s: %d wait on the condition %q in Redis, %d in the model", s.name, len(cs), cond, len(model))
			}
			for i, c := range cs {
				if e := model[i]; c.ticket != e.ticket || c.client != e.a.c.id {
					t.Fatalf("%s: condition %q position %d is %s (ticket %s) in Redis, %s (ticket %s) in the model",
						s.name, cond, i, m.who(c.client), c.ticket, m.who(e.a.c.id), e.ticket)
				}
			}
		}
		// Liveness: the model grants whatever is ready, so its head never is.
		if len(s.queue) > 0 && ready(s.queue[0]) {
			t.Fatalf("%s: head is ready but waits", s.name)
		}
	}
	// Processes that wait have not returned; holders' leases are alive.
	for _, a := range m.live(waiting, holding) {
		if a.state == waiting {
			select {
			case r := <-a.res:
				t.Fatalf("process %d returned (lease %v, err %v) while the model has it waiting", a.id, r.l != nil, r.err)
			default:
			}
		} else if len(m.holding(t, a)) > 0 {
			if err := a.lease.Err(); err != nil {
				t.Fatalf("process %d's lease ended (%v) while the model has it held", a.id, err)
			}
		}
	}
}

// checkState checks the invariants every key must keep at every moment
// (statecheck.Check), on every semaphore of the machine.
func (m *machine) checkState(t *rapid.T) {
	bases := make([]string, len(m.sems), len(m.sems)+1)
	for i, s := range m.sems {
		bases[i] = s.k.Base
	}
	if m.latch != nil {
		bases = append(bases, m.latch.k.res.Base)
	}
	st := statecheck.State{Prefix: m.prefix, Bases: bases, Purged: m.purged}
	if err := statecheck.Check(context.Background(), m.rdb, st); err != nil {
		var dumps []string
		for _, s := range m.sems {
			dumps = append(dumps, m.dump(s))
		}
		t.Fatalf("state invariant: %v\n%s", err, strings.Join(dumps, "\n"))
	}
}

// finish ends a run: every live process lets go, the crashed ones'
// entries run out, and then the full capacity must be free (no permit was
// lost) and, once idle long enough, no key must remain.
func (m *machine) finish() {
	t := m.t
	ctx := context.Background()
	m.latchFinish()
	m.barrierFinish()
	for _, a := range m.live(waiting, holding) {
		if a.state == waiting {
			a.cancel()
			if r := m.receive(t, a); r.l != nil {
				_ = r.l.Release(ctx)
			}
		} else {
			_ = a.lease.Release(ctx)
		}
		a.state = idle
	}
	if m.frozen {
		m.now = m.now.Add(pLeaseMax + pWaiterMax)
		m.b.Mini.SetTime(m.now)
	}
	c := m.newClient(nil)
	for _, s := range m.sems {
		l, err := c.TryAcquire(ctx, Request{Name: s.name, Capacity: s.cap, Permits: s.cap})
		if err != nil {
			t.Fatalf("%s: TryAcquire of the whole capacity %d once all is released: %v\n%s", s.name, s.cap, err, m.dump(s))
		}
		if l.Token() <= s.token {
			t.Fatalf("%s: token %d after %d", s.name, l.Token(), s.token)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := m.rdb.Keys(ctx, m.prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		// PTTL answers -1 for a key with no TTL (one that stays), -2 for
		// one that is gone: a key with a TTL can expire between KEYS and
		// PTTL (seen on a real server: a latch's state key, "TTL -2ns").
		ttl, err := m.rdb.PTTL(ctx, k).Result()
		if err != nil || ttl == -1 {
			t.Fatalf("key %s stays (TTL %v, %v)", k, ttl, err)
		}
	}
	if m.frozen {
		m.now = m.now.Add(time.Hour)
		m.b.Mini.SetTime(m.now)
		if keys, _ := m.rdb.Keys(ctx, m.prefix+"*").Result(); len(keys) > 0 {
			t.Fatalf("keys remain an idle hour later: %v", keys)
		}
	}
}

// mconds are the condition variables the machines use: the default one
// and a named one (whose key is derived from the condition's name).
var mconds = []string{"", "ready"}

// condWait makes a process holding one semaphore wait on one of its
// condition variables: in the model, its lease ends and it joins the
// condition.
func (m *machine) condWait(t *rapid.T) {
	as := slices.DeleteFunc(m.solo(holding), func(a *actor) bool { return len(a.parts) != 1 })
	if len(as) == 0 {
		t.Skip("no holder of one semaphore")
	}
	a := pick(t, as)
	m.modelRun()
	held := m.holding(t, a)
	if len(held) == 0 {
		t.Skip("its lease has expired")
	}
	cond := rapid.SampledFrom(mconds).Draw(t, "condition")
	m.logf("process %d: Wait on %s's condition %q", a.id, a.sem.name, cond)
	s, lease := a.sem, a.lease
	s.holders = slices.DeleteFunc(s.holders, func(x *mentry) bool { return x == held[0] })
	e := &mentry{a: a, s: s, n: a.n, at: m.nowMs() + clock.MS(a.waiterTTL()), cond: cond}
	s.cond = append(s.cond, e)
	ctx, cancel := context.WithCancel(context.Background())
	a.state, a.cancel, a.res, a.lease = waiting, cancel, make(chan acqResult, 1), nil
	m.calls.Go(func() {
		l, err := lease.condWait(ctx, cond)
		a.res <- acqResult{l, err}
	})
	m.waitFor(t, fmt.Sprintf("process %d waits on the condition", a.id), func() bool {
		if tk := m.newQueued(a); tk != "" {
			a.ticket, e.ticket = tk, tk
			m.known[tk] = true
			return true
		}
		select {
		case r := <-a.res:
			a.res <- r // let check see it
			return true
		default:
		}
		return false
	})
	m.settle(t)
}

// condSignal signals (or broadcasts) one of a semaphore's condition
// variables: in the model, its longest live waiter (or every one) joins
// the end of the semaphore's queue, in order, with a fresh deadline.
func (m *machine) condSignal(t *rapid.T, all bool) {
	s := m.pickSem(t)
	cond := rapid.SampledFrom(mconds).Draw(t, "condition")
	op := "Signal"
	if all {
		op = "Broadcast"
	}
	m.logf("%s on %s's condition %q", op, s.name, cond)
	m.modelRun()
	var woken, left []*mentry
	for _, e := range s.cond {
		if e.cond == cond && (all || len(woken) == 0) {
			woken = append(woken, e)
		} else {
			left = append(left, e)
		}
	}
	s.cond = left
	for _, e := range woken {
		e.at = m.nowMs() + clock.MS(e.a.waiterTTL())
		s.queue = append(s.queue, e)
	}
	var n int
	var err error
	if all {
		n, err = m.obs.signal(context.Background(), s.name, cond, true)
	} else {
		n, err = m.obs.signal(context.Background(), s.name, cond, false)
	}
	if err != nil || n != len(woken) {
		t.Fatalf("%s = %d, %v; the model wakes %d", op, n, err, len(woken))
	}
	m.settle(t)
}

// redisCond reads the waiters of a semaphore's condition variable cond as
// Redis holds them, in order, keeping only those whose deadline has not
// passed.
func (m *machine) redisCond(s *msem, cond string) []rentry {
	ctx := context.Background()
	keys := condKeys(s.k, cond)
	members, err := m.rdb.ZRangeWithScores(ctx, keys[0], 0, -1).Result()
	if err != nil {
		m.t.Fatal(err)
	}
	st, err := m.rdb.HGetAll(ctx, s.k.List()[keyState]).Result()
	if err != nil {
		m.t.Fatal(err)
	}
	var out []rentry
	for _, z := range members {
		mem := z.Member.(string)
		f := strings.Fields(mem)
		at, ok := statecheck.WaiterDeadline(st, mem, int64(z.Score))
		if !ok || len(f) != 5 {
			m.t.Fatalf("condition member %q has no deadline or a bad form", mem)
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		if int64(at) > m.nowMs() || !m.frozen {
			out = append(out, rentry{ticket: f[0], n: n, client: f[2], at: int64(at)})
		}
	}
	return out
}

// The position of each key in keyspace.Keys.List, the order queue.lua's header
// gives.
const (
	keyState   = iota // :s hash: capacity, counts, token sequence, records
	keyQueue          // :q waiters by arrival
	keyUnused         // the third key (:d in layouts 1 and 2): unused
	keyHolders        // :h leases by expiry
	keyTombs          // :t tombstoned tickets
)
