package fairlock

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/fairlock/fairlock/backend"
)

// library is the engine's scripts as one Redis function library (Redis 7.0
// and later, Valkey): loaded once per server, so that a call no longer
// defines the shared code afresh as an EVAL does. The Lua files stay the
// sources; the library wraps them (see newLibrary). Its name and its
// functions' names carry a hash of the sources, so fairlock versions that
// differ in them can share one Redis (a rolling upgrade): each loads its
// own library, and none replaces another's.
type library struct {
	name     string            // fairlock_<hash>
	fns      map[string]string // entry name -> function name
	batchFns map[string]string // entry name -> its batch form's function name (entry.batch)
	code     string            // FUNCTION LOAD's argument
}

// newLibrary wraps the scripts' sources into a library: queue.lua and the
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
func newLibrary(entries []entry, read func(file string) string) *library {
	var body strings.Builder
	body.WriteString(prelude(read))
	files := map[string]int{} // entry file -> index in bodies
	var bodies []string
	for _, e := range entries {
		if _, ok := files[e.file]; !ok {
			files[e.file] = len(bodies)
			bodies = append(bodies, read(e.file))
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
		fmt.Fprintf(h, "\x00%s %s %s %v", e.name, e.file, e.flags, e.batch)
	}
	hash := hex.EncodeToString(h.Sum(nil))[:16]
	l := &library{name: "fairlock_" + hash, fns: map[string]string{}, batchFns: map[string]string{}}
	var code strings.Builder
	fmt.Fprintf(&code, "#!lua name=%s\nlocal bodies, batches = {}, {}\nlocal function define()\n%s\nend\n", l.name, body.String())
	for _, e := range entries {
		flags := ""
		if e.flags != "" {
			flags = ", flags={'" + strings.ReplaceAll(e.flags, ",", "','") + "'}"
		}
		register := func(fn, table string) {
			fmt.Fprintf(&code, "redis.register_function{function_name='%s', callback=function(KEYS, ARGV)\n  if not bodies[%d] then define() end\n  return %s[%d](KEYS, ARGV)\nend%s}\n",
				fn, files[e.file]+1, table, files[e.file]+1, flags)
		}
		l.fns[e.name] = "fairlock_" + e.name + "_" + hash
		register(l.fns[e.name], "bodies")
		if e.batch {
			l.batchFns[e.name] = "fairlock_" + e.name + "_batch_" + hash
			register(l.batchFns[e.name], "batches")
		}
	}
	l.code = code.String()
	return l
}

// A failure is what an FCALL's error says of the function.
type failure int

const (
	fnRan         failure = iota // the call ran (or failed on its way): its reply stands
	fnMissing                    // this server has no such function: load the library
	fnUnsupported                // no FCALL here (miniredis, Redis 6.2), or not allowed to this user
)

// fcallFailure reads an FCALL's error.
func fcallFailure(err error) failure {
	msg, ok := replyOf(err)
	if !ok {
		return fnRan
	}
	switch {
	case strings.HasPrefix(msg, "ERR Function not found"):
		return fnMissing
	case strings.HasPrefix(msg, "ERR unknown command"), strings.HasPrefix(msg, "NOPERM"):
		return fnUnsupported
	}
	return fnRan
}

// A loadResult is what loading the library came to.
type loadResult int

const (
	loadOK      loadResult = iota // loaded, or there already
	loadFailed                    // not now (the connection, a failover, memory): try again next time
	loadRefused                   // never on this Redis: the library does not compile, or FUNCTION is not allowed
)

// load loads the library on every server of b that may serve a key: the
// node, or every Cluster master (the slot's owner may have changed since
// it was last seen). A library of that name already there is the same
// code (the name is its hash), so "already exists" is success (see
// Backend.LoadLibrary).
func (l *library) load(ctx context.Context, b backend.Backend) loadResult {
	err := b.LoadLibrary(ctx, l.code)
	msg, reply := replyOf(err)
	switch {
	case err == nil:
		return loadOK
	case reply && (strings.HasPrefix(msg, "ERR") || strings.HasPrefix(msg, "NOPERM")):
		return loadRefused
	}
	return loadFailed
}

// sha1Hex returns the SHA-1 of s in hex, as EVALSHA names a script.
func sha1Hex(s string) string {
	h := sha1.Sum([]byte(s))
	return hex.EncodeToString(h[:])
}
