// Package script is fairlock's script library: the Lua sources assembled
// into one script per entry (EVAL) and one function library (FCALL), the
// ops each entry serves, and the one place a script is sent (Script.Run),
// whatever the server offers: FCALL, EVALSHA or EVAL, with or without
// declared flags. It holds no connection of its own: a Backend sends.
package script

import (
	"github.com/fairlock/fairlock/internal/fault"

	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/fairlock/fairlock/backend"
	"io/fs"
	"sync"
	"sync/atomic"

	"github.com/fairlock/fairlock/internal/testhook"
)

// luaFiles holds the scripts' sources (queue.lua's header maps them),
// which the root package embeds and hands over (SetSources) before any
// script is made. Each entry's script is queue.lua, then Includes in
// order, then the entry.
var luaFiles fs.FS

// SetSources gives the library the scripts' sources: queue.lua,
// acquire.lua, release.lua and lua/ at fsys's root. It is called once,
// from the root package's init.
func SetSources(fsys fs.FS) { luaFiles = fsys }

// Includes are the files every script defines after queue.lua, in order.
var Includes = []string{
	"lua/rules.lua",
	"lua/members.lua",
	"lua/args.lua",
	"lua/resource.lua",
	"lua/grant.lua",
	"lua/cond.lua",
	"lua/fast.lua",
	"lua/batch.lua",
}

// An Entry is one script: the file that is its body, and the flags its
// function declares (see libraryFormat). Several ops may share an Entry.
type Entry struct {
	Name, File string
	// Flags: allow-oom for the calls that free memory or keep it flat
	// (bounded: their tombstones at most), so that a full Redis still
	// releases, renews and drops leases; no-writes for a read;
	// allow-cross-slot-keys (crossSlot) for the calls that run a queue
	// and so can grant a waiter of another process (all but the reads), whose wake-up goes
	// to that process's one wake list (keys.wake), a key of a slot of its
	// own, which a node in cluster mode refuses a function (or a script
	// with Flags) otherwise, even when it serves every slot. A Cluster
	// client's wake lists keep their semaphore's slot (wake_list in
	// lua/rules.lua), and a key of another node's slot, or of a slot on
	// the move, is refused with or without the flag. (An acquire runs
	// the queues that expired leases and dead waiters unblock before its
	// own request; a status reads only its keys.)
	Flags string
	// Batch: the client may send several concurrent calls of this entry
	// as one script call (see Batch.go), through its Batch form
	// (batchBody), which declares the same flags.
	Batch bool
}

// CrossSlot is the flag that lets a function reach keys of slots other
// than its declared keys' on the node it runs on (see entry).
const CrossSlot = "allow-cross-slot-keys"

var Entries = []Entry{
	{"acquire", "acquire.lua", CrossSlot, true},
	{"release", "release.lua", "allow-oom," + CrossSlot, true},
	{"wait", "release.lua", CrossSlot, false}, // a new condition waiter grows memory: no allow-oom
	{"refresh", "lua/ops/refresh.lua", "allow-oom," + CrossSlot, false},
	{"renew_batch", "lua/ops/renew_batch.lua", "allow-oom," + CrossSlot, false},
	{"signal", "lua/ops/signal.lua", CrossSlot, false},
	{"pump", "lua/ops/pump.lua", "allow-oom," + CrossSlot, false},
	{"status", "lua/ops/status.lua", "no-writes", false},
	// An election's record: one small hash per election, so a full Redis
	// still records a leader.
	{"leader", "lua/ops/leader.lua", "allow-oom", false},
	{"leader_get", "lua/ops/leader.lua", "no-writes", false},
	// A countdown latch (package latch): a new waiter grows memory (no
	// allow-oom); a count down frees waiters and pushes their wake-ups to
	// their processes' lists.
	{"latch_wait", "lua/ops/latch.lua", "", false},
	{"latch_down", "lua/ops/latch.lua", "allow-oom," + CrossSlot, false},
	{"latch_count", "lua/ops/latch.lua", "no-writes", false},
	// A cyclic barrier (package barrier): an arrival may grow memory (a
	// waiter) or end a round, pushing wake-ups; a break frees waiters and
	// pushes theirs.
	{"barrier_await", "lua/ops/barrier.lua", CrossSlot, false},
	{"barrier_break", "lua/ops/barrier.lua", "allow-oom," + CrossSlot, false},
	{"barrier_status", "lua/ops/barrier.lua", "no-writes", false},
}

// An Op is one operation of the engine's scripts: what ARGV[1] names, the
// entry whose script serves it, and whether WithReplicaAck waits for its
// writes (WAIT on the same connection) before its reply counts. A pump
// goes on with work an acked Op left, and the next acked Op covers it; a
// status and an election's read write nothing.
type Op struct {
	Name       string
	EntryIndex int // index in entries
	Ack        bool
	NameArg    any // name, boxed once: the first argument of its every call
}

// The ops a client sends, each once.
var (
	OpAcquire       = newOp("acquire", "acquire", true)
	OpTry           = newOp("try", "acquire", true)
	OpRelease       = newOp("release", "release", true)
	OpRenew         = newOp("renew", "release", true)
	OpLeave         = newOp("leave", "release", true)
	OpWait          = newOp("wait", "wait", true)
	OpRefresh       = newOp("refresh", "refresh", true)
	OpRenewBatch    = newOp("renew_batch", "renew_batch", true)
	OpSignal        = newOp("signal", "signal", true)
	OpPump          = newOp("pump", "pump", false)
	OpStatus        = newOp("status", "status", false)
	OpLeaderSet     = newOp("leader_set", "leader", true)
	OpLeaderClear   = newOp("leader_clear", "leader", true)
	OpLeaderGet     = newOp("leader_get", "leader_get", false)
	OpLatchWait     = newOp("latch_wait", "latch_wait", true)
	OpLatchDown     = newOp("latch_down", "latch_down", true)
	OpLatchCount    = newOp("latch_count", "latch_count", false)
	OpBarrierAwait  = newOp("barrier_await", "barrier_await", true)
	OpBarrierBreak  = newOp("barrier_break", "barrier_break", true)
	OpBarrierStatus = newOp("barrier_status", "barrier_status", false)
)

// AllOps lists the ops, for opNamed.
var AllOps = []*Op{OpAcquire, OpTry, OpRelease, OpRenew, OpLeave, OpWait, OpRefresh, OpRenewBatch, OpSignal, OpPump, OpStatus, OpLeaderSet, OpLeaderClear, OpLeaderGet, OpLatchWait, OpLatchDown, OpLatchCount, OpBarrierAwait, OpBarrierBreak, OpBarrierStatus}

// OpNamed returns the op called name, or nil: for tests, which replay
// recorded calls.
func OpNamed(name string) *Op {
	for _, o := range AllOps {
		if o.Name == name {
			return o
		}
	}
	return nil
}

// newOp returns the op name served by the entry named entry.
func newOp(name, entry string, ack bool) *Op {
	for i, e := range Entries {
		if e.Name == entry {
			return &Op{Name: name, EntryIndex: i, Ack: ack, NameArg: name}
		}
	}
	panic("fairlock: no entry " + entry + " serves op " + name)
}

// An Call is one op ready to send: the keys it declares and its
// arguments, which begin with the op's name (ARGV[1] of every script).
type Call struct {
	Op   *Op
	Keys []string
	Args []string // as Redis receives them
	// Argv is args as go-redis takes them, each boxed in an interface,
	// those the client keeps (its id, its TTLs, a plan's permits) boxed
	// once rather than at every call; shorter than args (nil) when args
	// were appended to without it (see goRedis.send).
	Argv []any
	// Endless: the caller's context cannot end (the close's end that
	// boundBy gives it aside), so the call is sent alone through a
	// Backend that returns by its context's end (see batcher.batches).
	Endless bool
}

// Under returns oc marked endless if ctx, its caller's context, cannot
// end.
func (oc Call) Under(ctx context.Context) Call {
	oc.Endless = ctx.Done() == nil
	return oc
}

// NewCall starts a call of o on keys with room for n arguments after the
// op's name.
func NewCall(o *Op, keys []string, n int) Call {
	args := make([]string, 1, 1+n)
	args[0] = o.Name
	argv := make([]any, 1, 1+n)
	argv[0] = o.NameArg
	return Call{Op: o, Keys: keys, Args: args, Argv: argv}
}

// With returns oc With args appended.
func (oc Call) With(args ...string) Call {
	for _, a := range args {
		oc = oc.Add(a, nil)
	}
	return oc
}

// Add returns oc with a appended, and box, a boxed beforehand (or nil to
// box it now), appended to its argv.
func (oc Call) Add(a string, box any) Call {
	if len(oc.Argv) == len(oc.Args) {
		if box == nil {
			box = a
		}
		oc.Argv = append(oc.Argv, box)
	}
	oc.Args = append(oc.Args, a)
	return oc
}

// EntryOf names the entry whose whole script source (scriptSource) src
// is, the entry's name followed by testhook.BatchSuffix for its batch
// form (batchSource), or "" (tests only; see internal/testhook).
func EntryOf(src string) string {
	for _, e := range Entries {
		if strings.HasSuffix(src, EntryBody(Source(e.File))) {
			return e.Name
		}
		if e.Batch && strings.HasSuffix(src, BatchBody(Source(e.File))) {
			return e.Name + testhook.BatchSuffix
		}
	}
	return ""
}

// Source returns the text of one of the scripts' files.
func Source(file string) string {
	b, err := fs.ReadFile(luaFiles, file)
	if err != nil {
		panic("fairlock: " + err.Error())
	}
	return string(b)
}

// ScriptSource returns the EVAL source of entry e: queue.lua, the
// includes, then e's file as the body that queue.lua's run_entry runs.
func ScriptSource(e Entry) string {
	return Prelude(Source) + "\n" + EntryBody(Source(e.File))
}

// Prelude is the code every script defines before its entry: queue.lua,
// then the includes in order, each file's text as read returns it. The
// EVAL scripts and the function library (newLibrary) are both made of
// it, assembled here only.
func Prelude(read func(file string) string) string {
	parts := []string{read("queue.lua")}
	for _, f := range Includes {
		parts = append(parts, read(f))
	}
	return strings.Join(parts, "\n")
}

// BatchSource returns the EVAL source of entry e's batch form: queue.lua,
// the includes, then e's file as the body that lua/batch.lua's run_batch
// runs once for each call of a batch.
func BatchSource(e Entry) string {
	return Prelude(Source) + "\n" + BatchBody(Source(e.File))
}

// BatchBody wraps an entry file's text as the body run_batch runs for
// each call of a batch, as entryBody does for one call.
func BatchBody(src string) string {
	return "return run_batch(function(KEYS, ARGV)\n" + src + "\nend, KEYS, ARGV)"
}

// EntryBody wraps an entry file's text as the function run_entry runs
// (queue.lua), called with the script's KEYS and ARGV. The wrapper takes
// no line of its own before the entry, so errors keep its line numbers
// less one.
func EntryBody(src string) string {
	return "return run_entry(function(KEYS, ARGV)\n" + src + "\nend, KEYS, ARGV)"
}

// Set are the engine's Set as one client runs them, one per entry.
// Each runs as a function of a library loaded once per Redis (FCALL, see
// functions.go) where the server has functions, and otherwise through
// EVALSHA, falling back to EVAL after SCRIPT FLUSH or on a Redis that has
// not seen it yet. A Client has its own Set, since what it learns of
// its Redis (that functions are missing) holds for that Redis only.
type Set struct {
	List []*Script // by index in entries
	Lib  *Library  // nil: EVAL only (a test transform is set)
	// EvalOnly is set for good once the Redis showed it cannot run the
	// library (no FCALL, or the library does not load there).
	EvalOnly atomic.Bool
	// NoShebang is set for good once the Redis refused a script's
	// "#!lua flags=" line (miniredis, Redis 6.2): its scripts then run
	// without flags.
	NoShebang atomic.Bool
	loadMu    sync.Mutex    // one load at a time
	Loads     atomic.Uint64 // loads done
}

// ForOp returns the script that serves o.
func (set *Set) ForOp(o *Op) *Script { return set.List[o.EntryIndex] }

// Named returns the script of the entry called name (tests run entries
// by name).
func (set *Set) Named(name string) *Script {
	for i, e := range Entries {
		if e.Name == name {
			return set.List[i]
		}
	}
	panic("fairlock: no entry " + name)
}

// Load loads the library through b (see library.Load). Calls that find
// it missing together Load it once: a call that waited for another's Load
// takes that one as its own.
func (set *Set) Load(ctx context.Context, b backend.Backend) LoadResult {
	seen := set.Loads.Load()
	set.loadMu.Lock()
	defer set.loadMu.Unlock()
	if set.Loads.Load() != seen {
		return LoadOK
	}
	r := set.Lib.Load(ctx, b)
	if r == LoadOK {
		set.Loads.Add(1)
	}
	return r
}

// Script is one of a client's scripts: its EVAL form and the name of its
// function in the library.
type Script struct {
	Set *Set
	Forms
	// Batch runs several calls of the entry in one script call (see
	// Batch.go); nil for an entry that is not batched.
	Batch *Forms
}

// Forms are the ways a script is sent: its EVAL source, the same with its
// entry's flags declared ("#!lua flags=...", Redis 7 and later; nil for an
// entry without flags), and the name of its function in the library.
type Forms struct {
	Eval    *EvalCode
	Flagged *EvalCode
	Fn      string
}

// Code is what scripts are made of, built once per transform.
type Code struct {
	Evals, Flagged map[string]*EvalCode
	// BatchEvals and BatchFlagged are the batch forms (BatchSource) of
	// the entries that have them.
	BatchEvals, BatchFlagged map[string]*EvalCode
	Lib                      *Library
}

func NewCode(transform func(string) string) *Code {
	k := &Code{Evals: map[string]*EvalCode{}, Flagged: map[string]*EvalCode{},
		BatchEvals: map[string]*EvalCode{}, BatchFlagged: map[string]*EvalCode{}}
	add := func(evals, flagged map[string]*EvalCode, e Entry, src string) {
		// A transform sees the flags as the server does, so that it can
		// keep them (a recording adds no write to a no-writes script).
		if e.Flags != "" {
			src = "#!lua flags=" + e.Flags + "\n" + src
		}
		if transform != nil {
			src = transform(src)
		}
		line, body := testhook.SplitShebang(src)
		if (line != "") != (e.Flags != "") {
			panic("fairlock: a transform moved, dropped or added the #!lua line of entry " + e.Name)
		}
		evals[e.Name] = NewEvalCode(body)
		if line != "" {
			flagged[e.Name] = NewEvalCode(src)
		}
	}
	for _, e := range Entries {
		add(k.Evals, k.Flagged, e, ScriptSource(e))
		if e.Batch {
			add(k.BatchEvals, k.BatchFlagged, e, BatchSource(e))
		}
	}
	// The test transforms (internal/halfrun, broken rules) rewrite EVAL
	// sources, so a transformed client runs EVAL only.
	if transform == nil {
		k.Lib = NewLibrary(Entries, Source)
	}
	return k
}

// defaultCode serves every client made while no test hook is set, made
// at the first client's start (after SetSources).
var defaultCode = sync.OnceValue(func() *Code { return NewCode(nil) })

// NewSet returns a client's scripts, passing each source through
// transform when it is not nil (tests only; see internal/testhook).
func NewSet(transform func(string) string) *Set {
	k := defaultCode()
	if transform != nil {
		k = NewCode(transform)
	}
	s := &Set{Lib: k.Lib}
	for _, e := range Entries {
		sc := &Script{Set: s, Forms: Forms{Eval: k.Evals[e.Name], Flagged: k.Flagged[e.Name]}}
		if k.Lib != nil {
			sc.Fn = k.Lib.Fns[e.Name]
		}
		if e.Batch {
			sc.Batch = &Forms{Eval: k.BatchEvals[e.Name], Flagged: k.BatchFlagged[e.Name]}
			if k.Lib != nil {
				sc.Batch.Fn = k.Lib.BatchFns[e.Name]
			}
		}
		s.List = append(s.List, sc)
	}
	return s
}

// Run is the one place where a script runs, whatever the path. send sends
// one script command through b (alone, or with a WAIT after it on the
// same connection; see Client.Run) and returns what it came to.
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
func (s *Script) Run(ctx context.Context, b backend.Backend, functions bool, send func(backend.Script) Result, keys, args []string) Result {
	return s.Forms.Run(ctx, s.Set, b, functions, send, keys, args)
}

// Run sends keys and args through f's forms, as script.Run says.
func (s *Forms) Run(ctx context.Context, set *Set, b backend.Backend, functions bool, send func(backend.Script) Result, keys, args []string) Result {
	if set.Lib != nil && functions && !set.EvalOnly.Load() {
		fcall := backend.Script{Command: backend.FCall, Name: s.Fn, Keys: keys, Args: args}
		r := send(fcall)
		switch FCallFailure(r.Err) {
		case FnRan:
			return r
		case FnMissing:
			switch set.Load(ctx, b) {
			case LoadOK:
				if r = send(fcall); FCallFailure(r.Err) != FnMissing {
					return r
				}
			case LoadRefused:
				set.EvalOnly.Store(true)
			}
		case FnUnsupported:
			set.EvalOnly.Store(true)
		}
	}
	if s.Flagged != nil && !set.NoShebang.Load() {
		r := s.Flagged.Run(send, keys, args)
		if !shebangRefused(r.Err) {
			return r
		}
		set.NoShebang.Store(true)
	}
	return s.Eval.Run(send, keys, args)
}

// shebangRefused reports whether err says the server cannot compile a
// script's "#!lua" line (it has no script flags): the script did not run.
func shebangRefused(err error) bool {
	msg, ok := fault.ReplyOf(err)
	return ok && strings.Contains(msg, "compiling script") && strings.Contains(msg, "'#'")
}

// NudgeScript pushes an empty wake-up onto a wake list, to end a blocked
// BLPOP at once when a client closes. It changes no semaphore state.
var NudgeScript = NewEvalCode(`redis.call('RPUSH', KEYS[1], '')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)

// Library is the engine's scripts as one Redis function Library (Redis 7.0
// and later, Valkey): loaded once per server, so that a call no longer
// defines the shared code afresh as an EVAL does. The Lua files stay the
// sources; the Library wraps them (see newLibrary). Its name and its
// functions' names carry a hash of the sources, so fairlock versions that
// differ in them can share one Redis (a rolling upgrade): each loads its
// own Library, and none replaces another's.
type Library struct {
	Name     string            // fairlock_<hash>
	Fns      map[string]string // entry name -> function name
	BatchFns map[string]string // entry name -> its batch form's function name (entry.batch)
	Code     string            // FUNCTION LOAD's argument
}

// NewLibrary wraps the scripts' sources into a library: queue.lua and the
// includes are defined once per server, by define, at the first call (not
// when the library loads, since a library's top level sees only
// redis.register_function and its kin, not unpack, string or math, and
// the sources may use those at their top level as a script may); each
// entry file becomes the body of a function, registered once per entry
// with the entry's flags. read returns a source file's text (source, or a
// test's changed copy).
//
// Like the scripts, the functions touch keys not in KEYS in the slot of
// those declared, which a function may do as a script may (Cluster checks
// the slot of every key, declared or not).
func NewLibrary(entries []Entry, read func(file string) string) *Library {
	var body strings.Builder
	body.WriteString(Prelude(read))
	files := map[string]int{} // entry file -> index in bodies
	var bodies []string
	for _, e := range entries {
		if _, ok := files[e.File]; !ok {
			files[e.File] = len(bodies)
			bodies = append(bodies, read(e.File))
		}
	}
	for i, src := range bodies {
		// Each body runs through queue.lua's run_entry, as an EVAL's does;
		// a batch form (entry.batch) runs the same body once per call. The
		// body's local lives in a block of its own, so that entries do
		// not count against Lua's limit of locals in define.
		fmt.Fprintf(&body, "\ndo\nlocal body = function(KEYS, ARGV)\n%s\nend\nbodies[%d] = function(KEYS, ARGV) return run_entry(body, KEYS, ARGV) end\n", src, i+1)
		fmt.Fprintf(&body, "batches[%d] = function(KEYS, ARGV) return run_batch(body, KEYS, ARGV) end\nend\n", i+1)
	}
	h := sha1.New()
	h.Write([]byte(body.String()))
	for _, e := range entries {
		fmt.Fprintf(h, "\x00%s %s %s %v", e.Name, e.File, e.Flags, e.Batch)
	}
	hash := hex.EncodeToString(h.Sum(nil))[:16]
	l := &Library{Name: "fairlock_" + hash, Fns: map[string]string{}, BatchFns: map[string]string{}}
	var code strings.Builder
	fmt.Fprintf(&code, "#!lua name=%s\nlocal bodies, batches = {}, {}\nlocal function define()\n%s\nend\n", l.Name, body.String())
	for _, e := range entries {
		flags := ""
		if e.Flags != "" {
			flags = ", flags={'" + strings.ReplaceAll(e.Flags, ",", "','") + "'}"
		}
		register := func(fn, table string) {
			fmt.Fprintf(&code, "redis.register_function{function_name='%s', callback=function(KEYS, ARGV)\n  if not bodies[%d] then define() end\n  return %s[%d](KEYS, ARGV)\nend%s}\n",
				fn, files[e.File]+1, table, files[e.File]+1, flags)
		}
		l.Fns[e.Name] = "fairlock_" + e.Name + "_" + hash
		register(l.Fns[e.Name], "bodies")
		if e.Batch {
			l.BatchFns[e.Name] = "fairlock_" + e.Name + "_batch_" + hash
			register(l.BatchFns[e.Name], "batches")
		}
	}
	l.Code = code.String()
	return l
}

// A Failure is what an FCALL's error says of the function.
type Failure int

const (
	FnRan         Failure = iota // the call ran (or failed on its way): its reply stands
	FnMissing                    // this server has no such function: load the library
	FnUnsupported                // no FCALL here (miniredis, Redis 6.2), or not allowed to this user
)

// FCallFailure reads an FCALL's error.
func FCallFailure(err error) Failure {
	msg, ok := fault.ReplyOf(err)
	if !ok {
		return FnRan
	}
	switch {
	case strings.HasPrefix(msg, "ERR Function not found"):
		return FnMissing
	case strings.HasPrefix(msg, "ERR unknown command"), strings.HasPrefix(msg, "NOPERM"):
		return FnUnsupported
	}
	return FnRan
}

// A LoadResult is what loading the library came to.
type LoadResult int

const (
	LoadOK      LoadResult = iota // loaded, or there already
	LoadFailed                    // not now (the connection, a failover, memory): try again next time
	LoadRefused                   // never on this Redis: the library does not compile, or FUNCTION is not allowed
)

// Load loads the library on every server of b that may serve a key: the
// node, or every Cluster master (the slot's owner may have changed since
// it was last seen). A library of that name already there is the same
// code (the name is its hash), so "already exists" is success (see
// Backend.LoadLibrary).
func (l *Library) Load(ctx context.Context, b backend.Backend) LoadResult {
	err := b.LoadLibrary(ctx, l.Code)
	msg, reply := fault.ReplyOf(err)
	switch {
	case err == nil:
		return LoadOK
	case reply && (strings.HasPrefix(msg, "ERR") || strings.HasPrefix(msg, "NOPERM")):
		return LoadRefused
	}
	return LoadFailed
}

// SHA1Hex returns the SHA-1 of s in hex, as EVALSHA names a script.
func SHA1Hex(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}

// A Result is what a script call came to, as plain Go values: its reply
// (nil, int64, string, or []any of those) or the error that stood in its
// way. The Backend runs the call; everything above run reads results only.
type Result struct {
	Val any
	Err error
}

// Slice returns the reply, an array, or the call's error.
func (r Result) Slice() ([]any, error) {
	if r.Err != nil {
		return nil, r.Err
	}
	s, ok := r.Val.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: script reply %v is not an array", fault.ErrRedis, r.Val)
	}
	return s, nil
}

// Strings returns the reply, an array of strings, or the call's error.
func (r Result) Strings() ([]string, error) {
	s, err := r.Slice()
	if err != nil {
		return nil, err
	}
	out := make([]string, len(s))
	for i, v := range s {
		str, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("%w: script reply %v is not an array of strings", fault.ErrRedis, r.Val)
		}
		out[i] = str
	}
	return out, nil
}

// EvalCode is a script sent by EVALSHA, then EVAL if the server lacks it.
type EvalCode struct {
	Src, SHA string
}

func NewEvalCode(src string) *EvalCode { return &EvalCode{Src: src, SHA: SHA1Hex(src)} }

// Run sends e through send on keys and args: EVALSHA, and EVAL when the
// server does not have the script yet.
func (e *EvalCode) Run(send func(backend.Script) Result, keys, args []string) Result {
	r := send(backend.Script{Command: backend.EvalSHA, Name: e.SHA, Keys: keys, Args: args})
	if msg, ok := fault.ReplyOf(r.Err); ok && strings.HasPrefix(msg, "NOSCRIPT") {
		r = send(backend.Script{Command: backend.Eval, Name: e.Src, Keys: keys, Args: args})
	}
	return r
}

// On runs e On b.
func (e *EvalCode) On(ctx context.Context, b backend.Backend, keys []string, args ...string) Result {
	return e.Run(func(s backend.Script) Result {
		v, err := b.Script(ctx, s)
		return Result{v, err}
	}, keys, args)
}
