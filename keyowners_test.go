package fairlock

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/internal/keyslot"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/wait"
	"pgregory.net/rapid"
)

// One key, one owner: every key and channel fairlock names belongs to one
// object, whatever valid names, prefixes, condition names and client ids
// the objects have. The namers below are every function that names a key
// or channel; a new kind of key joins the check by adding a row.

// A keyObject is one thing that owns keys: its kind (a namer's) and what
// names it. Fields a kind does not use are ignored.
type keyObject struct {
	kind   string
	prefix string
	name   string // the semaphore's (or, for a control list, the semaphore whose wake list it reads with)
	cond   string // a condition's name
	client string // a client id, as newClient makes them (unmarked)
	seq    uint64 // a control list's number
}

// A keyNamer names the keys of one kind of object: its identity (two
// objects of one identity are one object, which may well name its keys
// twice) and its keys, or an error when the object's names are refused.
type keyNamer struct {
	kind string
	keys func(o keyObject) (id string, ks []string, err error)
}

var keyNamers = []keyNamer{
	{"semaphore", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		return fmt.Sprintf("semaphore %q %q", o.prefix, o.name), k.List(), err
	}},
	{"condition", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		if err == nil {
			err = validateCondName(o.cond)
		}
		return fmt.Sprintf("condition %q of %q %q", o.cond, o.prefix, o.name), condKeys(k, o.cond), err
	}},
	{"election", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		// Its mutex's keys are the semaphore's: the record and the channel.
		return fmt.Sprintf("election %q %q", o.prefix, o.name), []string{leaderKeys(k)[len(k.List())], leaderChannel(k)}, err
	}},
	{"latch", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		// Its count, its waiters' resource and their condition: every key
		// its ops declare.
		return fmt.Sprintf("latch %q %q", o.prefix, o.name), latchKeysOf(k).call(opLatchDown, 1).Keys, err
	}},
	{"own wake list on a latch", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		return fmt.Sprintf("wake list of %q on latch %q %q", o.client, o.prefix, o.name), []string{latchKeysOf(k).res.OwnWake(o.client)}, err
	}},
	{"control list beside an own wake list on a latch", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		return controlList(o, latchKeysOf(k).res.OwnWake(o.client), o.client, err)
	}},
	{"barrier", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		// Its state, its waiters' resource and their condition: every key
		// its ops declare.
		return fmt.Sprintf("barrier %q %q", o.prefix, o.name), barrierKeysOf(k).call(opBarrierAwait, 1).Keys, err
	}},
	{"own wake list on a barrier", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		return fmt.Sprintf("wake list of %q on barrier %q %q", o.client, o.prefix, o.name), []string{barrierKeysOf(k).res.OwnWake(o.client)}, err
	}},
	{"control list beside an own wake list on a barrier", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		return controlList(o, barrierKeysOf(k).res.OwnWake(o.client), o.client, err)
	}},
	{"own wake list", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		return fmt.Sprintf("wake list of %q on %q %q", o.client, o.prefix, o.name), []string{k.OwnWake(o.client)}, err
	}},
	{"own wake list of a marked client", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		id := keyspace.ProcessListMark(o.prefix) + o.client
		return fmt.Sprintf("wake list of %q on %q %q", id, o.prefix, o.name), []string{k.OwnWake(id)}, err
	}},
	{"client's one wake list", func(o keyObject) (string, []string, error) {
		id := keyspace.ProcessListMark(o.prefix) + o.client
		_, err := newConfig([]Option{WithPrefix(o.prefix)})
		return fmt.Sprintf("one wake list of %q under %q", id, o.prefix), []string{keyspace.ProcessList(o.prefix, id)}, err
	}},
	{"control list beside an own wake list", func(o keyObject) (string, []string, error) {
		k, err := keyspace.For(o.prefix, o.name)
		return controlList(o, k.OwnWake(o.client), o.client, err)
	}},
	{"control list beside the one wake list", func(o keyObject) (string, []string, error) {
		id := keyspace.ProcessListMark(o.prefix) + o.client
		_, err := newConfig([]Option{WithPrefix(o.prefix)})
		return controlList(o, keyspace.ProcessList(o.prefix, id), id, err)
	}},
}

// controlList names the control list numbered o.seq of client id whose
// blocking read takes wakeKey: one list per prefix, slot (hash tag),
// client and number.
func controlList(o keyObject, wakeKey, id string, err error) (string, []string, error) {
	w := &wait.Waits{Prefix: o.prefix, ID: id}
	return fmt.Sprintf("control list %d of %q under %q in tag %q", o.seq, id, o.prefix, keyslot.HashTag(wakeKey)), []string{w.CtlName(wakeKey, o.seq)}, err
}

// namerOf returns the namer of kind.
func namerOf(kind string) keyNamer {
	for _, n := range keyNamers {
		if n.kind == kind {
			return n
		}
	}
	panic("no namer " + kind)
}

// checkKeyOwners reports two valid objects that share a key, or one whose
// keys are not distinct.
func checkKeyOwners(a, b keyObject) error {
	idA, ksA, errA := namerOf(a.kind).keys(a)
	idB, ksB, errB := namerOf(b.kind).keys(b)
	// A prefix New refuses names nothing.
	if _, err := newConfig([]Option{WithPrefix(a.prefix)}); err != nil {
		errA = err
	}
	if _, err := newConfig([]Option{WithPrefix(b.prefix)}); err != nil {
		errB = err
	}
	for _, o := range []struct {
		id  string
		ks  []string
		err error
	}{{idA, ksA, errA}, {idB, ksB, errB}} {
		if o.err != nil {
			continue
		}
		seen := map[string]bool{}
		for _, k := range o.ks {
			if seen[k] {
				return fmt.Errorf("%s names the key %q twice", o.id, k)
			}
			seen[k] = true
		}
	}
	if errA != nil || errB != nil || idA == idB {
		return nil
	}
	for _, k := range ksA {
		if slices.Contains(ksB, k) {
			return fmt.Errorf("%s and %s share the key %q", idA, idB, k)
		}
	}
	return nil
}

// keyPieces are the bits collisions are made of: the suffixes and
// separators of keys, braces, and short names.
var keyPieces = []string{"a", "b", "c", "q", "s", "d", "h", "t", "w", "ld", "l", "L", "B", ":", "{", "}", "{a}", ":c", ":w:", ":ld", "L:s", "B:s", "x", "/", "1"}

// collidingText draws text made of keyPieces.
func collidingText(t *rapid.T, label string, max int) string {
	n := rapid.IntRange(0, max).Draw(t, label+" pieces")
	var s strings.Builder
	for i := range n {
		s.WriteString(rapid.SampledFrom(keyPieces).Draw(t, fmt.Sprintf("%s piece %d", label, i)))
	}
	return s.String()
}

// drawClient draws a client id as newClient makes them (before the
// keyspace.ProcessListMark): an optional owner label, '/', and random base32.
func drawClient(t *rapid.T, label string) string {
	id := rapid.SampledFrom([]string{"C", "ABC", "W", "Q1"}).Draw(t, label+" random")
	owner := rapid.SampledFrom([]string{"", "a", "host:1", "w:s", "c:q", "a}b"}).Draw(t, label+" owner")
	if _, err := newConfig([]Option{WithOwner(owner)}); owner != "" && err == nil {
		id = owner + "/" + id
	}
	return id
}

// drawKeyObject draws an object; other, if not nil, is an object drawn
// before, whose key text the new one's names are often cut from.
func drawKeyObject(t *rapid.T, label string, other *keyObject) keyObject {
	o := keyObject{
		kind:   rapid.SampledFrom(kindsOf(keyNamers)).Draw(t, label+" kind"),
		prefix: rapid.SampledFrom([]string{"", "a", "ab", "p:", "fairlock:", "a:"}).Draw(t, label+" prefix"),
		name:   rapid.SampledFrom([]string{"a", "b", "{a}:c", "{a}:w", "{a}:ld", "x{"}).Draw(t, label+" name"),
		cond:   rapid.SampledFrom([]string{"", "q", "s", "d", "h", "t", "c", "w", "ld"}).Draw(t, label+" cond"),
		client: drawClient(t, label+" client"),
		seq:    rapid.Uint64Range(0, 3).Draw(t, label+" seq"),
	}
	if rapid.Bool().Draw(t, label+" name of pieces") {
		o.name = collidingText(t, label+" name", 4)
	}
	if rapid.Bool().Draw(t, label+" cond of pieces") {
		o.cond = collidingText(t, label+" cond", 3)
	}
	if other == nil || rapid.IntRange(0, 3).Draw(t, label+" cut from the other") == 0 {
		return o
	}
	// Cut the names from a key of the other object, after this object's
	// prefix, at a separator: the name "{a}:c" and the condition "q" from
	// "fairlock:{a}:c:q", the name "b{c}" under the prefix "a" from
	// "ab{c}:s", and so on.
	_, ks, _ := namerOf(other.kind).keys(*other)
	if len(ks) == 0 {
		return o
	}
	key := rapid.SampledFrom(ks).Draw(t, label+" key")
	if rapid.Bool().Draw(t, label+" same prefix") {
		o.prefix = other.prefix
	} else {
		o.prefix = key[:rapid.IntRange(0, min(len(key), 4)).Draw(t, label+" prefix length")]
	}
	rest := strings.TrimPrefix(key, o.prefix)
	cuts := []int{len(rest)}
	for i := range len(rest) {
		if strings.IndexByte(":}/\x1f", rest[i]) >= 0 {
			cuts = append(cuts, i)
		}
	}
	i := rapid.SampledFrom(cuts).Draw(t, label+" cut")
	o.name = rest[:i]
	if rest[i:] != "" && rest[i] == '}' {
		o.name = rest[:i+1]
	} else if i < len(rest) && rapid.Bool().Draw(t, label+" cond from the rest") {
		o.cond = rest[i+1:]
		if j := strings.IndexAny(o.cond, ":\x1f"); j >= 0 {
			o.cond = o.cond[:j]
		}
	}
	return o
}

func kindsOf(ns []keyNamer) []string {
	var ks []string
	for _, n := range ns {
		ks = append(ks, n.kind)
	}
	return ks
}

// TestKeyOwners is the property: two different valid objects of any
// kinds never share a key or channel, and one object's keys are
// distinct.
func TestKeyOwners(t *testing.T) {
	if redistest.OffRace(t) {
		// Pure computation on names, no goroutines: the detector only
		// slows it.
		return
	}
	rapid.Check(t, func(t *rapid.T) {
		// A few objects, each but the first often cut from one before it;
		// every pair is checked.
		objs := []keyObject{drawKeyObject(t, "object 0", nil)}
		for i := range rapid.IntRange(1, 10).Draw(t, "objects") {
			from := rapid.IntRange(0, len(objs)-1).Draw(t, fmt.Sprintf("object %d from", i+1))
			objs = append(objs, drawKeyObject(t, fmt.Sprintf("object %d", i+1), &objs[from]))
		}
		// Each pair under every pair of kinds: an object's names drawn
		// for one kind may collide as another's.
		kinds := kindsOf(keyNamers)
		for i, a := range objs {
			for _, b := range objs[i:] {
				for _, a.kind = range kinds {
					for _, b.kind = range kinds {
						if err := checkKeyOwners(a, b); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
		}
	})
}

// FuzzKeyOwners checks the same with the fuzzer's objects, seeded with
// the collisions of the layout of ":"-separated derived keys: condition
// "q" of "a" against the semaphore "{a}:c", condition "c" of "a" against
// condition "" of "{a}:c", condition "s" against a semaphore's state,
// the default condition of "{a}:ld" against the election "a"'s channel, own wake lists against
// conditions of semaphores named "{a}:w" (the client "c:x/C"), and prefix "a" with the name "b{c}"
// against prefix "ab" with the name "c".
func FuzzKeyOwners(f *testing.F) {
	for _, s := range []struct {
		kindA, prefixA, nameA, condA string
		kindB, prefixB, nameB, condB string
	}{
		{"condition", "fairlock:", "a", "q", "semaphore", "fairlock:", "{a}:c", ""},
		{"condition", "fairlock:", "a", "c", "condition", "fairlock:", "{a}:c", ""},
		{"condition", "fairlock:", "a", "s", "semaphore", "fairlock:", "{a}:c", ""},
		{"condition", "fairlock:", "a", "d", "semaphore", "fairlock:", "{a}:c", ""},
		{"condition", "fairlock:", "{a}:ld", "", "election", "fairlock:", "a", ""},
		{"semaphore", "fairlock:", "{a}:ld", "", "election", "fairlock:", "a", ""},
		{"own wake list", "fairlock:", "a", "", "semaphore", "fairlock:", "{a}:w:c:x/C", ""},
		{"own wake list", "fairlock:", "a", "", "condition", "fairlock:", "{a}:w", "x/C"},
		{"semaphore", "a", "b{c}", "", "semaphore", "ab", "c", ""},
		{"condition", "a", "b{c}", "q", "condition", "ab", "c", "q"},
		{"control list beside the one wake list", "p:", "a", "", "semaphore", "p:", "{w:/2/C}:l", ""},
		{"latch", "p:", "a", "", "semaphore", "p:", "a", ""},
		{"latch", "p:", "a", "", "condition", "p:", "a", "L"},
		{"own wake list on a latch", "p:", "a", "", "own wake list", "p:", "a", ""},
		{"barrier", "p:", "a", "", "semaphore", "p:", "a", ""},
		{"barrier", "p:", "a", "", "latch", "p:", "a", ""},
		{"barrier", "p:", "a", "", "condition", "p:", "a", "B"},
		{"own wake list on a barrier", "p:", "a", "", "own wake list on a latch", "p:", "a", ""},
	} {
		f.Add(s.kindA, s.prefixA, s.nameA, s.condA, s.kindB, s.prefixB, s.nameB, s.condB, uint64(1), "c:x")
	}
	f.Fuzz(func(t *testing.T, kindA, prefixA, nameA, condA, kindB, prefixB, nameB, condB string, seq uint64, client string) {
		if !slices.Contains(kindsOf(keyNamers), kindA) || !slices.Contains(kindsOf(keyNamers), kindB) {
			return
		}
		// A client id as newClient makes it: an owner label newConfig
		// takes, '/', and random base32 (here: "C").
		if _, err := newConfig([]Option{WithOwner(client)}); err != nil || client == "" || client == "C" {
			client = "C"
		} else {
			client += "/C"
		}
		a := keyObject{kind: kindA, prefix: prefixA, name: nameA, cond: condA, client: client, seq: seq}
		b := keyObject{kind: kindB, prefix: prefixB, name: nameB, cond: condB, client: client, seq: seq}
		if err := checkKeyOwners(a, b); err != nil {
			t.Fatal(err)
		}
	})
}
