package fairlock

import (
	"context"
	"embed"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/testhook"
)

// The scripts' sources (queue.lua's header maps them). Each entry's script
// is queue.lua, then includes in order, then the entry.
//
//go:embed queue.lua acquire.lua release.lua lua
var luaFiles embed.FS

// includes are the files every script defines after queue.lua, in order.
var includes = []string{
	"lua/rules.lua",
	"lua/members.lua",
	"lua/args.lua",
	"lua/resource.lua",
	"lua/grant.lua",
	"lua/cond.lua",
	"lua/fast.lua",
	"lua/batch.lua",
}

// An entry is one script: the file that is its body, and the flags its
// function declares (see libraryFormat). Several ops may share an entry.
type entry struct {
	name, file string
	// flags: allow-oom for the calls that free memory or keep it flat
	// (bounded: their tombstones at most), so that a full Redis still
	// releases, renews and drops leases; no-writes for a read;
	// allow-cross-slot-keys (crossSlot) for the calls that run a queue
	// and so can grant a waiter of another process (all but the reads), whose wake-up goes
	// to that process's one wake list (keys.wake), a key of a slot of its
	// own, which a node in cluster mode refuses a function (or a script
	// with flags) otherwise, even when it serves every slot. A Cluster
	// client's wake lists keep their semaphore's slot (wake_list in
	// lua/rules.lua), and a key of another node's slot, or of a slot on
	// the move, is refused with or without the flag. (An acquire runs
	// the queues that expired leases and dead waiters unblock before its
	// own request; a status reads only its keys.)
	flags string
	// batch: the client may send several concurrent calls of this entry
	// as one script call (see batch.go), through its batch form
	// (batchBody), which declares the same flags.
	batch bool
}

// crossSlot is the flag that lets a function reach keys of slots other
// than its declared keys' on the node it runs on (see entry).
const crossSlot = "allow-cross-slot-keys"

var entries = []entry{
	{"acquire", "acquire.lua", crossSlot, true},
	{"release", "release.lua", "allow-oom," + crossSlot, true},
	{"wait", "release.lua", crossSlot, false}, // a new condition waiter grows memory: no allow-oom
	{"refresh", "lua/ops/refresh.lua", "allow-oom," + crossSlot, false},
	{"renew_batch", "lua/ops/renew_batch.lua", "allow-oom," + crossSlot, false},
	{"signal", "lua/ops/signal.lua", crossSlot, false},
	{"pump", "lua/ops/pump.lua", "allow-oom," + crossSlot, false},
	{"status", "lua/ops/status.lua", "no-writes", false},
	// An election's record: one small hash per election, so a full Redis
	// still records a leader.
	{"leader", "lua/ops/leader.lua", "allow-oom", false},
	{"leader_get", "lua/ops/leader.lua", "no-writes", false},
	// A countdown latch (package latch): a new waiter grows memory (no
	// allow-oom); a count down frees waiters and pushes their wake-ups to
	// their processes' lists.
	{"latch_wait", "lua/ops/latch.lua", "", false},
	{"latch_down", "lua/ops/latch.lua", "allow-oom," + crossSlot, false},
	{"latch_count", "lua/ops/latch.lua", "no-writes", false},
	// A cyclic barrier (package barrier): an arrival may grow memory (a
	// waiter) or end a round, pushing wake-ups; a break frees waiters and
	// pushes theirs.
	{"barrier_await", "lua/ops/barrier.lua", crossSlot, false},
	{"barrier_break", "lua/ops/barrier.lua", "allow-oom," + crossSlot, false},
	{"barrier_status", "lua/ops/barrier.lua", "no-writes", false},
}

// An op is one operation of the engine's scripts: what ARGV[1] names, the
// entry whose script serves it, and whether WithReplicaAck waits for its
// writes (WAIT on the same connection) before its reply counts. A pump
// goes on with work an acked op left, and the next acked op covers it; a
// status and an election's read write nothing.
type op struct {
	name    string
	entry   int // index in entries
	ack     bool
	nameArg any // name, boxed once: the first argument of its every call
}

// The ops a client sends, each once.
var (
	opAcquire       = newOp("acquire", "acquire", true)
	opTry           = newOp("try", "acquire", true)
	opRelease       = newOp("release", "release", true)
	opRenew         = newOp("renew", "release", true)
	opLeave         = newOp("leave", "release", true)
	opWait          = newOp("wait", "wait", true)
	opRefresh       = newOp("refresh", "refresh", true)
	opRenewBatch    = newOp("renew_batch", "renew_batch", true)
	opSignal        = newOp("signal", "signal", true)
	opPump          = newOp("pump", "pump", false)
	opStatus        = newOp("status", "status", false)
	opLeaderSet     = newOp("leader_set", "leader", true)
	opLeaderClear   = newOp("leader_clear", "leader", true)
	opLeaderGet     = newOp("leader_get", "leader_get", false)
	opLatchWait     = newOp("latch_wait", "latch_wait", true)
	opLatchDown     = newOp("latch_down", "latch_down", true)
	opLatchCount    = newOp("latch_count", "latch_count", false)
	opBarrierAwait  = newOp("barrier_await", "barrier_await", true)
	opBarrierBreak  = newOp("barrier_break", "barrier_break", true)
	opBarrierStatus = newOp("barrier_status", "barrier_status", false)
)

// allOps lists the ops, for opNamed.
var allOps = []*op{opAcquire, opTry, opRelease, opRenew, opLeave, opWait, opRefresh, opRenewBatch, opSignal, opPump, opStatus, opLeaderSet, opLeaderClear, opLeaderGet, opLatchWait, opLatchDown, opLatchCount, opBarrierAwait, opBarrierBreak, opBarrierStatus}

// opNamed returns the op called name, or nil: for tests, which replay
// recorded calls.
func opNamed(name string) *op {
	for _, o := range allOps {
		if o.name == name {
			return o
		}
	}
	return nil
}

// newOp returns the op name served by the entry named entry.
func newOp(name, entry string, ack bool) *op {
	for i, e := range entries {
		if e.name == entry {
			return &op{name: name, entry: i, ack: ack, nameArg: name}
		}
	}
	panic("fairlock: no entry " + entry + " serves op " + name)
}

// An opCall is one op ready to send: the keys it declares and its
// arguments, which begin with the op's name (ARGV[1] of every script).
type opCall struct {
	op   *op
	keys []string
	args []string // as Redis receives them
	// argv is args as go-redis takes them, each boxed in an interface,
	// those the client keeps (its id, its TTLs, a plan's permits) boxed
	// once rather than at every call; shorter than args (nil) when args
	// were appended to without it (see goRedis.send).
	argv []any
	// endless: the caller's context cannot end (the close's end that
	// boundBy gives it aside), so the call is sent alone through a
	// Backend that returns by its context's end (see batcher.batches).
	endless bool
}

// under returns oc marked endless if ctx, its caller's context, cannot
// end.
func (oc opCall) under(ctx context.Context) opCall {
	oc.endless = ctx.Done() == nil
	return oc
}

// newCall starts a call of o on keys with room for n arguments after the
// op's name.
func newCall(o *op, keys []string, n int) opCall {
	args := make([]string, 1, 1+n)
	args[0] = o.name
	argv := make([]any, 1, 1+n)
	argv[0] = o.nameArg
	return opCall{op: o, keys: keys, args: args, argv: argv}
}

// with returns oc with args appended.
func (oc opCall) with(args ...string) opCall {
	for _, a := range args {
		oc = oc.add(a, nil)
	}
	return oc
}

// add returns oc with a appended, and box, a boxed beforehand (or nil to
// box it now), appended to its argv.
func (oc opCall) add(a string, box any) opCall {
	if len(oc.argv) == len(oc.args) {
		if box == nil {
			box = a
		}
		oc.argv = append(oc.argv, box)
	}
	oc.args = append(oc.args, a)
	return oc
}

// entryOf names the entry whose whole script source (scriptSource) src
// is, the entry's name followed by testhook.BatchSuffix for its batch
// form (batchSource), or "" (tests only; see internal/testhook).
func entryOf(src string) string {
	for _, e := range entries {
		if strings.HasSuffix(src, entryBody(source(e.file))) {
			return e.name
		}
		if e.batch && strings.HasSuffix(src, batchBody(source(e.file))) {
			return e.name + testhook.BatchSuffix
		}
	}
	return ""
}

// source returns the text of one of the scripts' files.
func source(file string) string {
	b, err := luaFiles.ReadFile(file)
	if err != nil {
		panic("fairlock: " + err.Error())
	}
	return string(b)
}

// scriptSource returns the EVAL source of entry e: queue.lua, the
// includes, then e's file as the body that queue.lua's run_entry runs.
func scriptSource(e entry) string {
	return prelude(source) + "\n" + entryBody(source(e.file))
}

// prelude is the code every script defines before its entry: queue.lua,
// then the includes in order, each file's text as read returns it. The
// EVAL scripts and the function library (newLibrary) are both made of
// it, assembled here only.
func prelude(read func(file string) string) string {
	parts := []string{read("queue.lua")}
	for _, f := range includes {
		parts = append(parts, read(f))
	}
	return strings.Join(parts, "\n")
}

// batchSource returns the EVAL source of entry e's batch form: queue.lua,
// the includes, then e's file as the body that lua/batch.lua's run_batch
// runs once for each call of a batch.
func batchSource(e entry) string {
	return prelude(source) + "\n" + batchBody(source(e.file))
}

// batchBody wraps an entry file's text as the body run_batch runs for
// each call of a batch, as entryBody does for one call.
func batchBody(src string) string {
	return "return run_batch(function(KEYS, ARGV)\n" + src + "\nend, KEYS, ARGV)"
}

// entryBody wraps an entry file's text as the function run_entry runs
// (queue.lua), called with the script's KEYS and ARGV. The wrapper takes
// no line of its own before the entry, so errors keep its line numbers
// less one.
func entryBody(src string) string {
	return "return run_entry(function(KEYS, ARGV)\n" + src + "\nend, KEYS, ARGV)"
}

// scripts are the engine's scripts as one client runs them, one per entry.
// Each runs as a function of a library loaded once per Redis (FCALL, see
// functions.go) where the server has functions, and otherwise through
// EVALSHA, falling back to EVAL after SCRIPT FLUSH or on a Redis that has
// not seen it yet. A Client has its own scripts, since what it learns of
// its Redis (that functions are missing) holds for that Redis only.
type scripts struct {
	list []*script // by index in entries
	lib  *library  // nil: EVAL only (a test transform is set)
	// evalOnly is set for good once the Redis showed it cannot run the
	// library (no FCALL, or the library does not load there).
	evalOnly atomic.Bool
	// noShebang is set for good once the Redis refused a script's
	// "#!lua flags=" line (miniredis, Redis 6.2): its scripts then run
	// without flags.
	noShebang atomic.Bool
	loadMu    sync.Mutex    // one load at a time
	loads     atomic.Uint64 // loads done
}

// forOp returns the script that serves o.
func (set *scripts) forOp(o *op) *script { return set.list[o.entry] }

// named returns the script of the entry called name (tests run entries
// by name).
func (set *scripts) named(name string) *script {
	for i, e := range entries {
		if e.name == name {
			return set.list[i]
		}
	}
	panic("fairlock: no entry " + name)
}

// load loads the library through b (see library.load). Calls that find
// it missing together load it once: a call that waited for another's load
// takes that one as its own.
func (set *scripts) load(ctx context.Context, b backend.Backend) loadResult {
	seen := set.loads.Load()
	set.loadMu.Lock()
	defer set.loadMu.Unlock()
	if set.loads.Load() != seen {
		return loadOK
	}
	r := set.lib.load(ctx, b)
	if r == loadOK {
		set.loads.Add(1)
	}
	return r
}

// script is one of a client's scripts: its EVAL form and the name of its
// function in the library.
type script struct {
	set *scripts
	forms
	// batch runs several calls of the entry in one script call (see
	// batch.go); nil for an entry that is not batched.
	batch *forms
}

// forms are the ways a script is sent: its EVAL source, the same with its
// entry's flags declared ("#!lua flags=...", Redis 7 and later; nil for an
// entry without flags), and the name of its function in the library.
type forms struct {
	eval    *evalCode
	flagged *evalCode
	fn      string
}

// code is what scripts are made of, built once per transform.
type code struct {
	evals, flagged map[string]*evalCode
	// batchEvals and batchFlagged are the batch forms (batchSource) of
	// the entries that have them.
	batchEvals, batchFlagged map[string]*evalCode
	lib                      *library
}

func newCode(transform func(string) string) *code {
	k := &code{evals: map[string]*evalCode{}, flagged: map[string]*evalCode{},
		batchEvals: map[string]*evalCode{}, batchFlagged: map[string]*evalCode{}}
	add := func(evals, flagged map[string]*evalCode, e entry, src string) {
		// A transform sees the flags as the server does, so that it can
		// keep them (a recording adds no write to a no-writes script).
		if e.flags != "" {
			src = "#!lua flags=" + e.flags + "\n" + src
		}
		if transform != nil {
			src = transform(src)
		}
		line, body := testhook.SplitShebang(src)
		if (line != "") != (e.flags != "") {
			panic("fairlock: a transform moved, dropped or added the #!lua line of entry " + e.name)
		}
		evals[e.name] = newEvalCode(body)
		if line != "" {
			flagged[e.name] = newEvalCode(src)
		}
	}
	for _, e := range entries {
		add(k.evals, k.flagged, e, scriptSource(e))
		if e.batch {
			add(k.batchEvals, k.batchFlagged, e, batchSource(e))
		}
	}
	// The test transforms (internal/halfrun, broken rules) rewrite EVAL
	// sources, so a transformed client runs EVAL only.
	if transform == nil {
		k.lib = newLibrary(entries, source)
	}
	return k
}

// defaultCode serves every client made while no test hook is set.
var defaultCode = newCode(nil)

// newScripts returns a client's scripts, passing each source through
// transform when it is not nil (tests only; see internal/testhook).
func newScripts(transform func(string) string) *scripts {
	k := defaultCode
	if transform != nil {
		k = newCode(transform)
	}
	s := &scripts{lib: k.lib}
	for _, e := range entries {
		sc := &script{set: s, forms: forms{eval: k.evals[e.name], flagged: k.flagged[e.name]}}
		if k.lib != nil {
			sc.fn = k.lib.fns[e.name]
		}
		if e.batch {
			sc.batch = &forms{eval: k.batchEvals[e.name], flagged: k.batchFlagged[e.name]}
			if k.lib != nil {
				sc.batch.fn = k.lib.batchFns[e.name]
			}
		}
		s.list = append(s.list, sc)
	}
	return s
}

// run is the one place where a script runs, whatever the path. send sends
// one script command through b (alone, or with a WAIT after it on the
// same connection; see Client.run) and returns what it came to.
//
// With functions (b can load them): FCALL; a Redis without the library (a
// new server, FUNCTION FLUSH, a Cluster slot's new owner) gets it loaded,
// and the call is sent again, as EVAL if FCALL still finds no function. A
// Redis without FCALL (miniredis, Redis 6.2) or on which the library does
// not load makes the client use EVAL from then on. A failed FCALL ran
// nothing, so sending the call again cannot apply it twice.
//
// With EVAL: an entry with flags (allow-oom, no-writes) declares them in a
// "#!lua flags=" line, as its function does; a server that cannot compile
// that line (miniredis, Redis 6.2) refused the script before running it,
// and the client runs its scripts without flags from then on.
func (s *script) run(ctx context.Context, b backend.Backend, functions bool, send func(backend.Script) result, keys, args []string) result {
	return s.forms.run(ctx, s.set, b, functions, send, keys, args)
}

// run sends keys and args through f's forms, as script.run says.
func (s *forms) run(ctx context.Context, set *scripts, b backend.Backend, functions bool, send func(backend.Script) result, keys, args []string) result {
	if set.lib != nil && functions && !set.evalOnly.Load() {
		fcall := backend.Script{Command: backend.FCall, Name: s.fn, Keys: keys, Args: args}
		r := send(fcall)
		switch fcallFailure(r.err) {
		case fnRan:
			return r
		case fnMissing:
			switch set.load(ctx, b) {
			case loadOK:
				if r = send(fcall); fcallFailure(r.err) != fnMissing {
					return r
				}
			case loadRefused:
				set.evalOnly.Store(true)
			}
		case fnUnsupported:
			set.evalOnly.Store(true)
		}
	}
	if s.flagged != nil && !set.noShebang.Load() {
		r := s.flagged.run(send, keys, args)
		if !shebangRefused(r.err) {
			return r
		}
		set.noShebang.Store(true)
	}
	return s.eval.run(send, keys, args)
}

// shebangRefused reports whether err says the server cannot compile a
// script's "#!lua" line (it has no script flags): the script did not run.
func shebangRefused(err error) bool {
	msg, ok := replyOf(err)
	return ok && strings.Contains(msg, "compiling script") && strings.Contains(msg, "'#'")
}

// nudgeScript pushes an empty wake-up onto a wake list, to end a blocked
// BLPOP at once when a client closes. It changes no semaphore state.
var nudgeScript = newEvalCode(`redis.call('RPUSH', KEYS[1], '')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)
