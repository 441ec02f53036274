// Package testhook builds the options that fairlock's tests, its demo and
// its bench pass to a Client and no program outside this module can: a
// transform of the source of every script the client runs (to break a rule
// on purpose, to instrument every redis.call, to turn the fast paths off),
// and go-redis hooks on the connections of its blocking reads (fault
// injection, command counters), which belong to a go-redis client fairlock
// builds and carries none of the caller's hooks.
//
// Each is a fairlock.Option for one client, not a setting of the process:
// the root package sets the functions below when it is initialised, and
// they return the option as any, since this package cannot import
// fairlock. [Transform] and [BlockingHooks] assert it back.
package testhook

import (
	"context"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	// TransformOption returns a fairlock.Option that passes the source of
	// each of the client's scripts (queue.lua and its includes with the
	// entry, whole, after the "#!lua" line of the flags its entry
	// declares, if any: see SplitShebang) through f. A client with a
	// transform runs its scripts by EVAL only: with that line where the
	// server reads it, without it elsewhere.
	TransformOption func(f func(src string) string) any
	// BlockingHooksOption returns a fairlock.Option that adds hooks to the
	// go-redis client a client built by fairlock.New makes for its
	// blocking reads (a Backend of another client ignores it).
	BlockingHooksOption func(hooks ...redis.Hook) any
	// EntryName names the entry (acquire, release...) whose script src
	// is, the whole source a transform is given; "" for none. Entries
	// that share a file share a script, named after the first of them
	// (wait's is release's, leader_get's leader's).
	EntryName func(src string) string
	// RunScript runs the script that serves op on client (a
	// *fairlock.Client) with keys and args as they are, through the
	// client's Backend and its scripts (a transform's, if it has one),
	// without WithReplicaAck's WAIT or any resend, and returns the
	// Backend's reply: the differential test's replays run recorded calls
	// through it.
	RunScript func(ctx context.Context, client any, op string, keys, args []string) (any, error)
	// Grants returns how many grants the acquisitions of client (a
	// *fairlock.Client) took, by how each learned of its grant: its own
	// acquire script's reply, a wake-up from its wake list, or its room's
	// refresh. A grant that a release pushed as a wake-up and that a
	// refresh found first is a wake-up that did not arrive.
	Grants func(client any) (reply, wake, refresh int64)
	// GivenBack returns how many grants the acquisitions of client (a
	// *fairlock.Client) gave back as heard too late: after the moment
	// their lease could have ended (the process stalled, or a resend
	// found its grant expired). A process that did not stall gives none.
	GivenBack func(client any) int64

	// OpFlags returns the flags (no-writes, allow-oom...) that the script
	// serving op declares, and false when no script serves op.
	OpFlags func(op string) (flags []string, ok bool)

	// Batches returns how many batches client (a *fairlock.Client) has
	// sent (WithBatching), and how many calls they held.
	Batches func(client any) (batches, calls int64)
)

// Transform returns TransformOption(f) as O (fairlock.Option).
func Transform[O any](f func(src string) string) O { return TransformOption(f).(O) }

// BlockingHooks returns BlockingHooksOption(hooks...) as O (fairlock.Option).
func BlockingHooks[O any](hooks ...redis.Hook) O { return BlockingHooksOption(hooks...).(O) }

// fastPathsOn is the line of queue.lua that turns the scripts' fast paths
// on.
const fastPathsOn = "local FAST_PATHS = true\n"

// NoFastPaths returns src with the scripts' fast paths turned off: every
// call then takes the general path. Tests compose it with other transforms
// to compare the two paths. It panics if src has no fast-path switch, so
// that a test cannot believe it turned off what no longer exists.
func NoFastPaths(src string) string {
	if !strings.Contains(src, fastPathsOn) {
		panic("testhook: the script has no fast-path switch (" + strings.TrimSpace(fastPathsOn) + ")")
	}
	return strings.Replace(src, fastPathsOn, "local FAST_PATHS = false\n", 1)
}

// BatchSuffix follows an entry's name in what EntryName says of the
// entry's batch form.
const BatchSuffix = " batch"

// shebang starts the line on which a script declares its flags
// ("#!lua flags=no-writes,allow-oom"), its source's first.
const shebang = "#!lua"

// SplitShebang splits src, a script's whole source as a transform is
// given it, into its "#!lua" line (with its newline; "" when the script
// declares no flags) and the rest. The line must stay first: a transform
// that adds code before the script adds it after the line.
func SplitShebang(src string) (line, rest string) {
	if !strings.HasPrefix(src, shebang) {
		return "", src
	}
	i := strings.IndexByte(src, '\n')
	if i < 0 {
		return src, ""
	}
	return src[:i+1], src[i+1:]
}

// Flags returns the flags that src's "#!lua" line declares (see
// SplitShebang), as Redis reads them; none when it has no such line.
func Flags(src string) []string {
	line, _ := SplitShebang(src)
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, "flags="); ok {
			return strings.Split(v, ",")
		}
	}
	return nil
}

// NoWrites reports whether src declares the flag no-writes: Redis (7 and
// later) then refuses every write the script attempts, and a transform
// must add none.
func NoWrites(src string) bool { return slices.Contains(Flags(src), "no-writes") }
