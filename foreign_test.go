package fairlock

// Another program's keys. fairlock's keys live under its prefix, but
// nothing stops another program (or an operator) writing a key there, of
// any type. Redis does not roll a script back, so a script that fails on
// such a key after its first write leaves half its change behind (THE
// RULE in queue.lua). The class is every op × every key it may touch ×
// every other type, on the fast and the general path: each must either
// refuse, naming the key and changing nothing, or do exactly what it
// would have done without touching that key (a wake-up lost to a foreign
// wake list is such a case: the waiter's refresh finds its grant).
//
// TestForeignKeys checks the class two ways, each with the fast paths on
// and off, on miniredis and the real server:
//   - a table of scenarios (an uncontended lock, a handoff, a try, a
//     counting semaphore, a multi-lock, a read-write mutex, a condition
//     variable, renewals, refreshes, withdrawals, expiry, a dead waiter,
//     tombstones, status, resends) where, before every call, each key of
//     the scenario in turn holds a value of each other type;
//   - the call machine (differential_calls_test.go), its calls drawn at
//     random, a key and a type drawn before each call.
// Both compare with the same call on a copy of the database without the
// planted key (the clock is the recorded one: see replayed).
//
// Another release of fairlock is the same class with one more "type": a
// state hash in another key layout (otherLayout: the previous layout's,
// 2, its other fields as they were), which every call that reads it must
// refuse, naming it, before it writes anything.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// fkey is a key fairlock may touch and the type it keeps there.
type fkey struct{ key, kind string }

// foreignTypes are the types another program's key may have.
var foreignTypes = []string{"string", "list", "set", "zset", "hash", "stream"}

// semKeys returns the keys of semaphore s that a call may touch: its five,
// its conditions' ("" and "x"), and the wake lists of procs.
func semKeys(s *csem, procs []*cproc) []fkey {
	k := []fkey{{s.base + ":s", "hash"}}
	for _, z := range s.keys()[1:] {
		k = append(k, fkey{z, "zset"})
	}
	for _, c := range []string{"", "x"} {
		k = append(k, fkey{condKeys(keyspace.Keys{Base: s.base}, c)[0], "zset"})
	}
	for _, p := range procs {
		// The list the process hears its grants on: its one list, if it
		// has one (keyspace.Keys.Wake), else the semaphore's own. (Its own list
		// beside its one list takes pushes only while the one list holds
		// another program's value; TestForeignWakeListDoesNotDeafenOthers
		// plants at both.)
		if l := (keyspace.Keys{Base: s.base}).Wake(p.id); !slices.ContainsFunc(k, func(f fkey) bool { return f.key == l }) {
			k = append(k, fkey{l, "list"})
		}
	}
	// A latch's count, when s is a latch's waiters (latchOf).
	if strings.HasSuffix(s.base, keyspace.Sep+kindLatch) {
		k = append(k, fkey{s.base, "hash"})
	}
	// A barrier's state, when s is a barrier's waiters (barrierOf).
	if strings.HasSuffix(s.base, keyspace.Sep+kindBarrier) {
		k = append(k, fkey{s.base, "hash"})
	}
	// An election's record (the leader ops).
	return append(k, fkey{(keyspace.Keys{Base: s.base}).Derived(keyspace.KindLeader), "hash"})
}

// otherLayout is the planted "type" of a state hash written by a release
// of fairlock with another key layout: the previous layout's, 2
// (check_layout refuses any other value, and a hash without the field,
// the first layout's, the same way: TestAnotherLayoutRefused).
const otherLayout = "layout"

// plantsFor returns the types that may be planted at k: every other type,
// and for a state hash another release's layout.
func plantsFor(k fkey) []string {
	t := slices.DeleteFunc(slices.Clone(foreignTypes), func(t string) bool { return t == k.kind })
	if strings.HasSuffix(k.key, ":s") {
		t = append(t, otherLayout)
	}
	return t
}

// plantScript puts a value of type ARGV[1] at KEYS[1], replacing what is
// there; otherLayout makes the hash there the previous layout's: its
// 'layout' field says 2, its other fields kept (a hash of that layout
// always holds its sequence and expiry: a missing one is made so).
var plantScript = redis.NewScript(`
local k, t = KEYS[1], ARGV[1]
if t == 'layout' then
  if redis.call('EXISTS', k) == 0 then redis.call('HSET', k, 'seq', '1', 'exp', '1') end
  redis.call('HSET', k, 'layout', '2')
  return 1
end
redis.call('DEL', k)
if t == 'string' then redis.call('SET', k, 'another program')
elseif t == 'list' then redis.call('RPUSH', k, 'another program')
elseif t == 'set' then redis.call('SADD', k, 'another program')
elseif t == 'zset' then redis.call('ZADD', k, 1, 'another program')
elseif t == 'hash' then redis.call('HSET', k, 'another', 'program')
elseif t == 'stream' then redis.call('XADD', k, '*', 'another', 'program')
end
return 1`)

// copyScript copies every key but the tests' own to database ARGV[1].
var copyScript = redis.NewScript(`
for _, k in ipairs(redis.call('KEYS', '*')) do
  if string.sub(k, 1, 7) ~= 'fltest:' then redis.call('COPY', k, k, 'DB', ARGV[1], 'REPLACE') end
end
return 1`)

// foreignPair runs calls on a clean database and on a copy of it where
// another program's key has been planted, and checks the second against
// the first.
type foreignPair struct {
	backend    string
	clean, inj *replayer
	// candidates returns the keys that may be planted before a call.
	candidates func() []fkey
	// rt draws, in the call machine, whether and where to plant; all
	// plants every candidate × type in turn (the table).
	rt  *rapid.T
	all bool
	// oneType plants one of the other types per key and call (in turn)
	// rather than each: the interpreted Lua of miniredis is slow.
	oneType bool
	// planted counts the calls run with a planted key, refused the
	// calls that refused it, by op.
	planted, refused map[string]int
}

func newForeignPair(t testing.TB, real, fast bool, broken func(string) string) *foreignPair {
	t.Helper()
	name, addr := "redis-server", ""
	dbClean, dbInj := 12, 13
	if real {
		addr = redistest.RealBackend(t).Addr
	} else {
		name = "miniredis"
		m := miniredis.RunT(t)
		m.SetTime(time.Now()) // fixed, so that expiries read back exactly
		addr, dbClean, dbInj = m.Addr(), 1, 2
	}
	inner := testhook.NoFastPaths
	if fast {
		inner = nil
		name += ", fast paths on"
	} else {
		name += ", fast paths off"
	}
	mk := func(side string, db int, transform func(string) string) *replayer {
		r := newReplayer(t, side, addr, db, replayed(transform))
		r.RDB.FlushDB(context.Background())
		return r
	}
	// The clean side runs the scripts as they are; the planted side with a
	// guard broken, when a test breaks one.
	return &foreignPair{
		backend: name, clean: mk("clean", dbClean, inner), inj: mk("another program's key planted", dbInj, compose(broken, inner)),
		planted: map[string]int{}, refused: map[string]int{},
	}
}

func (p *foreignPair) sides() []*replayer { return []*replayer{p.clean, p.inj} }

// sync makes the planted side a copy of the clean one.
func (p *foreignPair) sync(ctx context.Context) error {
	if err := p.inj.RDB.FlushDB(ctx).Err(); err != nil {
		return err
	}
	return copyScript.Run(ctx, p.clean.RDB, nil, p.inj.RDB.Options().DB).Err()
}

// run runs c on r at c's clock and renders its reply.
func (p *foreignPair) run(ctx context.Context, r *replayer, c call) (string, any, error) {
	if err := r.Prepare(ctx, c); err != nil {
		return "", nil, err
	}
	return p.runPrepared(ctx, r, c)
}

// runPrepared runs c on r, whose clock prepare has set, and renders its
// reply.
func (p *foreignPair) runPrepared(ctx context.Context, r *replayer, c call) (string, any, error) {
	out, err := r.Run(ctx, c)
	return fmt.Sprintf("%#v (error %v)", out, err), out, err
}

// blocks splits a dump (dumpScript) into each key's lines.
func blocks(dump string) map[string]string {
	out := map[string]string{}
	key := ""
	for _, line := range strings.Split(dump, "\n") {
		if line == "" {
			continue
		}
		if !strings.HasPrefix(line, "  ") {
			key, _, _ = strings.Cut(line, " ")
		}
		out[key] += line + "\n"
	}
	return out
}

// isProcessList reports whether key is a client's one wake list
// (keyspace.Keys.Wake: the key prefix, then "{w:" and the client id that begins
// with the prefix's length, then "}").
func isProcessList(key string) bool {
	i := strings.Index(key, "{w:/")
	if i < 0 || !strings.HasSuffix(key, "}") {
		return false
	}
	n, ok := keyspace.ProcessListPrefix(key[i+3 : len(key)-1])
	return ok && n == i
}

// movedWakeUps checks a call's run with another program's value at
// list, a client's one wake list, against the clean run (pre the state
// both started from, after the clean run's, now the planted run's): the
// other keys are as the clean run left them, but for the client's own
// lists on each semaphore. Each wake-up the clean run pushed onto list is
// pushed instead onto the own list of the semaphore where its ticket
// waited (the first of a multi-lock's), after what that list held, and
// a list that took any has the expiry the clean run gave list.
func movedWakeUps(list, pre, after, now string) error {
	id := list[strings.Index(list, "{w:")+3 : len(list)-1]
	own := func(dumps ...string) []string {
		ks := []string{list}
		for _, d := range dumps {
			for k := range blocks(d) {
				if strings.HasSuffix(k, keyspace.DerivedKey("", keyspace.KindWake, id)) && !slices.Contains(ks, k) {
					ks = append(ks, k)
				}
			}
		}
		return ks
	}
	ks := own(after, now)
	if a, b := without(after, ks...), without(now, ks...); a != b {
		return fmt.Errorf("the other keys differ from the clean run's (clean -, planted +):\n%s", lineDiff(a, b))
	}
	// header returns a key's first line (type and expiry), entries the
	// rest.
	header := func(dump, k string) string {
		h, _, _ := strings.Cut(blocks(dump)[k], "\n")
		return h
	}
	entries := func(dump, k string) []string {
		var out []string
		b := strings.TrimSuffix(blocks(dump)[k], "\n")
		for _, l := range strings.Split(b, "\n")[1:] {
			out = append(out, strings.TrimSpace(l))
		}
		return out
	}
	want := map[string][]string{}
	for _, k := range ks[1:] {
		want[k] = entries(after, k)
	}
	earlier := entries(pre, list)
	for _, e := range entries(after, list) {
		if i := slices.Index(earlier, e); i >= 0 {
			earlier = slices.Delete(earlier, i, i+1)
			continue
		}
		ticket := strings.Fields(strings.Trim(e, "[]"))[0]
		base := waitedOn(pre, ticket)
		if base == "" {
			return fmt.Errorf("wake-up %s: its ticket waited nowhere before the call", e)
		}
		own := keyspace.DerivedKey(base, keyspace.KindWake, id)
		want[own] = append(want[own], e)
	}
	expiry := strings.TrimPrefix(header(after, list), list+" list ")
	for k, w := range want {
		got := entries(now, k)
		if !slices.Equal(got, w) {
			return fmt.Errorf("own wake list %s holds %q; want %q (what it held, then the wake-ups the clean run pushed onto %s for its semaphore)", k, got, w, list)
		}
		if len(w) > len(entries(after, k)) {
			if h := header(now, k); h != k+" list "+expiry {
				return fmt.Errorf("own wake list %s: %q; want the expiry the clean run gave %s, %q", k, h, list, expiry)
			}
		}
	}
	return nil
}

// waitedOn returns the base of the semaphore where ticket waited in dump
// (the first of a multi-lock's): the queue or condition holding its
// member, or the first part its member's group names.
func waitedOn(dump, ticket string) string {
	for k, b := range blocks(dump) {
		base, _, isCond := strings.Cut(k, keyspace.DerivedKey("", keyspace.KindCond, ""))
		if !isCond {
			base, _ = strings.CutSuffix(k, ":q")
			if !strings.HasSuffix(k, "}:q") {
				continue
			}
		}
		for _, l := range strings.Split(b, "\n")[1:] {
			f := strings.Fields(l)
			if len(f) < 2 || f[1] != ticket {
				continue
			}
			if _, group, ok := strings.Cut(l, "\t"); ok {
				first, _, _ := strings.Cut(group, "\t")
				return first
			}
			return base
		}
	}
	return ""
}

// without returns dump with keys' lines left out.
func without(dump string, keys ...string) string {
	b := blocks(dump)
	for _, key := range keys {
		delete(b, key)
	}
	var ks []string
	for k := range b {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	var s strings.Builder
	for _, k := range ks {
		s.WriteString(b[k])
	}
	return s.String()
}

// plantAndCheck plants a value of type typ at k on the planted side (a
// copy of the state c starts from), runs c there, and checks the outcome
// against the clean run's reply and dump: c refuses, naming k, and
// changes nothing; or c answers as the clean run did, does to every
// other key what the clean run did, and leaves k as it was.
func (p *foreignPair) plantAndCheck(ctx context.Context, c call, step int, k fkey, typ, reply, after string) error {
	if err := p.sync(ctx); err != nil {
		return err
	}
	// The clock first: it expires the keys due by the call's time, and a
	// state hash marked as another layout's keeps its TTL, so it is
	// marked after, to be there when the call runs.
	if err := p.inj.Prepare(ctx, c); err != nil {
		return err
	}
	pre, err := p.inj.Dump(ctx, "")
	if err != nil {
		return err
	}
	if err := plantScript.Run(ctx, p.inj.RDB, []string{k.key}, typ).Err(); err != nil {
		return err
	}
	before, err := p.inj.Dump(ctx, "")
	if err != nil {
		return err
	}
	got, _, cerr := p.runPrepared(ctx, p.inj, c)
	if cerr != nil && strings.Contains(cerr.Error(), "WRONGTYPE") {
		return fmt.Errorf("%s: step %d: %s\nwith %s at %s: %v (Redis's error, not fairlock's naming the key)", p.backend, step, c, typ, k.key, cerr)
	}
	now, err := p.inj.Dump(ctx, "")
	if err != nil {
		return err
	}
	op := c.Op()
	p.planted[op]++
	if cerr != nil && (strings.HasPrefix(cerr.Error(), "FAIRLOCK_FOREIGN_KEY ") || strings.HasPrefix(cerr.Error(), "FAIRLOCK_LAYOUT ")) {
		p.refused[op]++
		want := fmt.Sprintf("FAIRLOCK_FOREIGN_KEY %s %s %s", typ, k.kind, k.key)
		if typ == otherLayout {
			want = "FAIRLOCK_LAYOUT 2 3 " + k.key
		}
		switch {
		case cerr.Error() != want:
			return fmt.Errorf("%s: step %d: %s\nwith %s at %s: %q, want %q", p.backend, step, c, typ, k.key, cerr, want)
		case now != before:
			return fmt.Errorf("%s: step %d: %s\nwith %s at %s: refused (%v) but changed the database (before -, after +):\n%s",
				p.backend, step, c, typ, k.key, cerr, lineDiff(before, now))
		}
		return nil
	}
	if typ == otherLayout && slices.Contains(c.Keys, k.key) {
		// A call on a semaphore reads its state: it must refuse another
		// layout's, whatever it would have done (a read included).
		return fmt.Errorf("%s: step %d: %s\nwith another release's layout at %s: not refused (%s)", p.backend, step, c, k.key, got)
	}
	switch {
	case got != reply:
		return fmt.Errorf("%s: step %d: %s\nwith %s at %s:\n  reply %s\n  clean %s", p.backend, step, c, typ, k.key, got, reply)
	case blocks(now)[k.key] != blocks(before)[k.key]:
		return fmt.Errorf("%s: step %d: %s\nwith %s at %s: the call changed that key:\n%s",
			p.backend, step, c, typ, k.key, lineDiff(blocks(before)[k.key], blocks(now)[k.key]))
	case isProcessList(k.key):
		// The wake-ups the clean run pushed onto the client's one list
		// go onto the semaphores' own lists of the client instead.
		if err := movedWakeUps(k.key, pre, after, now); err != nil {
			return fmt.Errorf("%s: step %d: %s\nwith %s at %s: %w", p.backend, step, c, typ, k.key, err)
		}
	case without(now, k.key) != without(after, k.key):
		return fmt.Errorf("%s: step %d: %s\nwith %s at %s: the other keys differ from the clean run's (clean -, planted +):\n%s",
			p.backend, step, c, typ, k.key, lineDiff(without(after, k.key), without(now, k.key)))
	}
	return nil
}

// step runs c on the clean side, and on the planted side with another
// program's key planted: every candidate × type in turn (all), one drawn
// (rt), or none; it leaves both sides alike and returns the clean reply.
func (p *foreignPair) step(ctx context.Context, c call, step int) (any, error) {
	var plants []fkey
	var types []string
	switch {
	case p.all:
		for i, k := range p.candidates() {
			others := plantsFor(k)
			if p.oneType {
				// One type per key and call, in turn; another release's
				// layout every time.
				layout := others[len(others)-1] == otherLayout
				others = others[(i+step)%len(others):][:1]
				if layout && others[0] != otherLayout {
					others = append(others, otherLayout)
				}
			}
			for _, typ := range others {
				plants, types = append(plants, k), append(types, typ)
			}
		}
	case p.rt != nil && rapid.IntRange(0, 2).Draw(p.rt, "plant") > 0:
		cands := p.candidates()
		k := cands[rapid.IntRange(0, len(cands)-1).Draw(p.rt, "planted key")]
		typ := rapid.SampledFrom(plantsFor(k)).Draw(p.rt, "planted type")
		plants, types = []fkey{k}, []string{typ}
	}
	// The clean outcome, on the planted side before anything is planted.
	if err := p.sync(ctx); err != nil {
		return nil, err
	}
	reply, _, err := p.run(ctx, p.inj, c)
	if err != nil && !strings.Contains(err.Error(), "FAIRLOCK_") {
		return nil, fmt.Errorf("%s: step %d: %s: %w", p.backend, step, c, err)
	}
	after, err := p.inj.Dump(ctx, "")
	if err != nil {
		return nil, err
	}
	for i, k := range plants {
		if err := p.plantAndCheck(ctx, c, step, k, types[i], reply, after); err != nil {
			return nil, err
		}
	}
	got, out, _ := p.run(ctx, p.clean, c)
	if got != reply {
		return nil, fmt.Errorf("%s: step %d: %s: the clean side answered %s, its copy %s", p.backend, step, c, got, reply)
	}
	return out, p.sync(ctx)
}

// fscen is a scenario of the table: processes and semaphores, and calls
// made one by one at a clock of its own, each checked by its pair.
type fscen struct {
	t    *testing.T
	err  error // the first check that failed; the calls after it are skipped
	ctx  context.Context
	pair *foreignPair
	// via, when set, runs the calls in pair's place: a resendPair
	// (TestResentScenariosActOnce).
	via   callSides
	now   int64 // µs
	seq   int
	steps int
	sems  []*csem
	procs []*cproc
}

func (s *fscen) exec(c call) []any {
	if s.err != nil {
		return nil
	}
	c.Time = []string{strconv.FormatInt(s.now/1e6, 10), strconv.FormatInt(s.now%1e6, 10)}
	s.steps++
	var sides callSides = s.pair
	if s.via != nil {
		sides = s.via
	}
	out, err := sides.step(s.ctx, c, s.steps)
	if err != nil {
		s.err = err
		return nil
	}
	s.now += 1000 // a millisecond between calls
	res, _ := out.([]any)
	return res
}

func (s *fscen) ticket() string {
	s.seq++
	return fmt.Sprintf("F%04dX", s.seq)
}

// acquire asks for permits n[i] of sems[i] ("acquire" or "try"); the
// ticket it returns holds them if granted at once (tokens set).
func (s *fscen) acquire(op string, p *cproc, sems []*csem, n ...int64) *cticket {
	tk := &cticket{ticket: s.ticket(), p: p}
	for i, sem := range sems {
		tk.parts = append(tk.parts, cpart{sem, n[i]})
	}
	return s.resendAcquire(op, tk)
}

func (s *fscen) resendAcquire(op string, tk *cticket) *cticket {
	args := []string{op, tk.ticket, tk.p.id, num(tk.p.lease), num(tk.p.wait), group(tk.parts)}
	for _, pt := range tk.parts {
		args = append(args, num(pt.n), num(pt.sem.cap))
	}
	res := s.exec(call{Keys: partKeys(tk.parts), Args: args})
	if len(res) > 3 {
		if code, _ := res[0].(int64); code == ops.AcqGranted || code == ops.AcqGrantedBefore {
			tk.tokens = nil
			for _, v := range res[3:] {
				tk.tokens = append(tk.tokens, fmt.Sprint(v))
			}
		}
	}
	return tk
}

// op sends release.lua's op ("release", "renew", "leave") for tk.
func (s *fscen) op(op string, tk *cticket) []any {
	keys := partKeys(tk.parts)
	if op == "leave" && tk.cond != "" {
		keys = append(keys, condKeys(keys0(tk), tk.cond[2:])...)
	}
	res := s.exec(call{Keys: keys, Args: releaseArgs(op, tk, tk.p.lease)})
	if op == "renew" {
		tk.announced = false
	}
	return res
}

// hear pops p's wake lists on sem (its one list, if it has one, and
// sem's own) on every side, and gives tk its grant as the first side's
// lists say (a foreignPair's planted side is a copy of its clean side
// made before each call anyway).
func (s *fscen) hear(p *cproc, sem *csem, tks ...*cticket) {
	if s.err != nil {
		return
	}
	k := keyspace.Keys{Base: sem.base}
	var got []string
	for _, list := range []string{k.Wake(p.id), k.OwnWake(p.id)} {
		var sides callSides = s.pair
		if s.via != nil {
			sides = s.via
		}
		for i, side := range sides.sides() {
			g, err := side.RDB.LPopCount(s.ctx, list, 100).Result()
			if err != nil && err != redis.Nil {
				s.err = err
				return
			}
			if i == 0 {
				got = append(got, g...)
			}
		}
		if k.Wake(p.id) == k.OwnWake(p.id) {
			break
		}
	}
	for _, w := range got {
		f := strings.Fields(w)
		for _, tk := range tks {
			if tk.ticket == f[0] {
				tk.tokens, tk.announced, tk.cond = f[2:], true, ""
			}
		}
	}
}

func (s *fscen) refresh(p *cproc, sem *csem, tks ...*cticket) []any {
	args := []string{"refresh", p.id, num(p.lease), num(p.wait)}
	for _, tk := range tks {
		args = append(args, tk.ticket, num(tk.parts[0].n), group(tk.parts))
	}
	return s.exec(call{Keys: sem.keys(), Args: args})
}

func (s *fscen) renewBatch(p *cproc, sem *csem, tks ...*cticket) {
	args := []string{"renew_batch", p.id}
	for _, tk := range tks {
		if tk.tokens == nil {
			return // not granted: an earlier check failed
		}
		ann := "0"
		if tk.announced {
			ann = "1"
		}
		args = append(args, tk.ticket, num(tk.parts[0].n), tk.tokens[0], ann, num(p.lease))
		tk.announced = false
	}
	s.exec(call{Keys: sem.keys(), Args: args})
}

// wait releases tk and makes a new ticket wait on condition cond.
func (s *fscen) wait(tk *cticket, cond string) *cticket {
	fresh := &cticket{ticket: s.ticket(), p: tk.p, parts: tk.parts, cond: "c:" + cond}
	args := append(releaseArgs("wait", tk, tk.p.lease), fresh.ticket, cond)
	s.exec(call{Keys: append(tk.parts[0].sem.keys(), condKeys(keys0(tk), cond)...), Args: args})
	return fresh
}

func (s *fscen) signal(sem *csem, cond, mode string) {
	keys := append(sem.keys(), condKeys(keyspace.Keys{Base: sem.base}, cond)...)
	s.exec(call{Keys: keys, Args: []string{"signal", cond, mode, "", s.ticket()}})
}

// leader sends a leader op ("leader_set", "leader_clear", "leader_get")
// on the election sem, for tk's term.
func (s *fscen) leader(op string, sem *csem, tk *cticket, value string) {
	term := "0"
	if tk != nil && tk.tokens != nil {
		term = tk.tokens[0]
	}
	args := []string{op}
	if op != "leader_get" {
		args = append(args, term, value, "10000", leaderChannel(keyspace.Keys{Base: sem.base}))
	}
	s.exec(call{Keys: append(sem.keys(), (keyspace.Keys{Base: sem.base}).Derived(keyspace.KindLeader)), Args: args})
}

// latchOf makes sem the waiters of the latch of sem's name (latchKeysOf)
// and returns it.
func (s *fscen) latchOf(sem *csem) *csem {
	sem.base = latchKeysOf(keyspace.Keys{Base: sem.base}).count
	return sem
}

// latch sends latch.lua's op on the latch whose waiters are sem, made
// with count init, with args after init.
func (s *fscen) latch(op string, sem *csem, init int64, args ...string) []any {
	return s.exec(call{Keys: latchKeysOf(keyspace.Keys{Base: strings.TrimSuffix(sem.base, keyspace.Sep+kindLatch)}).call(opLatchDown, init).Keys,
		Args: append([]string{op, num(init)}, args...)})
}

// latchWait makes a new ticket of p wait on the latch whose waiters are
// sem (unless it is open) and returns it.
func (s *fscen) latchWait(p *cproc, sem *csem, init int64) *cticket {
	tk := &cticket{ticket: s.ticket(), p: p, parts: []cpart{{sem, 1}}, cond: "c:" + latchCond}
	s.latch("latch_wait", sem, init, "86400000", tk.ticket, p.id, num(p.lease), num(p.wait))
	return tk
}

// barrierOf makes sem the waiters of the barrier of sem's name
// (barrierKeysOf) and returns it.
func (s *fscen) barrierOf(sem *csem) *csem {
	sem.base = barrierKeysOf(keyspace.Keys{Base: sem.base}).state
	return sem
}

// barrier sends barrier.lua's op on the barrier whose waiters are sem,
// made with parties, with args after parties.
func (s *fscen) barrier(op string, sem *csem, parties int64, args ...string) []any {
	return s.exec(call{Keys: barrierKeysOf(keyspace.Keys{Base: strings.TrimSuffix(sem.base, keyspace.Sep+kindBarrier)}).call(opBarrierAwait, parties).Keys,
		Args: append([]string{op, num(parties)}, args...)})
}

// barrierAwait makes a new ticket of p arrive at the barrier whose
// waiters are sem and returns it; with tk, it asks again for tk, which
// arrived in round asked.
func (s *fscen) barrierAwait(p *cproc, sem *csem, parties int64, tk *cticket, asked string) *cticket {
	if tk == nil {
		tk = &cticket{ticket: s.ticket(), p: p, parts: []cpart{{sem, 1}}, cond: "c:" + barrierCond}
	}
	s.barrier("barrier_await", sem, parties, "86400000", tk.ticket, p.id, num(p.lease), num(p.wait), asked)
	return tk
}

func (s *fscen) simple(op string, sem *csem) {
	s.exec(call{Keys: sem.keys(), Args: []string{op}})
}

// A foreignScenario is a scenario of the table: its semaphores'
// capacities, and its calls.
type foreignScenario struct {
	name string
	caps []int64
	run  func(s *fscen, a, b, c, d *cproc)
}

// foreignScenarios are the table's scenarios. Processes: a, b and c with a
// lease TTL of 5 s and a waiter TTL of 3 s, d with 300 ms and 200 ms, e
// with 60 s and 3 s.
var foreignScenarios = []foreignScenario{
	{"resent queued acquire", []int64{2}, func(s *fscen, a, _, _, d *cproc) {
		s.acquire("acquire", s.procs[4], s.sems[:1], 1) // holds for 60 s, kept in the state hash
		s.acquire("acquire", d, s.sems[:1], 1)          // holds for 300 ms, in :h
		y := s.acquire("acquire", a, s.sems[:1], 2)     // queued behind them
		s.now += 400_000                                // :h's lease has expired, not yet dropped: its bound is due
		s.resendAcquire("acquire", y)                   // answers the next event, writing nothing
	}},
	{"uncontended mutex", []int64{1}, func(s *fscen, a, _, _, _ *cproc) {
		tk := s.acquire("acquire", a, s.sems[:1], 1)
		s.op("renew", tk)
		s.op("release", tk)
		s.op("release", tk) // resent
		// A lease longer than the keys have left to live moves their
		// expiry (the fast path, which gives every key a TTL).
		long := s.acquire("acquire", s.procs[4], s.sems[:1], 1)
		s.op("release", long)
	}},
	{"handoff", []int64{1}, func(s *fscen, a, b, _, _ *cproc) {
		x := s.acquire("acquire", a, s.sems[:1], 1)
		y := s.acquire("acquire", b, s.sems[:1], 1)
		s.resendAcquire("acquire", y)
		s.op("release", x)
		s.hear(b, s.sems[0], y)
		s.op("renew", y)
		s.op("release", y)
	}},
	{"try", []int64{1}, func(s *fscen, a, b, _, _ *cproc) {
		x := s.acquire("try", a, s.sems[:1], 1)
		s.acquire("try", b, s.sems[:1], 1)
		s.resendAcquire("try", x)
		s.op("release", x)
	}},
	{"counting semaphore", []int64{3}, func(s *fscen, a, b, c, _ *cproc) {
		x := s.acquire("acquire", a, s.sems[:1], 2)
		y := s.acquire("acquire", b, s.sems[:1], 2)
		z := s.acquire("acquire", c, s.sems[:1], 1)
		s.simple("status", s.sems[0])
		s.renewBatch(a, s.sems[0], x)
		s.op("release", x)
		s.hear(b, s.sems[0], y)
		s.hear(c, s.sems[0], z)
		s.renewBatch(b, s.sems[0], y)
		s.op("release", y)
		s.op("release", z)
	}},
	{"multi-lock", []int64{1, 1}, func(s *fscen, a, b, c, _ *cproc) {
		x := s.acquire("acquire", a, s.sems, 1, 1)
		y := s.acquire("acquire", b, s.sems, 1, 1)
		z := s.acquire("acquire", c, s.sems[1:], 1)
		s.refresh(b, s.sems[0], y)
		s.op("renew", x)
		s.op("release", x)
		s.hear(b, s.sems[0], y)
		s.op("release", y)
		s.hear(c, s.sems[1], z)
		s.op("leave", z)
	}},
	{"multi-lock reached from one of its semaphores", []int64{1, 1}, func(s *fscen, a, b, _, _ *cproc) {
		x := s.acquire("acquire", a, s.sems[:1], 1)
		y := s.acquire("acquire", b, s.sems, 1, 1)
		s.op("release", x) // grants y, whose other semaphore this call did not declare
		s.hear(b, s.sems[0], y)
		s.op("release", y)
	}},
	{"read-write mutex", []int64{3}, func(s *fscen, a, b, c, _ *cproc) {
		w := s.acquire("acquire", a, s.sems[:1], 3)
		r1 := s.acquire("acquire", b, s.sems[:1], 1)
		r2 := s.acquire("acquire", c, s.sems[:1], 1)
		s.op("release", w)
		s.hear(b, s.sems[0], r1)
		s.hear(c, s.sems[0], r2)
		s.op("release", r1)
		s.op("release", r2)
	}},
	{"condition variable", []int64{1}, func(s *fscen, a, b, c, _ *cproc) {
		x := s.acquire("acquire", a, s.sems[:1], 1)
		xw := s.wait(x, "")
		y := s.acquire("acquire", b, s.sems[:1], 1)
		yw := s.wait(y, "x")
		z := s.acquire("acquire", c, s.sems[:1], 1)
		s.refresh(a, s.sems[0], xw)
		s.signal(s.sems[0], "", "1") // xw queues behind z
		s.op("release", z)
		s.hear(a, s.sems[0], xw)
		s.signal(s.sems[0], "x", "all") // yw queues behind xw
		s.op("release", xw)
		s.op("leave", yw) // granted, not heard: handed on
	}},
	{"condition signal grants at once", []int64{1}, func(s *fscen, a, b, _, _ *cproc) {
		x := s.acquire("acquire", a, s.sems[:1], 1)
		xw := s.wait(x, "")
		s.signal(s.sems[0], "", "1")
		s.refresh(a, s.sems[0], xw)
		s.op("leave", xw)
		y := s.acquire("acquire", b, s.sems[:1], 1)
		yw := s.wait(y, "x")
		s.op("leave", yw)
	}},
	{"withdrawals", []int64{1}, func(s *fscen, a, b, c, _ *cproc) {
		x := s.acquire("acquire", a, s.sems[:1], 1)
		y := s.acquire("acquire", b, s.sems[:1], 1)
		z := s.acquire("acquire", c, s.sems[:1], 1)
		s.op("leave", y)
		s.op("leave", y) // resent
		s.op("release", x)
		s.op("leave", z) // granted, not heard: handed on
	}},
	{"expiry and a dead waiter", []int64{1}, func(s *fscen, a, b, _, d *cproc) {
		x := s.acquire("acquire", d, s.sems[:1], 1)
		s.acquire("acquire", d, s.sems[:1], 1)
		z := s.acquire("acquire", b, s.sems[:1], 1)
		s.now += 250_000 // d's waiter is dead, x still held
		s.simple("status", s.sems[0])
		s.op("release", x) // the general path drops the dead waiter, grants z
		s.hear(b, s.sems[0], z)
		s.acquire("acquire", d, s.sems[:1], 1)
		s.now += 400_000 // that waiter is dead
		s.refresh(a, s.sems[0])
		s.simple("pump", s.sems[0])
		s.op("renew", z)
		s.now += 3_000_000 // z's announced grant has expired
		s.op("renew", z)
	}},
	{"dead condition waiter and a new capacity", []int64{1}, func(s *fscen, a, _, _, d *cproc) {
		x := s.acquire("acquire", d, s.sems[:1], 1)
		s.wait(x, "")
		s.now += 250_000 // the condition waiter is dead
		s.sems[0].cap = 2
		y := s.acquire("acquire", a, s.sems[:1], 1)
		s.op("release", y)
	}},
	{"election", []int64{1}, func(s *fscen, a, b, _, _ *cproc) {
		x := s.acquire("acquire", a, s.sems[:1], 1)
		s.leader("leader_set", s.sems[0], x, "a")
		s.leader("leader_get", s.sems[0], nil, "")
		s.leader("leader_set", s.sems[0], x, "a") // renewed
		y := s.acquire("acquire", b, s.sems[:1], 1)
		s.op("release", x)
		s.hear(b, s.sems[0], y)
		s.leader("leader_set", s.sems[0], x, "late") // not live: refused
		s.leader("leader_clear", s.sems[0], x, "")
		s.leader("leader_set", s.sems[0], y, "b")
		s.leader("leader_clear", s.sems[0], y, "")
	}},
	{"countdown latch", []int64{1}, func(s *fscen, a, b, c, d *cproc) {
		l := s.latchOf(s.sems[0])
		s.latch("latch_count", l, 3)
		x := s.latchWait(a, l, 3)
		y := s.latchWait(b, l, 3)
		s.latchWait(d, l, 3) // its process dies below
		s.refresh(a, l, x)
		s.op("leave", y) // withdrawn
		id := s.ticket()
		s.latch("latch_down", l, 3, "86400000", id)
		s.latch("latch_down", l, 3, "86400000", id) // resent: acts no more
		s.latch("latch_count", l, 4)                // another count: refused
		s.now += 250_000                            // d's waiter is dead
		s.latch("latch_down", l, 3, "86400000", s.ticket())
		z := s.latchWait(c, l, 3)
		s.latch("latch_down", l, 3, "86400000", s.ticket()) // opens: wakes x and z, drops d's
		s.hear(a, l, x)
		s.hear(c, l, z)
		s.latch("latch_down", l, 3, "86400000", s.ticket()) // open: stays 0
		s.latchWait(b, l, 3)                                // open: at once
		s.latch("latch_count", l, 3)
	}},
	{"cyclic barrier", []int64{1}, func(s *fscen, a, b, c, d *cproc) {
		br := s.barrierOf(s.sems[0])
		s.barrier("barrier_status", br, 3)
		x := s.barrierAwait(a, br, 3, nil, "")
		y := s.barrierAwait(b, br, 3, nil, "")
		s.barrier("barrier_status", br, 4) // other parties: refused
		s.refresh(a, br, x)
		s.barrier("barrier_status", br, 3)
		s.barrierAwait(c, br, 3, nil, "") // completes round 1: wakes x and y
		s.hear(a, br, x)
		s.hear(b, br, y)
		s.barrierAwait(a, br, 3, x, "1") // a re-ask finds x's record
		// Round 2: d's party dies; a's refresh reports a's party gone, and
		// its re-ask breaks the round, waking b's.
		x = s.barrierAwait(a, br, 3, nil, "")
		y = s.barrierAwait(b, br, 3, nil, "")
		s.barrierAwait(d, br, 3, nil, "") // its process dies
		s.now += 250_000
		s.refresh(a, br, x)
		s.barrierAwait(a, br, 3, x, "2")
		s.hear(b, br, y)
		// Round 3: c's party leaves, breaking it for a's.
		x = s.barrierAwait(a, br, 3, nil, "")
		z := s.barrierAwait(c, br, 3, nil, "")
		s.barrier("barrier_break", br, 3, "86400000", z.ticket, "3")
		s.hear(a, br, x)
		s.barrierAwait(b, br, 3, nil, "") // round 4's first party
		s.barrier("barrier_status", br, 3)
	}},
	{"tombstones", []int64{1}, func(s *fscen, a, b, _, d *cproc) {
		s.acquire("acquire", d, s.sems[:1], 1) // holds for 300 ms, never released
		s.now += 400_000
		y := s.acquire("acquire", a, s.sems[:1], 1) // drops it: its tombstone
		s.op("release", y)
		// A grant whose keys' TTL moves gives the tombstones' index one.
		long := s.acquire("acquire", s.procs[4], s.sems[:1], 1)
		s.op("release", long)
		s.now += 21_000_000 // the tombstone's trim is due
		z := s.acquire("acquire", b, s.sems[:1], 1)
		s.op("release", z)
	}},
}

// runForeignScenario runs one scenario of the table on pair and returns
// the first check that failed.
func runForeignScenario(t *testing.T, pair *foreignPair, i int) error {
	return runScenario(t, pair, nil, i)
}

// runScenario runs the table's scenario i on pair, or, if via is not nil,
// on via.
func runScenario(t *testing.T, pair *foreignPair, via callSides, i int) error {
	ctx := context.Background()
	var sides callSides = pair
	if via != nil {
		sides = via
	}
	sc := foreignScenarios[i]
	for _, r := range sides.sides() {
		if err := r.RDB.FlushDB(ctx).Err(); err != nil {
			return err
		}
	}
	// B and C are clients on one server, with one wake list each for every
	// semaphore (keyspace.Keys.Wake); the others have one per semaphore.
	one := keyspace.ProcessListMark("fk:")
	procs := []*cproc{{"PAID", 5000, 3000}, {one + "PBID", 5000, 3000}, {one + "PCID", 5000, 3000}, {"PDID", 300, 200}, {"PEID", 60000, 3000}}
	s := &fscen{t: t, ctx: ctx, pair: pair, via: via, now: time.Now().UnixMicro(), procs: procs}
	for i, c := range sc.caps {
		s.sems = append(s.sems, &csem{name: fmt.Sprint("f", i), base: fmt.Sprintf("fk:{f%d}", i), cap: c})
	}
	if pair != nil {
		pair.candidates = func() []fkey {
			var k []fkey
			for _, sem := range s.sems {
				k = append(k, semKeys(sem, procs)...)
			}
			return k
		}
	}
	sc.run(s, procs[0], procs[1], procs[2], procs[3])
	return s.err
}

// TestForeignKeys: see the file's comment.
func TestForeignKeys(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	// miniredis's half runs without the race detector, five times
	// slower with it; the real server's under it.
	redistest.EachOffRace(t, func(t *testing.T, b *redistest.Backend) {
		for _, fast := range []bool{true, false} {
			t.Run(fmt.Sprintf("fast=%v", fast), func(t *testing.T) {
				pair := newForeignPair(t, b.Real(), fast, nil)
				pair.all, pair.oneType = true, !b.Real()
				for i, sc := range foreignScenarios {
					t.Run(sc.name, func(t *testing.T) {
						if err := runForeignScenario(t, pair, i); err != nil {
							t.Fatal(err)
						}
					})
				}
				t.Logf("%s: planted before %v calls, refused %v", pair.backend, pair.planted, pair.refused)
			})
		}
	})
}

// brokenGuards are the guards of THE RULE's point 2 broken on purpose,
// each by a replacement in one script file; TestForeignKeysCatchBrokenGuards
// checks that the table catches each. fast: the guard is a fast path's.
var brokenGuards = []struct {
	name, file, old, new string
	fast                 bool
}{
	{"fast grant gives an unproven :t a TTL", "lua/fast.lua",
		"    if has_t then must_be(K[KT], 'zset') end\n    if has_h and inline then", "    if has_h and inline then", true},
	{"fast release gives a refused wake list a TTL", "lua/fast.lua",
		"if list then redis.pcall('PEXPIRE', list, num(ttl)) end", "redis.pcall('PEXPIRE', wake_list(base_of(S), w.client), num(ttl))", true},
	{"fast release drops a wake-up its client's one list refused", "lua/fast.lua",
		"list = push_wake(l, fallback,", "list = push_wake(l, nil,", true},
	{"apply writes unproven keys", "queue.lua",
		"if not proven[e.key] then must_be(e.key, kind_written(e.cmd)) end", "if false then end", false},
	{"apply gives unproven keys a TTL", "queue.lua",
		"if not proven[key] then must_be(key, 'zset') end", "if false then end", false},
	{"apply gives a refused wake list a TTL", "queue.lua",
		"  if push_to(list, entries) then return list end\n", "  push_to(list, entries)\n  if true then return list end\n", false},
	{"apply drops the wake-ups a client's one list refused", "queue.lua",
		"  if fallback ~= nil and push_to(fallback, entries) then return fallback end\n", "", false},
	{"apply leaves a fallback wake list without a TTL", "queue.lua",
		"      if not ttl_of[to] then pushed[#pushed + 1] = to end", "      if not ttl_of[to] and to == b.list then pushed[#pushed + 1] = to end", false},
	{"fast release leaves a fallback wake list without a TTL", "lua/fast.lua",
		"if list then redis.pcall('PEXPIRE', list, num(ttl)) end", "if list and not string.find(list, KEY_SEP .. 'w' .. KEY_SEP, 1, true) then redis.pcall('PEXPIRE', list, num(ttl)) end", true},
	{"a multi-lock's wake-up falls back on its last semaphore's list", "lua/grant.lua",
		"local list, fallback = wake_list(parts[1].base, w.client)", "local list, fallback = wake_list(parts[1].base, w.client)\n  fallback = select(2, wake_list(parts[#parts].base, w.client))", false},
	{"a read's WRONGTYPE is not named", "queue.lua",
		"if type(msg) == 'string' and string.find(msg, 'WRONGTYPE', 1, true) then", "if false then", false},
	{"a resent queued acquire reads the next event unproven", "acquire.lua",
		"  prove_event_keys()\n  return { 2, now, next_event() }", "  return { 2, now, next_event() }", false},
	{"an undeclared resource's keys are not looked at", "lua/resource.lua",
		"      reach(K[i], kind_of(i, 5))\n", "", false},
	{"another release's layout is read as this one's (fast paths)", "lua/members.lua",
		"    check_layout(S, st[10], st[5] ~= false or st[6] ~= false or st[1] ~= false or st[10] ~= false)\n", "", true},
	{"another release's layout is read as this one's (general path)", "lua/members.lua",
		"    check_layout(S, st[10], st[5] ~= false or st[6] ~= false or st[1] ~= false or st[10] ~= false)\n", "", false},
	{"an election reads another release's layout", "lua/ops/leader.lua",
		"check_layout(KEYS[KS], st[1], st[1] ~= false or st[2] ~= false or st[3] ~= false or st[4] ~= false)\n", "", false},
	{"a status reads another release's layout", "lua/ops/status.lua",
		"local r = declared()[1]\n", unchecked("local r = declared()[1]\n"), false},
	{"a pump runs another release's queue", "lua/ops/pump.lua",
		"run_queues(declared())", unchecked("local rs = declared()\n") + "run_queues(rs)", false},
	{"a batch of renewals reads another release's layout", "lua/ops/renew_batch.lua",
		"local r = declared()[1]\n", unchecked("local r = declared()[1]\n"), false},
}

// unchecked wraps Lua statements so that they run with the layout check
// off: an entry that reads a semaphore's state as if it were this layout's.
func unchecked(lua string) string {
	return "local checked = check_layout\ncheck_layout = function() end\n" + lua + "check_layout = checked\n"
}

// TestForeignKeysCatchBrokenGuards breaks each guard and runs the table
// until a check fails: each must be caught.
func TestForeignKeysCatchBrokenGuards(t *testing.T) {
	redistest.Long(t)
	if redistest.Race {
		// The broken guards are Lua: under -race they run in a test
		// binary of their own, built without it.
		redistest.RunWithoutRace(t)
		return
	}
	real := redistest.RealBackend(t) != nil
	for _, g := range brokenGuards {
		t.Run(g.name, func(t *testing.T) {
			if !strings.Contains(script.Source(g.file), g.old) {
				t.Fatalf("%s no longer contains %q", g.file, g.old)
			}
			pair := newForeignPair(t, real, g.fast, mutate(g.file, g.old, g.new))
			pair.all = true
			for i, sc := range foreignScenarios {
				if err := runForeignScenario(t, pair, i); err != nil {
					first, _, _ := strings.Cut(err.Error(), "\n")
					t.Logf("caught by %q: %s", sc.name, first)
					return
				}
			}
			t.Errorf("no scenario caught it")
		})
	}
}

// TestForeignKeysCallMachine runs the call machine with another program's
// key planted before most calls (a key and a type drawn each time).
func TestForeignKeysCallMachine(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, fast := range []bool{true, false} {
			t.Run(fmt.Sprintf("fast=%v", fast), func(t *testing.T) {
				pair := newForeignPair(t, b.Real(), fast, nil)
				// miniredis interprets Lua, slowly.
				checks := 60
				if !b.Real() {
					checks = 20
				}
				if redistest.Race {
					checks /= 3
				}
				setFlag(t, "rapid.checks", strconv.Itoa(checks))
				rapid.Check(t, func(rt *rapid.T) {
					pair.rt = rt
					runForeignMachine(rt, pair)
				})
				t.Logf("%s: planted before %v calls, refused %v", pair.backend, pair.planted, pair.refused)
			})
		}
	})
}

// runForeignMachine runs one call machine on pair, whose candidates are
// the machine's semaphores' keys.
func runForeignMachine(rt *rapid.T, pair *foreignPair) {
	runCallMachine(rt, pair, func(m *callMachine) {
		pair.candidates = func() []fkey {
			var k []fkey
			for _, s := range m.sems {
				k = append(k, semKeys(s, m.procs)...)
			}
			return k
		}
	})
}

// A wake list another program wrote fails the blocking read that covers it
// (WRONGTYPE), and with it the wake-ups of every other semaphore that read
// covers. On one server a client hears every grant on one list: when
// another program holds that list, the scripts push onto each semaphore's
// own list instead and the listener moves there, logging it, so every
// waiter still hears its grant at once. A semaphore's own list another
// program wrote is left out of the read: the other waiters still hear
// their grants at once, and the one whose list it is hears its grant
// through its refresh.
func TestForeignWakeListDoesNotDeafenOthers(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	for _, tc := range []struct {
		name string
		// foreign returns the lists another program writes, for client c
		// and semaphore a's keys.
		foreign func(c *Client, ka keyspace.Keys) []string
		// aPrompt: a's waiter hears its grant at once too.
		aPrompt bool
	}{
		{"the client's list", func(c *Client, ka keyspace.Keys) []string { return []string{ka.Wake(c.id)} }, true},
		{"the client's list and a's own", func(c *Client, ka keyspace.Keys) []string {
			return []string{ka.Wake(c.id), ka.OwnWake(c.id)}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				foreignWakeList(t, b, tc.foreign, tc.aPrompt)
			})
		})
	}
}

// startWait starts c's wait for req, which sends req's name to got once
// granted (and releases at once), or the name and the error; it returns
// once the waiter is queued, the only one on req's semaphore.
func startWait(t *testing.T, c *Client, req Request, got chan<- string) {
	t.Helper()
	ctx := context.Background()
	go func() {
		l, err := c.Acquire(ctx, req)
		if err != nil {
			got <- req.Name + ": " + err.Error()
			return
		}
		got <- req.Name
		_ = l.Release(ctx)
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st, err := c.Status(ctx, req.Name); err == nil && st.Queued == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no waiter queued", req.Name)
		}
	}
}

func foreignWakeList(t *testing.T, b *redistest.Backend, foreign func(c *Client, ka keyspace.Keys) []string, aPrompt bool) {
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	var logged strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil))
	// A refresh every 5 s: a grant heard sooner came by the wake-up.
	c, err := New(b.Client(t), WithPrefix(prefix), WithWaiterTTL(15*time.Second), WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holder, err := New(b.Client(t), WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	mutex := func(name string) Request { return Request{Name: name, Capacity: 1, Permits: 1} }
	ha, err := holder.Acquire(ctx, mutex("a"))
	if err != nil {
		t.Fatal(err)
	}
	hb, err := holder.Acquire(ctx, mutex("b"))
	if err != nil {
		t.Fatal(err)
	}
	// Another program writes wake lists of c before c's blocking read
	// covers them.
	ka, _ := c.keys("a")
	lists := foreign(c, ka)
	if ka.Wake(c.id) == ka.OwnWake(c.id) {
		t.Fatalf("client id %q: one wake list per semaphore; want the client's one list on one server", c.id)
	}
	for _, k := range lists {
		if err := b.Client(t).Set(ctx, k, "another program", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan string, 2)
	wait := func(name string) { startWait(t, c, mutex(name), got) }
	wait("a")
	wait("b")
	if err := ha.Release(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := hb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	prompt := map[string]bool{"b": true, "a": aPrompt}
	heard := map[string]bool{}
	for range 2 {
		select {
		case name := <-got:
			d := time.Since(start)
			if !prompt[name] && len(heard) == 0 {
				t.Fatalf("first grant heard: %s, want b's (%s's wake list is another program's)", name, name)
			}
			if prompt[name] && d > 2500*time.Millisecond {
				t.Fatalf("%s's waiter heard its grant %v after the release, as by its refresh (every 5 s): the blocking read was deaf", name, d)
			}
			heard[name] = true
		case <-time.After(12 * time.Second):
			t.Fatalf("heard %v; a waiter did not learn its grant (b's by its wake-up, a's by its refresh)", heard)
		}
	}
	mu.Lock()
	for _, k := range lists {
		// The text handler quotes a key with a control character (keyspace.Sep).
		if !strings.Contains(logged.String(), k) && !strings.Contains(logged.String(), strconv.Quote(k)) {
			mu.Unlock()
			t.Fatalf("the log does not name the wake list %q another program wrote:\n%s", k, logged.String())
		}
	}
	mu.Unlock()
	// Once the other program's values are gone, the scripts push onto the
	// client's one list again, and the client hears its grants there,
	// within a second or two (its refresh would take 5 s).
	if err := b.Client(t).Del(ctx, lists...).Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b"} {
		h, err := holder.Acquire(ctx, mutex(name))
		if err != nil {
			t.Fatal(err)
		}
		wait(name)
		start := time.Now()
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case heard := <-got:
			if d := time.Since(start); heard != name || d > 3500*time.Millisecond {
				t.Fatalf("after the other program's values were deleted: heard %s %v after %s's release, want %s's at once, not by its refresh", heard, d, name, name)
			}
		case <-time.After(12 * time.Second):
			t.Fatalf("after the other program's values were deleted: %s's waiter did not learn its grant", name)
		}
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
