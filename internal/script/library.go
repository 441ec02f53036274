package script

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/fault"
)

// Library is the engine's scripts as one Redis function library (Redis 7.0
// and later, Valkey): loaded once per server, so that a call no longer
// defines the shared code afresh as an EVAL does. The Lua files stay the
// sources; the library wraps them (see NewLibrary). Its name and its
// functions' names carry a hash of the sources, so fairlock versions that
// differ in them can share one Redis (a rolling upgrade): each loads its
// own library, and none replaces another's.
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
// with the entry's flags. read returns a source file's text (Source, or a
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
