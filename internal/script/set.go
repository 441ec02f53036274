package script

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/testhook"
)

// A Set is the engine's scripts as one client runs them, one per entry.
// Each runs as a function of a library loaded once per Redis (FCALL, see
// Library) where the server has functions, and otherwise through
// EVALSHA, falling back to EVAL after SCRIPT FLUSH or on a Redis that has
// not seen it yet. A client has its own Set, since what it learns of
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

// Load loads the library through b (see Library.Load). Calls that find
// it missing together load it once: a call that waited for another's load
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
	// internal/callpath's Batcher); nil for an entry that is not batched.
	Batch *Forms
}

// Forms are the ways a script is sent: its EVAL source, the same with its
// entry's flags declared ("#!lua flags=...", Redis 7 and later; nil for an
// entry without flags), and the name of its function in the library.
type Forms struct {
	Eval    *EvalCode
	Flagged *EvalCode
	Fn      string
	// gate lets one call at a time go first, until a call of these forms
	// has returned (done): concurrent first calls then learn the server's
	// forms once (whether it has functions and script flags, and its
	// cache of the script), not each for itself. A thousand first calls
	// on a server without functions sent five commands each, two of them
	// with the script's whole source. Any return opens the gate, an error
	// too (a call that reached no server learnt nothing, and the others
	// go as they would without the gate), and a call waits its turn at
	// most wait: a first call that Redis leaves unanswered (a stalled
	// server, a Backend that does not return) must not hold the others.
	// nil: no gate (a Forms made by hand, in tests).
	gate chan struct{}
	wait time.Duration
	done atomic.Bool
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
	sealed.Store(true)
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

// transformed keeps the code transforms made, by key (NewSet); at most
// a few transforms are in use at once, so it starts over when full.
var transformed struct {
	sync.Mutex
	m map[any]*Code
}

// transformedCode returns the code transform makes: built now when key is
// nil, else once per key.
func transformedCode(transform func(string) string, key any) *Code {
	if key == nil {
		return NewCode(transform)
	}
	transformed.Lock()
	defer transformed.Unlock()
	if k := transformed.m[key]; k != nil {
		return k
	}
	if len(transformed.m) >= 8 || transformed.m == nil {
		transformed.m = map[any]*Code{}
	}
	k := NewCode(transform)
	transformed.m[key] = k
	return k
}

// defaultCode serves every client made while no test hook is set, made
// at the first client's start (after SetSources).
var defaultCode = sync.OnceValue(func() *Code { return NewCode(nil) })

// NewSet returns a client's scripts, passing each source through
// transform when it is not nil (tests only; see internal/testhook). key,
// when not nil, names transform: the scripts a key's transform makes are
// built once, for every client made with that key (a test's transform is
// a pure function of the source; building them costs more than the rest
// of a client's start).
func NewSet(transform func(string) string, key any) *Set {
	k := defaultCode()
	if transform != nil {
		k = transformedCode(transform, key)
	}
	s := &Set{Lib: k.Lib}
	for _, e := range Entries {
		sc := &Script{Set: s, Forms: Forms{Eval: k.Evals[e.Name], Flagged: k.Flagged[e.Name], gate: make(chan struct{}, 1), wait: FirstCallWait}}
		if k.Lib != nil {
			sc.Fn = k.Lib.Fns[e.Name]
		}
		if e.Batch {
			sc.Batch = &Forms{Eval: k.BatchEvals[e.Name], Flagged: k.BatchFlagged[e.Name], gate: make(chan struct{}, 1), wait: FirstCallWait}
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
// same connection; see internal/callpath's Caller.Run) and returns what
// it came to.
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

// SetFirstCallWait sets how long each of s's calls waits its turn behind
// a first call that has not returned (FirstCallWait unless set), before
// any call of s is made: a test that counts the commands of concurrent
// first calls on a machine busy enough to take longer than FirstCallWait
// over them sets a longer one.
func (s *Set) SetFirstCallWait(d time.Duration) {
	for _, sc := range s.List {
		sc.Forms.wait = d
		if sc.Batch != nil {
			sc.Batch.wait = d
		}
	}
}

// FirstCallWait is the longest a call waits for the calls of its script
// ahead of it until one has returned (see Forms.Run): a few round trips
// of a script's first call, which loads it.
const FirstCallWait = 100 * time.Millisecond

// Run sends keys and args through s's forms, as Script.Run says. Until a
// call of s has returned, calls run one at a time (the first learns what
// the others need), each waiting its turn at most FirstCallWait and then
// going anyway; one whose ctx ends while it waits its turn returns ctx's
// error, nothing sent.
func (s *Forms) Run(ctx context.Context, set *Set, b backend.Backend, functions bool, send func(backend.Script) Result, keys, args []string) Result {
	if s.gate == nil || s.done.Load() {
		return s.run(ctx, set, b, functions, send, keys, args)
	}
	t := time.NewTimer(s.wait)
	select {
	case s.gate <- struct{}{}:
		t.Stop()
		if s.done.Load() { // the call ahead has returned: no turns now
			<-s.gate
			break
		}
		defer func() { <-s.gate }()
	case <-t.C:
		// The first is slow to return: go as without the gate.
	case <-ctx.Done():
		t.Stop()
		return Result{Err: ctx.Err()}
	}
	r := s.run(ctx, set, b, functions, send, keys, args)
	s.done.Store(true)
	return r
}

func (s *Forms) run(ctx context.Context, set *Set, b backend.Backend, functions bool, send func(backend.Script) Result, keys, args []string) Result {
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

// A Result is what a script call came to, as plain Go values: its reply
// (nil, int64, string, or []any of those) or the error that stood in its
// way. The Backend runs the call; everything above Run reads results only.
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

// On runs e on b.
func (e *EvalCode) On(ctx context.Context, b backend.Backend, keys []string, args ...string) Result {
	return e.Run(func(s backend.Script) Result {
		v, err := b.Script(ctx, s)
		return Result{v, err}
	}, keys, args)
}
