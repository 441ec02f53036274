package fairlock

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/fairlock/fairlock/internal/keyslot"
)

// MaxNameLen is the longest semaphore name, in bytes, that fairlock accepts;
// a longer one fails with [ErrInvalidName].
const MaxNameLen = 512

// maxPrefixLen bounds the key prefix set with [WithPrefix].
const maxPrefixLen = 256

// keys names the Redis keys of one semaphore. Every key shares one hash tag,
// so a script that touches them all is valid on Redis Cluster.
type keys struct {
	base string   // prefix plus hash-tagged name; every key starts with it
	all  []string // the keys every script takes
}

// list returns the keys every script takes, in the order queue.lua's
// header gives.
func (k keys) list() []string { return k.all }

// keySep separates the parts of a derived key (keys.derived): a control
// character, which no valid name, condition name, prefix, owner label or
// client id holds (keysFor, validateCondName, newConfig refuse them; a
// client id is an owner label, rand.Text and processListMark). The
// scripts build the derived keys they name (wake_list, cond_key) from
// KEY_SEP in queue.lua, which TestKeySepInStep holds equal to it.
const keySep = "\x1f"

// Derived key kinds: each names what a derived key holds.
const (
	kindCond         = "c"  // a condition variable's waiters; payload the condition name
	kindLeader       = "ld" // an election's leader record
	kindLeaderChange = "lc" // an election's change channel
	kindWake         = "w"  // one client's wake list on one semaphore; payload the client id
	kindControl      = "l"  // a listener's control list; payload client id and number
	kindLatch        = "L"  // a countdown latch's count; its waiters are a resource whose base is this key
	kindBarrier      = "B"  // a cyclic barrier's state; its waiters are a resource whose base is this key
)

// derived returns the key or channel of kind (with payload, if any) hung
// under k's base: base, keySep, kind, then keySep and payload. It is the
// one way a key beside a semaphore's core keys (list) is named. As no part
// holds keySep, a derived key is never a core key (those hold none), and
// two derived keys are equal only if their bases, kinds and payloads are.
func (k keys) derived(kind string, payload ...string) string {
	return derivedKey(k.base, kind, payload...)
}

// derivedKey is keys.derived on a base.
func derivedKey(base, kind string, payload ...string) string {
	s := base + keySep + kind
	for _, p := range payload {
		s += keySep + p
	}
	return s
}

// wake returns the list on which grants to one client's tickets arrive:
// for a client id marked with its key prefix's length (processListMark,
// on one server), one list per client under that prefix, whatever the
// semaphore; otherwise one per client and semaphore (wake_list in
// lua/rules.lua, which falls back on the latter when another program's
// value holds the former).
func (k keys) wake(client string) string {
	if n, ok := processListPrefix(client); ok && n <= len(k.base) {
		return processList(k.base[:n], client)
	}
	return k.ownWake(client)
}

// processList returns the one wake list of a client under prefix, in a
// slot of its own. It is no key of any object: the text before its first
// '{' is the prefix (no prefix holds a brace), as it is in every key; it
// ends in '}' where a core key ends in ":s", ":q", ":d", ":h" or ":t"
// (keysFor) and a control list in a number (ctlName); it holds no keySep,
// which every derived key holds; and the client id inside the braces
// holds none, so two clients' lists differ.
func processList(prefix, client string) string {
	return prefix + "{w:" + client + "}"
}

// ownWake returns one client's wake list on this semaphore alone.
func (k keys) ownWake(client string) string {
	return k.derived(kindWake, client)
}

// processListMark returns the mark that begins the id of a client whose
// waiters hear every grant on one list (see keys.wake): "/N/", N the
// length of its key prefix. It is given to a client on one server, where
// a blocking read may take keys of any name. No owner label holds a '/'.
func processListMark(prefix string) string {
	return "/" + strconv.Itoa(len(prefix)) + "/"
}

// processListPrefix reads the prefix length of processListMark at the
// start of client.
func processListPrefix(client string) (int, bool) {
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

// unmarked returns client without its processListMark.
func unmarked(client string) string {
	if _, ok := processListPrefix(client); ok {
		rest := client[1:]
		return rest[strings.IndexByte(rest, '/')+1:]
	}
	return client
}

// newTicket returns a fresh, unguessable ticket id (more than 128 random
// bits). Only the holder of a Lease knows its ticket, so nobody else can
// release or renew it.
func newTicket() string { return rand.Text() }

// keysFor validates a semaphore name and returns the keys of that
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
// The prefix cannot hold braces (newConfig), so it never changes the tag,
// and every key (core, derived, a client's one wake list, a control list)
// begins with the prefix and then '{': the text before its first '{' is
// the prefix, so different prefixes never share a key.
func keysFor(prefix, name string) (keys, error) {
	tag := keyslot.HashTag(name)
	switch {
	case name == "":
		return keys{}, fmt.Errorf("%w: empty", ErrInvalidName)
	case len(name) > MaxNameLen:
		return keys{}, fmt.Errorf("%w: %d bytes, longer than %d", ErrInvalidName, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return keys{}, fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidName, name)
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return keys{}, fmt.Errorf("%w: %q contains a control character", ErrInvalidName, name)
	case tag != "" && name == "{"+tag+"}":
		return keys{}, fmt.Errorf("%w: %q is only a hash tag; use %q, which lands in the same slot", ErrInvalidName, name, tag)
	case tag != "" && name[0] != '{':
		return keys{}, fmt.Errorf("%w: %q has a hash tag that does not begin it; start the name with its {tag}, as in %q", ErrInvalidName, name, "{"+tag+"}:"+strings.Replace(name, "{"+tag+"}", "", 1))
	case tag == "" && strings.IndexByte(name, '}') >= 0:
		return keys{}, fmt.Errorf("%w: %q contains '}' but no hash tag (a non-empty {tag}); remove the '}' or give the name a tag, such as \"{x}:a}b\"", ErrInvalidName, name)
	}
	base := prefix + "{" + name + "}"
	if tag != "" {
		base = prefix + name
	}
	return coreKeys(base), nil
}

// coreKeys returns the keys of the resource whose keys start with base:
// a semaphore's (keysFor), a latch's waiters' (latchKeysOf), or a
// barrier's (barrierKeysOf).
func coreKeys(base string) keys {
	return keys{base: base, all: []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}}
}
