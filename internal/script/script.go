// Package script is fairlock's script library: the Lua sources assembled
// into one script per entry (EVAL) and one function library (FCALL), the
// ops each entry serves, and the one place a script is sent (Script.Run),
// whatever the server offers: FCALL, EVALSHA or EVAL, with or without
// declared flags. It holds no connection of its own: a Backend sends.
package script

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
)

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
// function declares (see NewLibrary). Several ops may share an entry.
type Entry struct {
	Name, File string
	// Flags: allow-oom for the calls that free memory or keep it flat
	// (bounded: their tombstones at most), so that a full Redis still
	// releases, renews and drops leases; no-writes for a read;
	// allow-cross-slot-keys (CrossSlot) for the calls that run a queue
	// and so can grant a waiter of another process (all but the reads), whose wake-up goes
	// to that process's one wake list (keyspace.Keys.Wake), a key of a slot of its
	// own, which a node in cluster mode refuses a function (or a script
	// with flags) otherwise, even when it serves every slot. A Cluster
	// client's wake lists keep their semaphore's slot (wake_list in
	// lua/rules.lua), and a key of another node's slot, or of a slot on
	// the move, is refused with or without the flag. (An acquire runs
	// the queues that expired leases and dead waiters unblock before its
	// own request; a status reads only its keys.)
	Flags string
	// Batch: the client may send several concurrent calls of this entry
	// as one script call (see internal/callpath's Batcher), through its
	// batch form (BatchBody), which declares the same flags.
	Batch bool
}

// CrossSlot is the flag that lets a function reach keys of slots other
// than its declared keys' on the node it runs on (see Entry).
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
}

// An Op is one operation of the engine's scripts: what ARGV[1] names, the
// entry whose script serves it, and whether WithReplicaAck waits for its
// writes (WAIT on the same connection) before its reply counts. A pump
// goes on with work an acked op left, and the next acked op covers it; a
// status and an election's read write nothing.
type Op struct {
	Name       string
	EntryIndex int // index in entries
	Ack        bool
	NameArg    any // name, boxed once: the first argument of its every call
}

// The ops a client sends, each once.
var (
	OpAcquire     = newOp("acquire", "acquire", true)
	OpTry         = newOp("try", "acquire", true)
	OpRelease     = newOp("release", "release", true)
	OpRenew       = newOp("renew", "release", true)
	OpLeave       = newOp("leave", "release", true)
	OpWait        = newOp("wait", "wait", true)
	OpRefresh     = newOp("refresh", "refresh", true)
	OpRenewBatch  = newOp("renew_batch", "renew_batch", true)
	OpSignal      = newOp("signal", "signal", true)
	OpPump        = newOp("pump", "pump", false)
	OpStatus      = newOp("status", "status", false)
	OpLeaderSet   = newOp("leader_set", "leader", true)
	OpLeaderClear = newOp("leader_clear", "leader", true)
	OpLeaderGet   = newOp("leader_get", "leader_get", false)
)

// AllOps lists the ops, for OpNamed: the engine's, then those the
// primitives registered (Register).
var AllOps = []*Op{OpAcquire, OpTry, OpRelease, OpRenew, OpLeave, OpWait, OpRefresh, OpRenewBatch, OpSignal, OpPump, OpStatus, OpLeaderSet, OpLeaderClear, OpLeaderGet}

// sealed is set once the scripts are built (NewCode): an entry registered
// after would be missing from them.
var sealed atomic.Bool

// Register adds an op of a primitive built on the engine (a latch, a
// barrier) and the entry that serves it, both called name: the script is
// file (an entry of its own under lua/ops, which queue.lua's rule binds
// as every entry), declared to the server with flags (as Entry's), and
// ack says whether WithReplicaAck waits for its writes. The root package
// registers each primitive's ops from the primitive's own file when it is
// initialised, before any script is built; a late or second registration
// of a name panics.
func Register(name, file, flags string, ack bool) *Op {
	if sealed.Load() {
		panic("fairlock: op " + name + " registered after the scripts were built")
	}
	for _, e := range Entries {
		if e.Name == name {
			panic("fairlock: entry " + name + " registered twice")
		}
	}
	if OpNamed(name) != nil {
		panic("fairlock: op " + name + " registered twice")
	}
	Entries = append(Entries, Entry{name, file, flags, false})
	o := newOp(name, name, ack)
	AllOps = append(AllOps, o)
	return o
}

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

// A Call is one op ready to send: the keys it declares and its
// arguments, which begin with the op's name (ARGV[1] of every script).
type Call struct {
	Op   *Op
	Keys []string
	Args []string // as Redis receives them
	// Argv is args as go-redis takes them, each boxed in an interface,
	// those the client keeps (its id, its TTLs, a plan's permits) boxed
	// once rather than at every call; shorter than args (nil) when args
	// were appended to without it (see the root package's goRedis.send).
	Argv []any
	// Endless: the caller's context cannot end (the close's end that
	// boundBy gives it aside), so the call is sent alone through a
	// Backend that returns by its context's end (see Batcher.batches).
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
	var args []string
	var argv []any
	if 1+n <= len(callArgs{}.args) {
		// One allocation for both lists: most calls have few arguments.
		b := new(callArgs)
		args, argv = b.args[:1:1+n], b.argv[:1:1+n]
	} else {
		args, argv = make([]string, 1, 1+n), make([]any, 1, 1+n)
	}
	args[0], argv[0] = o.Name, o.NameArg
	return Call{Op: o, Keys: keys, Args: args, Argv: argv}
}

// callArgs holds the arguments of a call of up to 10 (NewCall): an
// acquire or a release on one semaphore has 8 or 9.
type callArgs struct {
	args [10]string
	argv [10]any
}

// With returns oc with args appended.
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

// Reply reads a script's array reply as integers and strings.
type Reply []any

func (r Reply) Int(i int) (int64, error) {
	if i >= len(r) {
		return 0, fmt.Errorf("short script reply %v", []any(r))
	}
	switch v := r[i].(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("unexpected script reply %v", []any(r))
}
