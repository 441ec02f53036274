package fairlock

// The call machine: a rapid generator of script calls, run in lockstep on
// the two replayers of a pair (fast paths on and off) and compared after
// every call. Where the recorded histories follow what real clients do,
// this one drives the scripts directly, as any sequence of clients could:
// acquisitions of one or two semaphores with each process's own TTLs,
// releases, renewals (one by one and in batches), withdrawals, refreshes,
// pumps, condition waits and signals, resends, and a clock that moves by
// small steps or straight past the next lease expiry, waiter deadline or
// tombstone end. It reaches the fast paths' edges (a release that finds
// the queue's head dead, a grant beside a lease about to expire) far more
// often than whole clients do.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// cproc is a process of the call machine: its client id and TTLs.
type cproc struct {
	id          string
	lease, wait int64 // ms
}

// cpart is one semaphore of a ticket's request.
type cpart struct {
	sem *csem
	n   int64
}

// cticket is a request the call machine made.
type cticket struct {
	ticket    string
	p         *cproc
	parts     []cpart
	tokens    []string // holding: one per part
	announced bool     // holding: granted on a wake list, not yet confirmed
	heard     bool     // holding: granted on a wake list, confirmed or not
	cond      string   // waiting on this condition ("c:" prefix) when set
}

type csem struct {
	name, base string
	cap        int64
}

func (s *csem) keys() []string {
	return []string{s.base + ":s", s.base + ":q", s.base + ":d", s.base + ":h", s.base + ":t"}
}

// callSides is where a call machine runs its calls: a replayPair (the
// fast paths on and off, compared), a foreignPair (a clean database and
// one where other programs' keys are planted), or a resendPair (calls
// sent once, and sent twice).
type callSides interface {
	// step runs c, the stepth call, on every side and checks them; it
	// returns the reply the machine goes on with.
	step(ctx context.Context, c call, step int) (any, error)
	// sides are the databases, kept alike; the machine reads the first.
	sides() []*replayer
}

func (p replayPair) sides() []*replayer { return []*replayer{p.Fast, p.General} }

// callPrefix begins every key of the call machine's semaphores and wake
// lists.
const callPrefix = "cm:"

// callMachine is one run's state.
type callMachine struct {
	ctx     context.Context
	t       *rapid.T
	pair    callSides
	now     int64 // µs, Redis's clock as the replayers see it
	sems    []*csem
	latch   *clatch   // differential_latch_test.go
	barrier *cbarrier // differential_barrier_test.go
	procs   []*cproc
	waiting []*cticket
	holding []*cticket
	sent    []call // every call made, for resends
	seq     int
	// ends holds, by ticket, the latest lease expiry (ms) the first
	// replayer's database showed after any call: when a lease gone from it
	// ended, so that a release can be told what it must answer.
	ends map[string]int64
	// told holds, by ticket, the latest lease expiry (ms) a reply told
	// its client (a grant, a renewal, a wake-up or a refresh).
	told map[string]int64
	// waited holds the new tickets of the condition waits whose first run
	// answered 1: it released the lease and made the ticket wait.
	waited map[string]bool
}

func (m *callMachine) nowMs() int64 { return m.now / 1000 }

// clockArgs renders the machine's clock as a call's time: Redis's TIME.
func (m *callMachine) clockArgs() []string {
	return []string{strconv.FormatInt(m.now/1e6, 10), strconv.FormatInt(m.now%1e6, 10)}
}

// exec runs c at the machine's clock on both replayers, compares, and
// returns the reply.
func (m *callMachine) exec(c call) any {
	c.Time = m.clockArgs()
	m.sent = append(m.sent, c)
	res, err := m.pair.step(m.ctx, c, len(m.sent))
	if err != nil {
		m.t.Fatal(err)
	}
	if m.ends == nil {
		m.ends, m.told = map[string]int64{}, map[string]int64{}
	}
	m.noteTold(c, res)
	var bases []string
	for _, s := range m.sems {
		hs, err := statecheck.Holders(m.ctx, m.pair.sides()[0].RDB, s.base)
		if err != nil {
			continue // another program's key, planted by a foreign pair
		}
		bases = append(bases, s.base)
		if err := m.checkHolders(s, hs); err != nil {
			m.t.Fatalf("after step %d (%s): %v", len(m.sent), c, err)
		}
		for _, h := range hs {
			if f := strings.Fields(h.Member.(string)); len(f) > 0 {
				m.ends[f[0]] = max(m.ends[f[0]], int64(h.Score))
			}
		}
	}
	if m.latch != nil {
		bases = append(bases, m.latch.res.base)
	}
	if m.barrier != nil {
		bases = append(bases, m.barrier.res.base)
	}
	// The keys' invariants, on the machine's clock (the replayers'), as
	// the model-based tests check them on the server's.
	st := statecheck.State{Prefix: callPrefix, Bases: bases, At: m.nowMs(), Shift: differential.ExpiryShift}
	if err := statecheck.Check(m.ctx, m.pair.sides()[0].RDB, st); err != nil {
		dump, _ := m.pair.sides()[0].Dump(m.ctx, "")
		m.t.Fatalf("after step %d (%s): %v\n%s", len(m.sent), c, err, dump)
	}
	return res
}

// noteTold records the lease expiries that c's reply res told its client.
func (m *callMachine) noteTold(c call, res any) {
	r, _ := res.([]any)
	now := m.nowMs()
	switch c.Op() {
	case "acquire", "try":
		if len(r) > 2 {
			if code, _ := r[0].(int64); code == ops.AcqGranted || code == ops.AcqGrantedBefore {
				e, _ := r[2].(int64)
				m.told[c.Args[1]] = max(m.told[c.Args[1]], e)
			}
		}
	case "renew":
		if len(r) > 0 {
			if n, _ := r[0].(int64); n == 1 {
				l, _ := strconv.ParseInt(c.Args[3], 10, 64)
				m.told[c.Args[1]] = now + l
			}
		}
	case "renew_batch":
		if len(r) > 0 {
			list, _ := r[0].([]any)
			for j := range list {
				if n, _ := list[j].(int64); n == 1 && 2+5*j+4 < len(c.Args) {
					l, _ := strconv.ParseInt(c.Args[2+5*j+4], 10, 64)
					m.told[c.Args[2+5*j]] = now + l
				}
			}
		}
	}
}

// checkHolders checks a semaphore's holders hs (the first replayer's
// database) against its state and its capacity, after every call: the
// state's counts are its holders'; no ticket holds twice; the live leases
// hold at most the capacity; and so do the leases the machine's clients
// were told are live (the promise as the clients see it).
func (m *callMachine) checkHolders(s *csem, hs []redis.Z) error {
	rdb := m.pair.sides()[0].RDB
	st, err := rdb.HMGet(m.ctx, s.base+":s", "nh", "used", "cap").Result()
	if err != nil {
		return nil // another program's key
	}
	now := m.nowMs()
	var used, live int64
	seen := map[string]bool{}
	for _, h := range hs {
		f := strings.Fields(h.Member.(string))
		if len(f) != 4 {
			return fmt.Errorf("%s: holder %q has a bad form", s.base, h.Member)
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		used += n
		if int64(h.Score) > now {
			if seen[f[0]] {
				return fmt.Errorf("%s: ticket %s holds twice: %v", s.base, f[0], hs)
			}
			seen[f[0]] = true
			live += n
		}
	}
	count := func(v any) int64 {
		x, _ := v.(string)
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	if nh, u := count(st[0]), count(st[1]); nh != int64(len(hs)) || u != used {
		return fmt.Errorf("%s: the state counts nh %d used %d; its holders %d, holding %d: %v", s.base, nh, u, len(hs), used, hs)
	}
	// The capacity stored (a caller may give another to an idle one).
	capacity := count(st[2])
	if capacity == 0 {
		capacity = s.cap
	}
	if live > capacity {
		return fmt.Errorf("%s: %d permits held by live leases, capacity %d: %v", s.base, live, capacity, hs)
	}
	var told int64
	var who []string
	for _, tk := range m.holding {
		for _, p := range tk.parts {
			if p.sem == s && m.told[tk.ticket] > now {
				told += p.n
				who = append(who, fmt.Sprintf("%s (%d until %d)", tk.ticket, p.n, m.told[tk.ticket]))
			}
		}
	}
	if told > capacity {
		return fmt.Errorf("%s: clients were told %d permits are theirs, capacity %d: %v; holders %v", s.base, told, capacity, who, hs)
	}
	return nil
}

// releaseWants returns what a release of tk (one semaphore) must answer,
// by the first replayer's database and the machine's clock: 1 when its
// lease lives, 0 when it has expired or ended without its release less
// than a second ago and the semaphore's keys live (a lease dropped leaves
// a tombstone for 10 s; the keys outlive every lease and tombstone, but
// not always by a second: their expiry moves only when what they hold
// passes it), and -1 when either may be right (a lease that ended longer
// ago, or whose keys have expired since, whose trace may be gone: 3, or
// one of several parts).
func (m *callMachine) releaseWants(tk *cticket) int64 {
	if len(tk.parts) != 1 || tk.tokens == nil {
		return -1
	}
	p := tk.parts[0]
	hs, err := statecheck.Holders(m.ctx, m.pair.sides()[0].RDB, p.sem.base)
	if err != nil {
		return -1
	}
	want := fmt.Sprintf("%s %d %s %s", tk.ticket, p.n, tk.p.id, tk.tokens[0])
	for _, h := range hs {
		if h.Member == want && int64(h.Score) > m.nowMs() {
			return 1
		}
	}
	// (m.ends has the lease's expiry even if the keys that held it have
	// expired; the call runs once the replay has expired the keys due by
	// the machine's clock, as Redis does: a key lives until the clock is
	// past its expiry.)
	end, ok := m.ends[tk.ticket]
	if !ok || m.nowMs() >= end+1000 {
		return -1
	}
	at, err := m.pair.sides()[0].RDB.PExpireTime(m.ctx, p.sem.base+":s").Result()
	if err != nil || at <= 0 || at.Milliseconds()-differential.ExpiryShift < m.nowMs() {
		return -1
	}
	return 0
}

func (m *callMachine) newTicket() string {
	m.seq++
	return fmt.Sprintf("T%04dX", m.seq)
}

// group is the multi-request marker of parts (see queue.lua), "" for one.
func group(parts []cpart) string {
	if len(parts) == 1 {
		return ""
	}
	var g []string
	for _, p := range parts {
		g = append(g, p.sem.base, strconv.FormatInt(p.n, 10), strconv.FormatInt(p.sem.cap, 10))
	}
	return strings.Join(g, "\t")
}

func partKeys(parts []cpart) []string {
	var k []string
	for _, p := range parts {
		k = append(k, p.sem.keys()...)
	}
	return k
}

func (m *callMachine) drawProc(t *rapid.T) *cproc {
	return m.procs[rapid.IntRange(0, len(m.procs)-1).Draw(t, "process")]
}

func (m *callMachine) acquire(t *rapid.T) {
	p := m.drawProc(t)
	op := rapid.SampledFrom([]string{"acquire", "acquire", "try"}).Draw(t, "op")
	sems := []*csem{m.sems[rapid.IntRange(0, len(m.sems)-1).Draw(t, "semaphore")]}
	if len(m.sems) > 1 && rapid.IntRange(0, 3).Draw(t, "multi") == 0 {
		sems = m.sems
	}
	var parts []cpart
	for _, s := range sems {
		parts = append(parts, cpart{s, rapid.Int64Range(1, s.cap).Draw(t, "permits")})
	}
	// Now and then a capacity other than the stored one.
	capOf := func(s *csem) int64 { return s.cap }
	if rapid.IntRange(0, 15).Draw(t, "other capacity") == 0 {
		capOf = func(s *csem) int64 { return s.cap + 1 }
	}
	tk := &cticket{ticket: m.newTicket(), p: p, parts: parts}
	args := []string{op, tk.ticket, p.id, num(p.lease), num(p.wait), group(parts)}
	for _, pt := range parts {
		args = append(args, num(pt.n), num(capOf(pt.sem)))
	}
	res, _ := m.exec(call{Keys: partKeys(parts), Args: args}).([]any)
	if len(res) == 0 {
		return // an error (a capacity mismatch)
	}
	switch code, _ := res[0].(int64); code {
	case ops.AcqGranted, ops.AcqGrantedBefore:
		for _, v := range res[3:] {
			tk.tokens = append(tk.tokens, fmt.Sprint(v))
		}
		m.holding = append(m.holding, tk)
	case ops.AcqQueued:
		m.waiting = append(m.waiting, tk)
	}
}

func num(n int64) string { return strconv.FormatInt(n, 10) }

// releaseArgs renders release.lua's arguments for tk.
func releaseArgs(op string, tk *cticket, lease int64) []string {
	ann := "0"
	if tk.announced {
		ann = "1"
	}
	args := []string{op, tk.ticket, tk.p.id, num(lease), num(tk.p.wait), group(tk.parts), ann}
	for i, pt := range tk.parts {
		tok := "0"
		if tk.tokens != nil {
			tok = tk.tokens[i]
		}
		args = append(args, num(pt.n), tok)
	}
	return args
}

func (m *callMachine) release(t *rapid.T) {
	if len(m.holding) == 0 {
		t.Skip("no holder")
	}
	i := rapid.IntRange(0, len(m.holding)-1).Draw(t, "holder")
	tk := m.holding[i]
	op := rapid.SampledFrom([]string{"release", "release", "renew", "leave"}).Draw(t, "op")
	want := m.releaseWants(tk)
	res := m.exec(call{Keys: partKeys(tk.parts), Args: releaseArgs(op, tk, tk.p.lease)})
	if r, ok := res.([]any); ok && len(r) > 0 && op == "release" && want >= 0 {
		// A release answers whether the lease was live: a lease that
		// ended otherwise left a tombstone that says so.
		if got, ok := r[0].(int64); ok && got != want {
			t.Fatalf("release of %s answered %d, want %d (its lease %s)", tk.ticket, got, want, map[int64]string{0: "ended", 1: "lives"}[want])
		}
	}
	if op == "renew" {
		tk.announced = false
		return
	}
	m.holding = slices.Delete(m.holding, i, i+1)
}

// renewBatch renews some of one process's single-semaphore leases on one
// semaphore in one script.
func (m *callMachine) renewBatch(t *rapid.T) {
	p := m.drawProc(t)
	s := m.sems[rapid.IntRange(0, len(m.sems)-1).Draw(t, "semaphore")]
	args := []string{"renew_batch", p.id}
	for _, tk := range m.holding {
		if tk.p == p && len(tk.parts) == 1 && tk.parts[0].sem == s && rapid.Bool().Draw(t, "in batch") {
			ann := "0"
			if tk.announced {
				ann = "1"
			}
			args = append(args, tk.ticket, num(tk.parts[0].n), tk.tokens[0], ann, num(p.lease))
			tk.announced = false
		}
	}
	m.exec(call{Keys: s.keys(), Args: args})
}

func (m *callMachine) leave(t *rapid.T) {
	if len(m.waiting) == 0 {
		t.Skip("no waiter")
	}
	i := rapid.IntRange(0, len(m.waiting)-1).Draw(t, "waiter")
	tk := m.waiting[i]
	keys := partKeys(tk.parts)
	if tk.cond != "" {
		keys = append(keys, condKeys(keys0(tk), tk.cond[2:])...)
	}
	m.exec(call{Keys: keys, Args: releaseArgs("leave", tk, tk.p.lease)})
	m.waiting = slices.Delete(m.waiting, i, i+1)
	if m.isBarrierWaiter(tk) {
		m.barrierLeft(tk)
	}
}

// keys0 returns the engine's keys of tk's first semaphore.
func keys0(tk *cticket) keyspace.Keys {
	return keyspace.Keys{Base: tk.parts[0].sem.base, All: tk.parts[0].sem.keys()}
}

// refresh refreshes a process's waiters on one semaphore (those whose
// first semaphore it is), and learns which were granted or dropped.
func (m *callMachine) refresh(t *rapid.T) {
	m.refreshOf(m.drawProc(t), m.sems[rapid.IntRange(0, len(m.sems)-1).Draw(t, "semaphore")])
}

// overdue moves the clock just past the expiry of a lease on a semaphore
// a ticket waits on, and has the waiter's process refresh that semaphore
// at once, before any other call grants the freed permits: the edge where
// a refresh's own run grants the waiters it refreshes (and must say so,
// as a copy of it would), which a separate advance and refresh reach
// only when no call comes between them.
func (m *callMachine) overdue(t *rapid.T) {
	var queued []*cticket
	for _, tk := range m.waiting {
		if tk.cond == "" {
			queued = append(queued, tk)
		}
	}
	if len(queued) == 0 {
		t.Skip("no queued waiter")
	}
	tk := queued[rapid.IntRange(0, len(queued)-1).Draw(t, "waiter")]
	s := tk.parts[0].sem
	hs, err := statecheck.Holders(m.ctx, m.pair.sides()[0].RDB, s.base)
	if err != nil {
		t.Fatal(err)
	}
	// An expiry within the waiter's life, which a refresh now renews.
	var ahead []int64
	for _, h := range hs {
		if at := int64(h.Score); at >= m.nowMs() && at+1 < m.nowMs()+tk.p.wait {
			ahead = append(ahead, at)
		}
	}
	if len(ahead) == 0 {
		t.Skip("no lease's expiry within the waiter's TTL")
	}
	m.refreshOf(tk.p, s)
	at := ahead[rapid.IntRange(0, len(ahead)-1).Draw(t, "expiry")] + rapid.Int64Range(0, 1).Draw(t, "past")
	m.now = max(m.now, at*1000+rapid.Int64Range(0, 999).Draw(t, "µs"))
	m.refreshOf(tk.p, s)
}

// refreshOf has process p refresh its waiters whose first semaphore is s.
func (m *callMachine) refreshOf(p *cproc, s *csem) {
	args := []string{"refresh", p.id, num(p.lease), num(p.wait)}
	for _, tk := range m.waiting {
		if tk.p == p && tk.parts[0].sem == s {
			args = append(args, tk.ticket, num(tk.parts[0].n), group(tk.parts))
		}
	}
	res, _ := m.exec(call{Keys: s.keys(), Args: args}).([]any)
	if len(res) < 2 {
		return
	}
	gone, _ := res[1].([]any)
	for i := 0; i+1 < len(gone); i += 2 {
		m.learn(fmt.Sprint(gone[i]), fmt.Sprint(gone[i+1]))
	}
}

// learn moves a waiting ticket to holding ("expiry token..."), or drops it
// ("0").
func (m *callMachine) learn(ticket, grant string) {
	i := slices.IndexFunc(m.waiting, func(tk *cticket) bool { return tk.ticket == ticket })
	if i < 0 {
		return
	}
	tk := m.waiting[i]
	if m.latchWoken(ticket) || m.barrierWoken(ticket, grant) {
		return // the latch opened, or the barrier's round ended: nothing is granted
	}
	m.waiting = slices.Delete(m.waiting, i, i+1)
	f := strings.Fields(grant)
	if len(f) < 2 {
		return
	}
	if e, err := strconv.ParseInt(f[0], 10, 64); err == nil && m.told != nil {
		m.told[ticket] = e
	}
	tk.tokens, tk.announced, tk.heard, tk.cond = f[1:], true, true, ""
	m.holding = append(m.holding, tk)
}

// wakeLists returns the wake lists of process p on the machine's
// semaphores: its one list, if it has one, and each semaphore's own.
func (m *callMachine) wakeLists(p *cproc) []string {
	var lists []string
	for _, s := range m.wakeSems() {
		k := keyspace.Keys{Base: s.base}
		for _, l := range []string{k.Wake(p.id), k.OwnWake(p.id)} {
			if !slices.Contains(lists, l) {
				lists = append(lists, l)
			}
		}
	}
	return lists
}

// hear pops a process's wake lists on both replayers, as its listener
// does, and learns the grants. A process with one list for every
// semaphore finds nothing on a semaphore's own list unless another
// program's value held its one list (planted by a foreignPair): the
// scripts push where its listener reads.
func (m *callMachine) hear(t *rapid.T) {
	p := m.drawProc(t)
	_, planting := m.pair.(*foreignPair)
	for _, list := range m.wakeLists(p) {
		sides := m.pair.sides()
		got := make([][]string, len(sides))
		for j, r := range sides {
			got[j], _ = r.RDB.LPopCount(m.ctx, list, 1000).Result()
		}
		for j := 1; j < len(sides); j++ {
			if !slices.Equal(got[0], got[j]) {
				t.Fatalf("wake list %s: %s %q, %s %q", list, sides[0].Name, got[0], sides[j].Name, got[j])
			}
		}
		for _, s := range m.wakeSems() {
			k := keyspace.Keys{Base: s.base}
			if !planting && len(got[0]) > 0 && list == k.OwnWake(p.id) && list != k.Wake(p.id) {
				t.Fatalf("wake list %s holds %q, but process %s hears its grants on %s", list, got[0], p.id, k.Wake(p.id))
			}
		}
		for _, w := range got[0] {
			tk, rest, _ := strings.Cut(w, " ")
			m.learn(tk, rest)
		}
	}
}

func (m *callMachine) pump(t *rapid.T) {
	s := m.sems[rapid.IntRange(0, len(m.sems)-1).Draw(t, "semaphore")]
	m.exec(call{Keys: s.keys(), Args: []string{"pump"}})
}

func (m *callMachine) status(t *rapid.T) {
	s := m.sems[rapid.IntRange(0, len(m.sems)-1).Draw(t, "semaphore")]
	m.exec(call{Keys: s.keys(), Args: []string{"status"}})
}

// condWait releases a lease of one semaphore and waits on its condition.
func (m *callMachine) condWait(t *rapid.T) {
	var single []int
	for i, tk := range m.holding {
		if len(tk.parts) == 1 {
			single = append(single, i)
		}
	}
	if len(single) == 0 {
		t.Skip("no holder of one semaphore")
	}
	i := single[rapid.IntRange(0, len(single)-1).Draw(t, "holder")]
	tk := m.holding[i]
	cond := rapid.SampledFrom([]string{"", "x"}).Draw(t, "condition")
	fresh := &cticket{ticket: m.newTicket(), p: tk.p, parts: tk.parts, cond: "c:" + cond}
	args := append(releaseArgs("wait", tk, tk.p.lease), fresh.ticket, cond)
	keys := append(tk.parts[0].sem.keys(), condKeys(keys0(tk), cond)...)
	res, _ := m.exec(call{Keys: keys, Args: args}).([]any)
	m.holding = slices.Delete(m.holding, i, i+1)
	if len(res) > 0 && res[0] == int64(1) {
		m.waiting = append(m.waiting, fresh)
		if m.waited == nil {
			m.waited = map[string]bool{}
		}
		m.waited[fresh.ticket] = true
	}
}

func (m *callMachine) signal(t *rapid.T) {
	s := m.sems[rapid.IntRange(0, len(m.sems)-1).Draw(t, "semaphore")]
	cond := rapid.SampledFrom([]string{"", "x"}).Draw(t, "condition")
	mode := rapid.SampledFrom([]string{"1", "all"}).Draw(t, "mode")
	keys := append(s.keys(), condKeys(keyspace.Keys{Base: s.base, All: s.keys()}, cond)...)
	res, _ := m.exec(call{Keys: keys, Args: []string{"signal", cond, mode, "", m.newTicket()}}).([]any)
	if len(res) < 1 {
		return
	}
	// The woken move to the queue (or are granted): no longer on the
	// condition; a refresh or the wake list tells the rest.
	if n, _ := res[0].(int64); n > 0 {
		for _, tk := range m.waiting {
			if tk.cond == "c:"+cond && tk.parts[0].sem == s && n > 0 {
				tk.cond = ""
				n--
			}
		}
	}
}

// lapse moves the clock just past the deadline of a waiter queued on a
// holder's semaphore and has the holder release at once, before any other
// call drops the dead waiter: the edge where a release finds the queue's
// head (or a waiter behind it) dead, which a separate advance and release
// reach only when no call comes between them.
func (m *callMachine) lapse(t *rapid.T) {
	if len(m.holding) == 0 {
		t.Skip("no holder")
	}
	i := rapid.IntRange(0, len(m.holding)-1).Draw(t, "holder")
	tk := m.holding[i]
	s := tk.parts[rapid.IntRange(0, len(tk.parts)-1).Draw(t, "part")].sem
	// The waiters' processes' liveness deadlines there.
	st, err := m.pair.sides()[0].RDB.HGetAll(m.ctx, s.base+":s").Result()
	if err != nil {
		t.Fatal(err)
	}
	var ahead []int64
	for f, v := range st {
		if !strings.HasPrefix(f, statecheck.LiveField("")) {
			continue
		}
		if at, _, ok := statecheck.ParseLive(v); ok && at >= m.nowMs() {
			ahead = append(ahead, at)
		}
	}
	slices.Sort(ahead)
	ahead = ahead[:min(len(ahead), 3)]
	if len(ahead) == 0 {
		t.Skip("no waiter's deadline ahead")
	}
	at := ahead[rapid.IntRange(0, len(ahead)-1).Draw(t, "deadline")] + rapid.Int64Range(0, 1).Draw(t, "past")
	m.now = max(m.now, at*1000+rapid.Int64Range(0, 999).Draw(t, "µs"))
	m.exec(call{Keys: partKeys(tk.parts), Args: releaseArgs("release", tk, tk.p.lease)})
	m.holding = slices.Delete(m.holding, i, i+1)
}

// copyWindow is how long after a call was sent a copy of it may still
// run: within the shortest life of a tombstone (lua TOMB_MS / 2, 10 s,
// less a margin), the promise that a call runs once covers it. (A copy
// needs its connection open; go-redis closes one whose reply is late.)
const copyWindow = 9500 * time.Millisecond

// recent reports whether c was sent within copyWindow of the clock (for
// resendAcquire, whose copies may be of any earlier acquire).
func (m *callMachine) recent(c call) bool {
	sec, _ := strconv.ParseInt(c.Time[0], 10, 64)
	us, _ := strconv.ParseInt(c.Time[1], 10, 64)
	return m.now-(sec*1e6+us) < copyWindow.Microseconds()
}

// resend sends one of the last calls again, now. (However long ago it
// was sent: a call about a ticket whose tombstone is due to be trimmed is
// also what a late release of an old lease makes. A count down is the
// exception, see resendDown, and so are the barrier's calls.)
func (m *callMachine) resend(t *rapid.T) {
	if len(m.sent) == 0 {
		t.Skip("nothing sent")
	}
	back := rapid.IntRange(1, min(len(m.sent), 6)).Draw(t, "calls back")
	c := m.sent[len(m.sent)-back]
	switch c.Op() {
	case "latch_down":
		m.resendDown(t, c) // within the copy window only
		return
	case "barrier_await", "barrier_break":
		// A copy may end a round the model would not see end: the
		// barrier's copies are the resend pair's (TestResentCallsActOnce).
		t.Skip("a barrier call's copy")
	}
	m.exec(call{Script: c.Script, Keys: c.Keys, Args: c.Args})
}

// resendAcquire sends an earlier acquire again, now, any sent within
// copyWindow: a copy delayed in the network, which may come after its
// grant was handed over, confirmed and released. A copy that comes
// while its ticket's lease lives must find that grant (answer "granted
// already", with its tokens) and so change nothing; it must not be taken
// for a new request.
func (m *callMachine) resendAcquire(t *rapid.T) {
	var acquires []call
	for _, c := range m.sent {
		if len(c.Args) > 0 && (c.Args[0] == "acquire" || c.Args[0] == "try") && m.recent(c) {
			acquires = append(acquires, c)
		}
	}
	if len(acquires) == 0 {
		t.Skip("no acquire sent")
	}
	// Most often a holder's, granted on a wake list if any: the copies
	// that may be taken for new requests.
	var holders, heard []call
	for _, c := range acquires {
		for _, tk := range m.holding {
			if tk.ticket == c.Args[1] {
				holders = append(holders, c)
				if tk.heard {
					heard = append(heard, c)
				}
			}
		}
	}
	switch rapid.IntRange(0, 3).Draw(t, "whose") {
	case 0:
	case 1:
		if len(holders) > 0 {
			acquires = holders
		}
	default:
		if len(heard) > 0 {
			acquires = heard
		} else if len(holders) > 0 {
			acquires = holders
		}
	}
	c := acquires[rapid.IntRange(0, len(acquires)-1).Draw(t, "acquire")]
	var held *cticket
	for _, tk := range m.holding {
		if tk.ticket == c.Args[1] && m.live(tk) {
			held = tk
		}
	}
	if held != nil && held.announced && rapid.Bool().Draw(t, "confirmed first") {
		// Its holder confirms the grant (a renewal, alone or in a batch),
		// then the copy comes.
		if len(held.parts) == 1 && rapid.Bool().Draw(t, "in a batch") {
			m.exec(call{Keys: held.parts[0].sem.keys(), Args: []string{"renew_batch", held.p.id, held.ticket, num(held.parts[0].n), held.tokens[0], "1", num(held.p.lease)}})
		} else {
			m.exec(call{Keys: partKeys(held.parts), Args: releaseArgs("renew", held, held.p.lease)})
		}
		held.announced = false
	}
	res, ok := m.exec(call{Script: c.Script, Keys: c.Keys, Args: c.Args}).([]any)
	if held == nil || !ok {
		return // (or refused: another program's key, say)
	}
	var tokens []string
	for _, v := range res[min(3, len(res)):] {
		tokens = append(tokens, fmt.Sprint(v))
	}
	if len(res) == 0 || res[0] != int64(ops.AcqGrantedBefore) || !slices.Equal(tokens, held.tokens) {
		t.Fatalf("a late copy of the acquire of %s, whose lease (tokens %v) lives, answered %v: taken for a new request", held.ticket, held.tokens, res)
	}
}

// resendWait sends an earlier condition wait again, now, any sent within
// copyWindow: a copy delayed in the network, which may come after its new
// ticket was signalled, queued, granted, or ended. A copy whose new ticket
// the first run made wait must answer 1 ("waiting") and change nothing,
// wherever that ticket is now; on the resend pair, a copy and its copy
// must answer alike (a ticket the copy's own queue run ends must not turn
// the second copy's answer).
func (m *callMachine) resendWait(t *rapid.T) {
	var waits []call
	for _, c := range m.sent {
		if len(c.Args) > 0 && c.Args[0] == "wait" && m.recent(c) {
			waits = append(waits, c)
		}
	}
	if len(waits) == 0 {
		t.Skip("no wait sent")
	}
	c := waits[rapid.IntRange(0, len(waits)-1).Draw(t, "wait")]
	fresh := c.Args[len(c.Args)-2]
	// The database as the copy finds it: with the keys due by now expired.
	if err := m.pair.sides()[0].Prepare(m.ctx, call{Time: m.clockArgs()}); err != nil {
		t.Fatal(err)
	}
	where := m.traceOf(c, fresh)
	// Nor a trace of the lease the first run released (a late copy of
	// its acquire may have granted the ticket again since).
	gone := where == "" && m.waited[fresh] && m.traceOf(c, c.Args[1]) == ""
	res, ok := m.exec(call{Script: c.Script, Keys: c.Keys, Args: c.Args}).([]any)
	if where != "" && ok && len(res) > 0 && res[0] != int64(1) {
		t.Fatalf("a late copy of a condition wait whose new ticket %s is %s answered %v, want 1 (the first run made it wait)", fresh, where, res)
	}
	if gone && ok && len(res) > 0 && res[0] == int64(0) {
		t.Fatalf("a late copy of a condition wait whose first run released the lease and made the new ticket %s wait, which has ended with no trace, answered %v, want %d (no trace: the caller decides)", fresh, res, ops.ReleasedNoTrace)
	}
}

// traceOf says where the first replayer's database shows ticket, which a
// condition wait c made: on c's condition, in its semaphore's queue or
// among its holders, or recorded in its state hash; "" for nowhere.
func (m *callMachine) traceOf(c call, ticket string) string {
	rdb := m.pair.sides()[0].RDB
	mine := func(member string) bool { return strings.HasPrefix(member, ticket+" ") }
	for _, k := range []struct{ key, what string }{{c.Keys[5], "on its condition"}, {c.Keys[1], "queued"}} {
		if ms, err := rdb.ZRange(m.ctx, k.key, 0, -1).Result(); err == nil && slices.ContainsFunc(ms, mine) {
			return k.what
		}
	}
	base := strings.TrimSuffix(c.Keys[0], ":s")
	if hs, err := statecheck.Holders(m.ctx, rdb, base); err == nil {
		for _, h := range hs {
			if mine(fmt.Sprint(h.Member)) {
				return "a holder"
			}
		}
	}
	if ok, err := rdb.HExists(m.ctx, c.Keys[0], ticket).Result(); err == nil && ok {
		return "recorded in its state hash"
	}
	return ""
}

// live reports whether tk's lease lives on every part, by the first
// database and the machine's clock.
func (m *callMachine) live(tk *cticket) bool {
	for i, p := range tk.parts {
		hs, err := statecheck.Holders(m.ctx, m.pair.sides()[0].RDB, p.sem.base)
		if err != nil {
			return false
		}
		want, at := fmt.Sprintf("%s %d %s %s", tk.ticket, p.n, tk.p.id, tk.tokens[i]), int64(0)
		for _, h := range hs {
			if h.Member == want {
				at = int64(h.Score)
			}
		}
		if at <= m.nowMs() {
			return false
		}
	}
	return true
}

// advance moves the clock: a little, or just past the next time any of
// the semaphores' sorted sets holds (a lease expiry, a waiter deadline, a
// tombstone's end), or a long way.
func (m *callMachine) advance(t *rapid.T) {
	var d int64
	switch rapid.IntRange(0, 3).Draw(t, "how") {
	case 0:
		d = rapid.Int64Range(1, 400).Draw(t, "ms")
	case 1:
		d = rapid.Int64Range(0, 40000).Draw(t, "ms")
	default:
		var next []int64
		for _, s := range m.sems {
			for _, k := range s.keys()[2:] {
				zs, err := m.pair.sides()[0].RDB.ZRangeWithScores(m.ctx, k, 0, -1).Result()
				if err != nil {
					continue
				}
				for _, z := range zs {
					if int64(z.Score) >= m.nowMs() && int64(z.Score) < m.nowMs()+100000 {
						next = append(next, int64(z.Score))
					}
				}
			}
		}
		if len(next) == 0 {
			t.Skip("nothing due ahead")
		}
		slices.Sort(next)
		at := next[rapid.IntRange(0, min(len(next), 3)-1).Draw(t, "which")]
		d = at - m.nowMs() + rapid.Int64Range(0, 1).Draw(t, "past")
	}
	m.now += d*1000 + rapid.Int64Range(0, 999).Draw(t, "µs")
}

// runCallMachine runs one call machine on pair and returns how many calls
// it made; started (if any) sees the machine before its first call.
func runCallMachine(rt *rapid.T, pair callSides, started ...func(*callMachine)) int {
	ctx := context.Background()
	for _, r := range pair.sides() {
		if err := r.RDB.FlushDB(ctx).Err(); err != nil {
			rt.Fatal(err)
		}
	}
	// The clock starts at the real one's second (the replayers move key
	// expiries a day past the recorded clock, which must keep them ahead
	// of the real), at a drawn microsecond: where in a millisecond the
	// calls fall decides how their times round, which a replay of a
	// failure must repeat.
	start := time.Now().Truncate(time.Second).UnixMicro() + rapid.Int64Range(0, 999999).Draw(rt, "clock µs")
	m := &callMachine{ctx: ctx, t: rt, pair: pair, now: start}
	for i := range rapid.IntRange(1, 2).Draw(rt, "semaphores") {
		name := fmt.Sprintf("c%d", i)
		m.sems = append(m.sems, &csem{name: name, base: callPrefix + "{" + name + "}", cap: rapid.Int64Range(1, 4).Draw(rt, "capacity")})
	}
	for i := range rapid.IntRange(1, 4).Draw(rt, "processes") {
		id := fmt.Sprintf("P%dID", i)
		if i%2 == 1 {
			// A client on one server: one wake list for every semaphore
			// (keyspace.Keys.Wake), under the prefix "cm:".
			id = keyspace.ProcessListMark(callPrefix) + id
		}
		m.procs = append(m.procs, &cproc{
			id: id,
			// (A lease of minutes gives keys a TTL that an idle
			// semaphore's lowers: keys_exp's idle rule.)
			lease: rapid.SampledFrom([]int64{300, 1000, 5000, 200000}).Draw(rt, "lease TTL"),
			wait:  rapid.SampledFrom([]int64{200, 600, 3000}).Draw(rt, "waiter TTL"),
		})
	}
	m.newCallLatch(rt)
	m.newCallBarrier(rt)
	for _, f := range started {
		f(m)
	}
	rt.Repeat(map[string]func(*rapid.T){
		"latch":        m.latchCall,
		"barrier":      m.barrierCall,
		"acquire":      m.acquire,
		"release":      m.release,
		"renew batch":  m.renewBatch,
		"leave":        m.leave,
		"refresh":      m.refresh,
		"hear":         m.hear,
		"pump":         m.pump,
		"status":       m.status,
		"wait":         m.condWait,
		"signal":       m.signal,
		"resend":       m.resend,
		"late acquire": m.resendAcquire,
		"late wait":    m.resendWait,
		"lapse":        m.lapse,
		"overdue":      m.overdue,
		"advance":      m.advance,
		"":             func(*rapid.T) {},
	})
	return len(m.sent)
}

// diffCalls runs call machines on replayPairs with every script passed
// through inner (a mutation, or nil), reporting to tb.
func diffCalls(t *testing.T, tb rapid.TB, checks int, inner func(string) string) {
	pairs := replayPairs(t, inner)
	if checks > 0 {
		setFlag(t, "rapid.checks", strconv.Itoa(checks))
	}
	for _, p := range pairs {
		if tb.Failed() {
			return
		}
		var calls, fast int
		rapid.Check(tb, func(rt *rapid.T) {
			n := runCallMachine(rt, p)
			calls += n
			fast += p.FastCount(context.Background())
		})
		t.Logf("%s: %d calls (%d answered by a fast path)", p.Backend, calls, fast)
	}
}
