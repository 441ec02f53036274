// Package keyspace names the Redis keys of fairlock's objects: a
// semaphore's core keys, the keys derived from them (conditions, wake
// lists, control lists, an election's record, a latch's or a barrier's
// state), and a client's one wake list; and it validates the names they
// are made from.
package keyspace

import (
	"crypto/rand"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fairlock/fairlock/internal/fault"
	"github.com/fairlock/fairlock/internal/keyslot"
)

// MaxNameLen is the longest semaphore name, in bytes, that fairlock accepts;
// a longer one fails with fault.ErrInvalidName.
const MaxNameLen = 512

// MaxPrefixLen bounds the key prefix set with fairlock.WithPrefix.
const MaxPrefixLen = 256

// Keys names the Redis keys of one semaphore. Every key shares one hash tag,
// so a script that touches them all is valid on Redis Cluster.
type Keys struct {
	Base string   // prefix plus hash-tagged name; every key starts with it
	All  []string // the keys every script takes
}

// List returns the keys every script takes, in the order queue.lua's
// header gives.
func (k Keys) List() []string { return k.All }

// Sep separates the parts of a derived key (Keys.Derived): a control
// character, which no valid name, condition name, prefix, owner label or
// client id holds (For and the root package's condition and option checks refuse them; a
// client id is an owner label, rand.Text and ProcessListMark). The
// scripts build the derived keys they name (wake_list, cond_key) from
// KEY_SEP in queue.lua, which TestKeySepInStep holds equal to it.
const Sep = "\x1f"

// Derived key kinds: each names what a derived key holds.
const (
	KindCond         = "c"  // a condition variable's waiters; payload the condition name
	KindLeader       = "ld" // an election's leader record
	KindLeaderChange = "lc" // an election's change channel
	KindWake         = "w"  // one client's wake list on one semaphore; payload the client id
	KindControl      = "l"  // a listener's control list; payload client id and number
)

// kinds holds every kind in use: the engine's above, then those the
// primitives registered (RegisterKind).
var kinds = []string{KindCond, KindLeader, KindLeaderChange, KindWake, KindControl}

// RegisterKind returns kind, the kind of the keys a primitive built on the
// engine derives from a name's base (a latch's count, a barrier's state,
// whose waiters are a resource whose base is that key). The root package
// registers each from the primitive's own file when it is initialised. A
// kind already in use panics, so no two primitives' keys meet.
func RegisterKind(kind string) string {
	if kind == "" || strings.Contains(kind, Sep) || slices.Contains(kinds, kind) {
		panic("fairlock: key kind " + strconv.Quote(kind) + " empty or in use")
	}
	kinds = append(kinds, kind)
	return kind
}

// Kinds returns every kind in use, for tests.
func Kinds() []string { return slices.Clone(kinds) }

// Derived returns the key or channel of kind (with payload, if any) hung
// under k's base: base, Sep, kind, then Sep and payload. It is the
// one way a key beside a semaphore's core keys (List) is named. As no part
// holds Sep, a derived key is never a core key (those hold none), and
// two derived keys are equal only if their bases, kinds and payloads are.
func (k Keys) Derived(kind string, payload ...string) string {
	return DerivedKey(k.Base, kind, payload...)
}

// DerivedKey is Keys.Derived on a base.
func DerivedKey(base, kind string, payload ...string) string {
	s := base + Sep + kind
	for _, p := range payload {
		s += Sep + p
	}
	return s
}

// Wake returns the list on which grants to one client's tickets arrive:
// for a client id marked with its key prefix's length (ProcessListMark,
// on one server), one list per client under that prefix, whatever the
// semaphore; otherwise one per client and semaphore (wake_list in
// lua/rules.lua, which falls back on the latter when another program's
// value holds the former).
func (k Keys) Wake(client string) string {
	if n, ok := ProcessListPrefix(client); ok && n <= len(k.Base) {
		return ProcessList(k.Base[:n], client)
	}
	return k.OwnWake(client)
}

// ProcessList returns the one wake list of a client under prefix, in a
// slot of its own. It is no key of any object: the text before its first
// '{' is the prefix (no prefix holds a brace), as it is in every key; it
// ends in '}' where a core key ends in ":s", ":q", ":d", ":h" or ":t"
// (For) and a control list in a number (the root package's ctlName); it holds no Sep,
// which every derived key holds; and the client id inside the braces
// holds none, so two clients' lists differ.
func ProcessList(prefix, client string) string {
	return prefix + "{w:" + client + "}"
}

// OwnWake returns one client's wake list on this semaphore alone.
func (k Keys) OwnWake(client string) string {
	return k.Derived(KindWake, client)
}

// ProcessListMark returns the mark that begins the id of a client whose
// waiters hear every grant on one list (see Keys.Wake): "/N/", N the
// length of its key prefix. It is given to a client on one server, where
// a blocking read may take keys of any name. No owner label holds a '/'.
func ProcessListMark(prefix string) string {
	return "/" + strconv.Itoa(len(prefix)) + "/"
}

// ProcessListPrefix reads the prefix length of ProcessListMark at the
// start of client.
func ProcessListPrefix(client string) (int, bool) {
	rest, ok := strings.CutPrefix(client, "/")
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "/")
	if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

// Unmarked returns client without its ProcessListMark.
func Unmarked(client string) string {
	if _, ok := ProcessListPrefix(client); ok {
		rest := client[1:]
		return rest[strings.IndexByte(rest, '/')+1:]
	}
	return client
}

// NewTicket returns a fresh, unguessable ticket id (more than 128 random
// bits). Only the holder of a Lease knows its ticket, so nobody else can
// release or renew it.
func NewTicket() string { return rand.Text() }

// For validates a semaphore name and returns the keys of that
// semaphore under prefix.
//
// A name that carries its own hash tag ("{acct}:17") is used as is, so names
// that share a tag share a Cluster slot (which multi-locks need). Any other
// name is wrapped in braces and is its own tag. Two kinds of name are
// refused, so that distinct names never share keys and every key of one
// semaphore has one non-empty hash tag:
//   - a name that is entirely one tag ("{acct}"): it would share its keys
//     with the plain name "acct";
//   - a name with no hash tag that contains '}' ("a}b", "}x", "{}x"): its
//     wrapped form "{a}b}" would be the tagged name "{a}b}", and "}x" would
//     wrap to "{}x}", whose keys have no usable tag and so land in
//     different Cluster slots;
//   - a name with a hash tag that does not begin with it ("acct{17}"): the
//     prefix "p" and the name "b{c}" would share the keys of the prefix
//     "pb" and the name "c".
//
// The prefix cannot hold braces (the root package's option check), so it never changes the tag,
// and every key (core, derived, a client's one wake list, a control list)
// begins with the prefix and then '{': the text before its first '{' is
// the prefix, so different prefixes never share a key.
func For(prefix, name string) (Keys, error) {
	tag := keyslot.HashTag(name)
	switch {
	case name == "":
		return Keys{}, fmt.Errorf("%w: empty", fault.ErrInvalidName)
	case len(name) > MaxNameLen:
		return Keys{}, fmt.Errorf("%w: %d bytes, longer than %d", fault.ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return Keys{}, fmt.Errorf("%w: %q is not valid UTF-8", fault.ErrInvalidName, name)
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return Keys{}, fmt.Errorf("%w: %q contains a control character", fault.ErrInvalidName, name)
	case tag != "" && name == "{"+tag+"}":
		return Keys{}, fmt.Errorf("%w: %q is only a hash tag; use %q, which lands in the same slot", fault.ErrInvalidName, name, tag)
	case tag != "" && name[0] != '{':
		return Keys{}, fmt.Errorf("%w: %q has a hash tag that does not begin it; start the name with its {tag}, as in %q", fault.ErrInvalidName, name, "{"+tag+"}:"+strings.Replace(name, "{"+tag+"}", "", 1))
	case tag == "" && strings.IndexByte(name, '}') >= 0:
		return Keys{}, fmt.Errorf("%w: %q contains '}' but no hash tag (a non-empty {tag}); remove the '}' or give the name a tag, such as \"{x}:a}b\"", fault.ErrInvalidName, name)
	}
	base := prefix + "{" + name + "}"
	if tag != "" {
		base = prefix + name
	}
	return Core(base), nil
}

// Core returns the keys of the resource whose keys start with base:
// a semaphore's (For), a latch's waiters', or a barrier's (the root
// package's latch and barrier keys).
func Core(base string) Keys {
	return Keys{Base: base, All: []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}}
}
