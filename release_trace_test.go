package fairlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/differential"
	"github.com/fairlock/fairlock/internal/keyspace"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/fairlock/fairlock/internal/testhook"
)

// traceRig drives the scripts directly at a clock of its own (µs), on a
// miniredis database, expiring keys by that clock as Redis would.
type traceRig struct {
	t   *testing.T
	r   *replayer
	now int64
}

func newTraceRig(t *testing.T) *traceRig { return newTraceRigWith(t, nil) }

// newTraceRigWith is newTraceRig running scripts changed by transform.
func newTraceRigWith(t *testing.T, transform func(string) string) *traceRig {
	m := miniredis.RunT(t)
	m.SetTime(time.Now())
	return &traceRig{t: t, r: newReplayer(t, "trace", m.Addr(), 1, replayed(transform)), now: time.Now().UnixMicro()}
}

func (g *traceRig) run(args ...string) any {
	return g.runOn([]string{"trace:{s}:s", "trace:{s}:q", "trace:{s}:d", "trace:{s}:h", "trace:{s}:t"}, args...)
}

func (g *traceRig) runOn(keys []string, args ...string) any {
	g.t.Helper()
	c := call{Keys: keys, Args: args, Time: []string{strconv.FormatInt(g.now/1e6, 10), strconv.FormatInt(g.now%1e6, 10)}}
	ctx := context.Background()
	if err := g.r.Prepare(ctx, c); err != nil {
		g.t.Fatal(err)
	}
	out, err := g.r.Run(ctx, c)
	if err != nil {
		return "error " + err.Error()
	}
	return out
}

func (g *traceRig) advance(ms int64) { g.now += ms * 1000 }

func (g *traceRig) dump() string {
	s, _ := g.r.Dump(context.Background(), "")
	return s
}

func tokenOf(t *testing.T, out any) string {
	r, ok := out.([]any)
	if !ok || len(r) < 4 {
		t.Fatalf("not granted: %v", out)
	}
	return fmt.Sprint(r[3])
}

// What a release answers when it finds no trace of its lease. A release
// leaves none, so an earlier run of the call released it if the call was
// sent while the lease lived; sent later, the lease may have ended long
// ago. The script answers ops.ReleasedNoTrace and the caller, which knows when
// it sent the call, decides (Lease.Release: TestReleaseAfterLapseIsLost).

// A release of a lease that expired, once the semaphore's keys are gone
// (their TTL ran out), finds no trace.
func TestReleaseAfterKeysExpiredFindsNoTrace(t *testing.T) {
	g := newTraceRig(t)
	tok := tokenOf(t, g.run("acquire", "TA", "PA", "200", "1000", "", "1", "1"))
	g.advance(10000)
	got := g.run("release", "TA", "PA", "200", "1000", "", "0", "1", tok)
	if fmt.Sprint(got) != "[3 0]" {
		t.Fatalf("release of a lapsed lease whose keys expired = %v; want [3 0] (no trace)\ndb: %s", got, g.dump())
	}
}

// A release of a lease that expired and was dropped (leaving its
// tombstone), sent after the tombstone's trim, finds no trace.
func TestReleaseAfterTombstoneTrimmedFindsNoTrace(t *testing.T) {
	g := newTraceRig(t)
	tok := tokenOf(t, g.run("acquire", "TA", "PA", "200", "1000", "", "1", "1"))
	g.advance(500) // TA's lease expires; PB's acquire drops it (tombstone x)
	tb := tokenOf(t, g.run("acquire", "TB", "PB", "30000", "1000", "", "1", "1"))
	if got := fmt.Sprint(g.run("release", "TA", "PA", "200", "1000", "", "0", "1", tok)); got != "[0 0]" {
		t.Fatalf("release of a lease dropped 0 s ago = %v; want [0 0] (its tombstone)", got)
	}
	g.advance(25000) // the tombstone's time comes
	if got := fmt.Sprint(g.run("release", "TB", "PB", "30000", "1000", "", "0", "1", tb)); got != "[1 0]" {
		t.Fatalf("PB's release = %v", got)
	}
	got := g.run("release", "TA", "PA", "200", "1000", "", "0", "1", tok)
	if fmt.Sprint(got) != "[3 0]" {
		t.Fatalf("release of a lease that lapsed 25 s ago = %v; want [3 0] (no trace)\ndb: %s", got, g.dump())
	}
}

// A resent release answers what its first run did, even when the first
// run trimmed tombstones and left the semaphore idle: the calling ticket's
// tombstone is kept, and so is the state that holds it.
func TestResentReleaseOfLapsedLeaseAnswersAlike(t *testing.T) {
	g := newTraceRig(t)
	tok := tokenOf(t, g.run("acquire", "TA", "PA", "200", "1000", "", "1", "1"))
	g.advance(500)
	tb := tokenOf(t, g.run("acquire", "TB", "PB", "300000", "1000", "", "1", "1"))
	g.advance(2000)
	if got := fmt.Sprint(g.run("release", "TB", "PB", "300000", "1000", "", "0", "1", tb)); got != "[1 0]" {
		t.Fatalf("PB's release = %v", got)
	}
	g.advance(20001) // TA's tombstone may be trimmed; its keys live on (PB's lease TTL)
	first := fmt.Sprint(g.run("release", "TA", "PA", "200", "1000", "", "0", "1", tok))
	db := g.dump()
	again := fmt.Sprint(g.run("release", "TA", "PA", "200", "1000", "", "0", "1", tok))
	if first != "[0 0]" || first != again {
		t.Fatalf("release of a lapsed lease answered %s, sent again %s; want [0 0] twice\ndb after the first run:\n%s", first, again, db)
	}
}

// A resent release answers what its first run did when the released
// ticket waits again (a delayed copy of its acquire, taken for a new
// request once the lease was released) and the first run drops that
// waiter as dead (the lease before it has lapsed, so the queue runs): a
// waiter's mark is no trace of the lease, so both runs find none.
func TestResentReleaseOfRequeuedTicketAnswersAlike(t *testing.T) {
	g := newTraceRig(t)
	tok := tokenOf(t, g.run("acquire", "TA", "PA", "10000", "1000", "", "1", "1"))
	if got := fmt.Sprint(g.run("release", "TA", "PA", "10000", "1000", "", "0", "1", tok)); got != "[1 0]" {
		t.Fatalf("PA's release = %v", got)
	}
	tokenOf(t, g.run("acquire", "TB", "PB", "1200", "1000", "", "1", "1"))
	if got, _ := g.run("acquire", "TA", "PA", "10000", "1000", "", "1", "1").([]any); len(got) == 0 || got[0] != int64(ops.AcqQueued) {
		t.Fatalf("the delayed copy of TA's acquire = %v, want it queued", got)
	}
	g.advance(1500) // past the copy's deadline (its waiter is dead) and PB's lease
	first := fmt.Sprint(g.run("release", "TA", "PA", "10000", "1000", "", "0", "1", tok))
	db := g.dump()
	again := fmt.Sprint(g.run("release", "TA", "PA", "10000", "1000", "", "0", "1", tok))
	if first != "[3 0]" || first != again {
		t.Fatalf("release of a released lease whose ticket waited again answered %s, sent again %s; want [3 0] twice\ndb after the first run:\n%s", first, again, db)
	}
}

// A resent release of a lease (here a condition wait's, which releases
// it) that finds its ticket granted again, under another token, by a late
// copy of its acquire after the release, leaves that grant's record: it is
// a later lease of the ticket, not the call's. Ending it (a tombstone)
// let the record's tombstone be trimmed while that lease lived, and a
// further copy of the acquire was then granted too: one ticket held the
// semaphore twice.
func TestResentReleaseLeavesALaterGrantsRecord(t *testing.T) {
	g := newTraceRig(t)
	base := "trace:{s}"
	all := []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	withCond := append(slices.Clip(all), condKeys(keyspace.Keys{Base: base, All: all}, "x")...)
	acquire := func() []any {
		got, _ := g.run("acquire", "TA", "PA", "200000", "3000", "", "1", "2").([]any)
		return got
	}
	first := tokenOf(t, acquire())
	wait := func() string {
		return fmt.Sprint(g.runOn(withCond, "wait", "TA", "PA", "200000", "3000", "", "0", "1", first, "TW", "x"))
	}
	if got := wait(); !strings.HasPrefix(got, "[1 ") {
		t.Fatalf("the condition wait = %v", got)
	}
	g.runOn(withCond, "leave", "TW", "PA", "200000", "3000", "", "0", "1", "0")
	later := tokenOf(t, acquire()) // a late copy, taken for a new request
	// (The withdrawal left the new ticket's tombstone: the copy takes
	// itself for a resend of a wait that ran, and does nothing.)
	if got := wait(); !strings.HasPrefix(got, "[1 0 ") {
		t.Fatalf("the condition wait sent again = %v, want [1 0 ...] (the new ticket has ended: nothing done)", got)
	}
	g.advance(20000) // past every tombstone's time
	g.run("pump")
	for i := range 2 {
		got := acquire()
		if len(got) < 4 || got[0] != int64(ops.AcqGrantedBefore) || fmt.Sprint(got[3]) != later {
			t.Fatalf("copy %d of the acquire = %v, want %d with the later grant's token %s\n%s", i+1, got, ops.AcqGrantedBefore, later, g.dump())
		}
	}
	st := statecheck.State{Prefix: "trace:", Bases: []string{base}, At: g.now / 1000, Shift: differential.ExpiryShift}
	if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
		t.Fatalf("%v\n%s", err, g.dump())
	}
}

// A leave of a condition waiter that died (its deadline passed) and whose
// condition's key expired since (the key lives as long as its waiters'
// deadlines; the semaphore's keys have moved past it, a later lease
// holding them) drops it: it no longer counts as a waiter on a condition,
// and its deadline leaves :d. It once only forgot its mark, and a later
// purge took its deadline out of :d without the count: the semaphore then
// counted a waiter that did not exist for as long as its state lived.
func TestLeaveOfDeadConditionWaiterWhoseKeyExpired(t *testing.T) {
	g := newTraceRig(t)
	base := "trace:{s}"
	all := []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	cond := condKeys(keyspace.Keys{Base: base, All: all}, "")
	withCond := append(slices.Clip(all), cond...)
	tok := tokenOf(t, g.run("acquire", "TA", "PA", "10000", "1000", "", "1", "2"))
	if got := fmt.Sprint(g.runOn(withCond, "wait", "TA", "PA", "10000", "1000", "", "0", "1", tok, "TW", "")); !strings.HasPrefix(got, "[1 ") {
		t.Fatalf("the condition wait = %v", got)
	}
	tokenOf(t, g.run("acquire", "TB", "PB", "300000", "1000", "", "1", "2")) // the keys move minutes ahead
	g.advance(60000)                                                         // TW is dead, its condition's key gone
	g.runOn(withCond, "leave", "TW", "PA", "10000", "1000", "", "0", "1", "0")
	st := statecheck.State{Prefix: "trace:", Bases: []string{base}, At: g.now / 1000, Shift: differential.ExpiryShift}
	if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
		t.Fatalf("after the leave: %v\n%s", err, g.dump())
	}
	if nc, _ := g.r.RDB.HGet(context.Background(), base+":s", "nc").Result(); nc != "" {
		t.Fatalf("after the leave the state counts %s waiters on conditions, want none\n%s", nc, g.dump())
	}
}

// A holder stopped well past its lease (a long pause) whose semaphore's
// keys have gone meanwhile calls Release: it sent the call after its
// lease's deadline, so the answer "no trace" means lost, not released.
func TestReleaseAfterLapseIsLost(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		const ttl = 200 * time.Millisecond
		c, err := New(b.Client(t), WithPrefix(redistest.Prefix(t)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		l, err := c.Acquire(ctx, Request{Name: "lapse", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		c.sched.Lock() // no renewal runs: the process is stopped
		if b.Mini != nil {
			b.Mini.FastForward(3 * time.Second)
			time.Sleep(ttl + ttl/2)
		} else {
			time.Sleep(3 * time.Second) // past the keys' TTL (about 2 s)
		}
		// The process resumes: Release runs before the renewal timer
		// (it stops the renewal first; the timer then finds it stopped).
		done := make(chan error, 1)
		go func() { done <- l.Release(ctx) }()
		time.Sleep(50 * time.Millisecond)
		c.sched.Unlock()
		if err := <-done; !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Release of a lease that lapsed (and whose keys expired) = %v; want ErrLeaseLost", err)
		}
	})
}

// A late copy of a multi-request's acquire that finds no trace of its
// ticket on its first semaphore (the part there expired, was dropped and
// its tombstone trimmed) but its expired part still held on another
// (nobody came by there) is the first request's, not a new one: it answers
// granted before, expired, and grants nothing. It was once granted anew on
// both, and the ticket held the second semaphore twice (its expired lease
// and the new one, which capacity 2 let in), until the old lease's purge
// wrote its tombstone over the new grant's record.
func TestLateMultiAcquireSeesItsPartLeftOnAnotherSemaphore(t *testing.T) {
	g := newTraceRig(t)
	a, b := "trace:{a}", "trace:{b}"
	keysOf := func(base string) []string {
		return []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	}
	both := append(keysOf(a), keysOf(b)...)
	group := a + "\t1\t1\t" + b + "\t1\t2"
	acquire := func() []any {
		got, _ := g.runOn(both, "acquire", "TM", "PM", "200000", "3000", group, "1", "1", "1", "2").([]any)
		return got
	}
	if got := acquire(); len(got) != 5 || got[0] != int64(1) {
		t.Fatalf("the multi-request = %v, want granted at once", got)
	}
	g.advance(201000) // the lease has expired on both
	// Another request on a alone drops the expired part there (a
	// tombstone), and one more, past the tombstone's time, trims it; b
	// sees nobody.
	for _, ticket := range []string{"TA", "TB"} {
		tok := tokenOf(t, g.runOn(keysOf(a), "acquire", ticket, "PA", "200000", "3000", "", "1", "1"))
		g.runOn(keysOf(a), "release", ticket, "PA", "200000", "3000", "", "0", "1", tok)
		g.advance(21000)
	}
	got := acquire() // the late copy
	if len(got) < 3 || got[0] != int64(ops.AcqGrantedBefore) || got[2] != int64(0) {
		t.Fatalf("the late copy = %v, want %d (granted before) with expiry 0\n%s", got, ops.AcqGrantedBefore, g.dump())
	}
	st := statecheck.State{Prefix: "trace:", Bases: []string{a, b}, At: g.now / 1000, Shift: differential.ExpiryShift}
	if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
		t.Fatalf("%v\n%s", err, g.dump())
	}
}

// A grant handed over through the queue to a lease in :h (the state
// hash's place held by another), then confirmed by its holder's renewal,
// keeps its record: a late copy of its acquire finds it granted, not a
// ticket to queue again. (The holder kept in the state hash needs no
// record of its own; one in :h does.)
func TestLateCopyFindsAConfirmedHandoverInH(t *testing.T) {
	if err := lateCopyFindsConfirmedHandover(t, nil); err != nil {
		t.Fatal(err)
	}
}

// TestLateCopyFindsABatchConfirmedHandoverInH is
// TestLateCopyFindsAConfirmedHandoverInH with the confirmation sent in a
// batch of renewals (renew_batch.lua), as a process holding several
// leases on the semaphore sends it.
func TestLateCopyFindsABatchConfirmedHandoverInH(t *testing.T) {
	if err := lateCopyFindsBatchConfirmedHandover(t, nil); err != nil {
		t.Fatal(err)
	}
}

// lateCopyFindsConfirmedHandover is TestLateCopyFindsAConfirmedHandoverInH
// on scripts changed by transform: the error says what went wrong.
func lateCopyFindsConfirmedHandover(t *testing.T, transform func(string) string) error {
	return lateCopyAfterConfirmation(t, transform, false)
}

// lateCopyFindsBatchConfirmedHandover is
// TestLateCopyFindsABatchConfirmedHandoverInH on scripts changed by
// transform.
func lateCopyFindsBatchConfirmedHandover(t *testing.T, transform func(string) string) error {
	return lateCopyAfterConfirmation(t, transform, true)
}

// lateCopyAfterConfirmation runs the late copy's scenario, the grant
// confirmed by a renewal of its own or, batched, by renew_batch.
func lateCopyAfterConfirmation(t *testing.T, transform func(string) string, batched bool) error {
	g := newTraceRigWith(t, transform)
	acquire := func(ticket, client string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", "3000", "", "1", "2").([]any)
		return got
	}
	acquire("TA", "PA") // kept in the state hash
	held := acquire("TC", "PC")
	if len(held) < 4 || held[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("the second lease = %v, want granted", held)
	}
	if got := acquire("TB", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("the third request = %v, want queued", got)
	}
	g.run("release", "TC", "PC", "200000", "3000", "", "0", "1", fmt.Sprint(held[3]))
	// Handed over to TB in :h; a copy of its acquire learns the token.
	got := acquire("TB", "PB")
	if len(got) < 4 || got[0] != int64(ops.AcqGrantedBefore) {
		return fmt.Errorf("TB after the handover = %v, want granted before\n%s", got, g.dump())
	}
	token := fmt.Sprint(got[3])
	if batched {
		if got := fmt.Sprint(g.run("renew_batch", "PB", "TB", "1", token, "1", "200000")); got != "[[1] 0]" {
			return fmt.Errorf("the batched confirmation = %v, want [[1] 0]", got)
		}
	} else if got := fmt.Sprint(g.run("renew", "TB", "PB", "200000", "3000", "", "1", "1", token)); got != "[1 0]" {
		return fmt.Errorf("the confirmation = %v, want [1 0]", got)
	}
	got = acquire("TB", "PB") // a late copy
	if len(got) < 4 || got[0] != int64(ops.AcqGrantedBefore) || fmt.Sprint(got[3]) != token || got[2] == int64(0) {
		return fmt.Errorf("a late copy of TB's acquire after its confirmation = %v, want %d with token %s, live\n%s", got, ops.AcqGrantedBefore, token, g.dump())
	}
	return nil
}

// A process that queues again a little while (under a third of its waiter
// TTL) after its liveness field was last written moves the field on: its
// new waiter lives a whole waiter TTL from the call, as after a refresh,
// since the process's first refresh comes a third of the TTL later. Left
// as it was, the field would let a pause of just over two thirds of the
// TTL after the call kill the new waiter (and the old one with it: the
// process's waiters live together). Found by the long
// TestFastPathsMatchGeneralPath/property: a barrier party that awaited
// 800 ms after its previous round died in a 2999 ms pause (3.6 s TTL).
func TestNewWaiterLivesAWholeTTL(t *testing.T) {
	if err := newWaiterLivesAWholeTTL(t, nil); err != nil {
		t.Fatal(err)
	}
}

// newWaiterLivesAWholeTTL is TestNewWaiterLivesAWholeTTL on scripts
// changed by transform: the error says what went wrong.
func newWaiterLivesAWholeTTL(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	acquire := func(ticket, client string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", "3000", "", "1", "1").([]any)
		return got
	}
	held := acquire("TA", "PA")
	if len(held) < 4 || held[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("the first lease = %v, want granted", held)
	}
	if got := acquire("TB", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's first request = %v, want queued", got)
	}
	g.advance(600) // under a third of the waiter TTL (3 s)
	if got := acquire("TC", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's second request = %v, want queued", got)
	}
	g.advance(2900) // 3500 ms after TB's call, 2900 ms after TC's
	g.run("release", "TA", "PA", "200000", "3000", "", "0", "1", fmt.Sprint(held[3]))
	if d := g.dump(); !strings.Contains(d, "o = TB ") {
		return fmt.Errorf("after the release, the holder is not PB's first request TB (PB's waiters died within a waiter TTL of its last call)\n%s", d)
	}
	return nil
}

// A process whose liveness deadline passed (it paused past its waiter
// TTL) and that then queues again writes its liveness field anew: the
// waiters it queued before are dead and stay dead (the field's born is
// the new waiter's sequence), so the release hands on to its new waiter,
// not to the old one, which it reported gone.
func TestDeadProcessWaitersStayDead(t *testing.T) {
	if err := deadProcessWaitersStayDead(t, nil); err != nil {
		t.Fatal(err)
	}
}

// deadProcessWaitersStayDead is TestDeadProcessWaitersStayDead on scripts
// changed by transform: the error says what went wrong.
func deadProcessWaitersStayDead(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	acquire := func(ticket, client string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", "3000", "", "1", "1").([]any)
		return got
	}
	held := acquire("TA", "PA")
	if len(held) < 4 || held[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("the first lease = %v, want granted", held)
	}
	if got := acquire("TB", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's first request = %v, want queued", got)
	}
	g.advance(4000) // PB's waiter TTL (3 s) passes unrefreshed
	if got := acquire("TC", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's second request = %v, want queued", got)
	}
	g.run("release", "TA", "PA", "200000", "3000", "", "0", "1", fmt.Sprint(held[3]))
	if d := g.dump(); !strings.Contains(d, "o = TC ") {
		return fmt.Errorf("after the release, the holder is not PB's new request TC\n%s", d)
	}
	return nil
}

// A waiter queued while its process's liveness field needs no write (it
// was written in the same millisecond, for the same TTL) must still keep
// the keys alive until that deadline: an idle resource's keys may have
// been given a short TTL since the field was written (the release that
// left it idle), and nothing else the script writes asks for more. Seen
// in the long TestPropertyRealRedis: "key ...:q expires at ..., before
// its latest waiter's deadline" (a multi-request queued on a semaphore
// whose field was fresh).
func TestQueuedBehindAFreshFieldKeepsTheKeys(t *testing.T) {
	if err := queuedBehindAFreshFieldKeepsTheKeys(t, nil); err != nil {
		t.Fatal(err)
	}
}

// queuedBehindAFreshFieldKeepsTheKeys is
// TestQueuedBehindAFreshFieldKeepsTheKeys on scripts changed by transform
// (through the general path): the error says what went wrong.
func queuedBehindAFreshFieldKeepsTheKeys(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, differential.Compose(transform, testhook.NoFastPaths))
	const wait = "3600000" // an hour
	acquire := func(ticket, client string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", wait, "", "1", "1").([]any)
		return got
	}
	// Everything below runs in one millisecond of Redis's clock.
	held := acquire("TA", "PA")
	if len(held) < 4 || held[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("the first lease = %v, want granted", held)
	}
	if got := acquire("TB", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's first request = %v, want queued", got)
	}
	g.run("leave", "TB", "PB", "200000", wait, "", "0", "1", "0")
	// Idle: the keys' TTL falls to a few seconds.
	g.run("release", "TA", "PA", "200000", wait, "", "0", "1", fmt.Sprint(held[3]))
	if got := acquire("TC", "PC"); len(got) < 1 || got[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("PC's request = %v, want granted\n%s", got, g.dump())
	}
	if got := acquire("TD", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's second request = %v, want queued\n%s", got, g.dump())
	}
	// The keys' expiry as the scripts keep it (the state's exp), against
	// PB's liveness deadline.
	st, err := g.r.RDB.HGetAll(context.Background(), "trace:{s}:s").Result()
	if err != nil {
		return err
	}
	exp, _ := strconv.ParseInt(st["exp"], 10, 64)
	var live int64
	for f, v := range st {
		if strings.HasPrefix(f, "l") && strings.HasSuffix(f, "PB") {
			live, _ = strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	if live == 0 || exp < live {
		return fmt.Errorf("the keys expire at %d, before PB's liveness deadline %d (its waiter TD's)\n%s", exp, live, g.dump())
	}
	return nil
}

// A release on a semaphore of capacity 1 takes its queue's head with
// ZPOPMIN; a head its fast path cannot serve (here a multi-lock request
// that still waits for another semaphore) goes back as it was, key and
// expiry, before the general path takes the release.
func TestPoppedHeadPutBack(t *testing.T) {
	if err := poppedHeadPutBack(t, nil); err != nil {
		t.Fatal(err)
	}
}

// poppedHeadPutBack is TestPoppedHeadPutBack on scripts changed by
// transform: the error says what went wrong.
func poppedHeadPutBack(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	a, b := "trace:{a}", "trace:{b}"
	keysOf := func(base string) []string {
		return []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	}
	ta := tokenOf(t, g.runOn(keysOf(a), "acquire", "TA", "PA", "200000", "3000", "", "1", "1"))
	tokenOf(t, g.runOn(keysOf(b), "acquire", "TB", "PB", "200000", "3000", "", "1", "1"))
	group := a + "\t1\t1\t" + b + "\t1\t1"
	if got, _ := g.runOn(append(keysOf(a), keysOf(b)...), "acquire", "TM", "PM", "200000", "3000", group, "1", "1", "1", "1").([]any); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("the multi-request = %v, want queued", got)
	}
	g.advance(10)
	if got, _ := g.runOn(keysOf(a), "release", "TA", "PA", "200000", "3000", "", "0", "1", ta).([]any); len(got) < 1 || got[0] != int64(1) {
		return fmt.Errorf("the release = %v, want released", got)
	}
	st := statecheck.State{Prefix: "trace:", Bases: []string{a, b}, At: g.now / 1000, Shift: differential.ExpiryShift}
	if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
		return fmt.Errorf("%v\n%s", err, g.dump())
	}
	// It waits on both semaphores still: b is held.
	if d := g.dump(); !strings.Contains(d, "trace:{a}:q zset") || !strings.Contains(d, "trace:{b}:q zset") {
		return fmt.Errorf("the multi-request no longer waits on both semaphores\n%s", d)
	}
	return nil
}

// A busy semaphore keeps no liveness field of every process that ever
// waited on it: the script that finds the fields' bound due (lmin) reads
// them all and deletes the dead ones, so the state hash its hot paths read
// stays small.
func TestDeadFieldsGo(t *testing.T) {
	if err := deadFieldsGo(t, nil); err != nil {
		t.Fatal(err)
	}
}

// deadFieldsGo is TestDeadFieldsGo on scripts changed by transform: the
// error says what went wrong.
func deadFieldsGo(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	fields := func() (n int) {
		st, err := g.r.RDB.HGetAll(context.Background(), "trace:{s}:s").Result()
		if err != nil {
			t.Fatal(err)
		}
		for f := range st {
			if strings.HasPrefix(f, statecheck.LiveField("")) {
				n++
			}
		}
		return n
	}
	tokenOf(t, g.run("acquire", "TA", "PA", "200000", "3000", "", "1", "1"))
	for i := range 5 {
		got, _ := g.run("acquire", fmt.Sprintf("TW%dX", i), fmt.Sprintf("PW%d", i), "200000", "3000", "", "1", "1").([]any)
		if len(got) < 1 || got[0] != int64(ops.AcqQueued) {
			return fmt.Errorf("waiter %d = %v, want queued", i, got)
		}
	}
	if n := fields(); n != 5 {
		return fmt.Errorf("%d liveness fields for 5 waiting processes\n%s", n, g.dump())
	}
	g.advance(4000) // their waiter TTL passes unrefreshed
	if got, _ := g.run("acquire", "TN", "PN", "200000", "3000", "", "1", "1").([]any); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("the new waiter = %v, want queued", got)
	}
	if n := fields(); n != 1 {
		return fmt.Errorf("%d liveness fields after the others died, want the new waiter's process's alone\n%s", n, g.dump())
	}
	st := statecheck.State{Prefix: "trace:", Bases: []string{"trace:{s}"}, At: g.now / 1000, Shift: differential.ExpiryShift}
	if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
		return fmt.Errorf("%v\n%s", err, g.dump())
	}
	return nil
}

// A liveness field another program overwrote with a value fairlock did
// not write counts as none: its process's waiters are dead, and the call
// that queues the process's next waiter writes the field anew (born: its
// sequence). That must move zq past the older waiters, as writing a dead
// field anew does; otherwise a handing release's fast path serves an
// older one unread (from zq on, lmin not due) where the general path
// drops it as dead.
func TestGarbageFieldWrittenAnewMovesZq(t *testing.T) {
	if err := garbageFieldWrittenAnewMovesZq(t, nil); err != nil {
		t.Fatal(err)
	}
}

// garbageFieldWrittenAnewMovesZq is TestGarbageFieldWrittenAnewMovesZq
// on scripts changed by transform: the error says what went wrong.
func garbageFieldWrittenAnewMovesZq(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	acquire := func(ticket, client string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", "3000", "", "1", "1").([]any)
		return got
	}
	held := acquire("TA", "PA")
	if len(held) < 4 || held[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("the first lease = %v, want granted", held)
	}
	if got := acquire("TB", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's first request = %v, want queued", got)
	}
	// Another program's mistake: PB's field no longer says anything.
	if err := g.r.RDB.HSet(context.Background(), "trace:{s}:s", statecheck.LiveField("PB"), "garbage").Err(); err != nil {
		return err
	}
	g.advance(10)
	if got := acquire("TC", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PB's second request = %v, want queued", got)
	}
	st := statecheck.State{Prefix: "trace:", Bases: []string{"trace:{s}"}, At: g.now / 1000, Shift: differential.ExpiryShift}
	if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
		return fmt.Errorf("after PB's second request: %v\n%s", err, g.dump())
	}
	g.advance(10)
	g.run("release", "TA", "PA", "200000", "3000", "", "0", "1", fmt.Sprint(held[3]))
	if d := g.dump(); !strings.Contains(d, "o = TC ") {
		return fmt.Errorf("after the release, the holder is not PB's live request TC\n%s", d)
	}
	return nil
}

// A state hash lost while :h still holds a lease (another program's DEL,
// or an eviction under a policy other than noeviction) is rebuilt from the
// sorted sets by the general path (rebuild), which counts that lease. An
// acquire's fast path that finds no state must not take it for a new,
// empty semaphore: granting at once there gives more leases than the
// capacity.
func TestLostStateHashKeepsTheCapacity(t *testing.T) {
	if err := lostStateHashKeepsTheCapacity(t, nil); err != nil {
		t.Fatal(err)
	}
}

// lostStateHashKeepsTheCapacity is TestLostStateHashKeepsTheCapacity on
// scripts changed by transform: the error says what went wrong.
func lostStateHashKeepsTheCapacity(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	acquire := func(ticket, client string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", "3000", "", "1", "2").([]any)
		return got
	}
	a := acquire("TA", "PA") // kept in the state hash
	if len(a) < 4 || a[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("TA = %v, want granted", a)
	}
	if got := acquire("TB", "PB"); len(got) < 4 || got[0] != int64(ops.AcqGranted) { // in :h
		return fmt.Errorf("TB = %v, want granted", got)
	}
	g.advance(10)
	g.run("release", "TA", "PA", "200000", "3000", "", "0", "1", fmt.Sprint(a[3]))
	// TB alone holds, in :h. The state hash is lost.
	if err := g.r.RDB.Del(context.Background(), "trace:{s}:s").Err(); err != nil {
		return err
	}
	g.advance(10)
	granted := 0
	for _, x := range []string{"C", "D"} {
		if got := acquire("T"+x, "P"+x); len(got) > 0 && got[0] == int64(ops.AcqGranted) {
			granted++
		}
	}
	if granted > 1 {
		return fmt.Errorf("TC and TD were both granted while TB holds: 3 leases on a semaphore of capacity 2\n%s", g.dump())
	}
	return nil
}

// A handing release on a mutex pops its queue's head first, and puts a
// head it cannot serve back with the keys' expiry as the state says it.
// A state without exp (another program's mistake) says none: the queue's
// last member popped and put back leaves its key without a TTL, and when
// the general path then refuses the call (here a foreign :t), the script
// has failed after a write that stays.
func TestPoppedHeadKeepsItsKeysTTL(t *testing.T) {
	if err := poppedHeadKeepsItsKeysTTL(t, nil); err != nil {
		t.Fatal(err)
	}
}

// poppedHeadKeepsItsKeysTTL is TestPoppedHeadKeepsItsKeysTTL on scripts
// changed by transform: the error says what went wrong.
func poppedHeadKeepsItsKeysTTL(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	ctx := context.Background()
	acquire := func(ticket, client string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", "3000", "", "1", "1").([]any)
		return got
	}
	held := acquire("TA", "PA")
	if len(held) < 4 || held[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("the first lease = %v, want granted", held)
	}
	if got := acquire("TW", "PW"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("PW's request = %v, want queued", got)
	}
	// Another program's mistakes: the state loses exp, and :t (which a
	// tombstone's tnext says holds one) is a string.
	if err := g.r.RDB.HDel(ctx, "trace:{s}:s", "exp").Err(); err != nil {
		return err
	}
	if err := g.r.RDB.HSet(ctx, "trace:{s}:s", "tnext", fmt.Sprint(g.now/1000+100000)).Err(); err != nil {
		return err
	}
	if err := g.r.RDB.Set(ctx, "trace:{s}:t", "garbage", 0).Err(); err != nil {
		return err
	}
	g.advance(10)
	got := g.run("release", "TA", "PA", "200000", "3000", "", "0", "1", fmt.Sprint(held[3]))
	if s, _ := got.(string); !strings.Contains(s, "FAIRLOCK_FOREIGN_KEY") {
		return fmt.Errorf("the release = %v, want refused (foreign :t)", got)
	}
	if ttl := g.r.RDB.PTTL(ctx, "trace:{s}:q").Val(); ttl < 0 {
		return fmt.Errorf("the refused release left :q without a TTL (%v)\n%s", ttl, g.dump())
	}
	return nil
}

// A state hash lost while a lease is held in :h and a waiter queued
// (another program's DEL, or an eviction) is rebuilt from :h and :q by
// the next call; the keys' expiry it then writes covers the leases (the
// lost hash said how long they live), and the state checks.
func TestRebuiltStateKeepsItsKeys(t *testing.T) {
	if err := rebuiltStateKeepsItsKeys(t, nil); err != nil {
		t.Fatal(err)
	}
}

// rebuiltStateKeepsItsKeys is TestRebuiltStateKeepsItsKeys on
// scripts changed by transform: the error says what went wrong.
func rebuiltStateKeepsItsKeys(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	acquire := func(ticket, client, n string) []any {
		got, _ := g.run("acquire", ticket, client, "200000", "3000", "", n, "3").([]any)
		return got
	}
	// Capacity 3: TA (1 permit) kept in the state hash, TB (2) in :h; TC
	// (2) waits.
	for _, x := range [][2]string{{"A", "1"}, {"B", "2"}} {
		if got := acquire("T"+x[0], "P"+x[0], x[1]); len(got) < 4 || got[0] != int64(ops.AcqGranted) {
			return fmt.Errorf("T%s = %v, want granted", x[0], got)
		}
	}
	if got := acquire("TC", "PC", "2"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("TC = %v, want queued", got)
	}
	if err := g.r.RDB.Del(context.Background(), "trace:{s}:s").Err(); err != nil {
		return err
	}
	g.advance(10)
	// Rebuilt from :h and :q: TB's 2 permits in use, TC (2) still does
	// not fit and stays queued, its process's field gone.
	acquire("TD", "PD", "2")
	st := statecheck.State{Prefix: "trace:", Bases: []string{"trace:{s}"}, At: g.now / 1000, Shift: differential.ExpiryShift}
	if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
		return fmt.Errorf("%v\n%s", err, g.dump())
	}
	return nil
}

// A refresh that comes after its process's waiter TTL has passed does not
// bring the process's waiters back: they died with its liveness field
// (another process may have been served in their place). A process
// refreshes its waiters on a semaphore in several calls when they are
// many: the first call's must not revive the field for the second's.
func TestRefreshLeavesDeadWaitersDead(t *testing.T) {
	if err := refreshLeavesDeadWaitersDead(t, nil); err != nil {
		t.Fatal(err)
	}
}

// refreshLeavesDeadWaitersDead is TestRefreshLeavesDeadWaitersDead on
// scripts changed by transform: the error says what went wrong.
func refreshLeavesDeadWaitersDead(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	tokenOf(t, g.run("acquire", "TA", "PA", "200000", "3000", "", "1", "1"))
	for _, ticket := range []string{"TB1", "TB2"} {
		if got, _ := g.run("acquire", ticket, "PB", "200000", "3000", "", "1", "1").([]any); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
			return fmt.Errorf("%s = %v, want queued", ticket, got)
		}
	}
	g.advance(4000) // PB's waiter TTL passes unrefreshed
	for _, ticket := range []string{"TB1", "TB2"} {
		got := fmt.Sprint(g.run("refresh", "PB", "200000", "3000", ticket, "1", ""))
		if !strings.Contains(got, "["+ticket+" 0]") {
			return fmt.Errorf("PB's late refresh of %s = %v, want it reported gone (0)\n%s", ticket, got, g.dump())
		}
	}
	return nil
}

// A refresh moves on only the liveness fields that are alive: a
// process's field on a resource that died (it paused past its waiter TTL
// there) stays dead though the refresh keeps its field alive on another
// resource, where it queued since. Here PB's multi-request TG waits on a
// and b; PB queues TZ on a alone later, so that its field on a outlives
// its field on b. Its refresh on a (TG's first resource) past b's
// deadline must leave TG's part on b dead, and the release on b drops it.
func TestRefreshLeavesADeadFieldDead(t *testing.T) {
	if err := refreshLeavesADeadFieldDead(t, nil); err != nil {
		t.Fatal(err)
	}
}

// refreshLeavesADeadFieldDead is TestRefreshLeavesADeadFieldDead on
// scripts changed by transform: the error says what went wrong.
func refreshLeavesADeadFieldDead(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	a, b := "trace:{a}", "trace:{b}"
	keysOf := func(base string) []string {
		return []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	}
	both := append(keysOf(a), keysOf(b)...)
	group := a + "\t1\t1\t" + b + "\t1\t1"
	one := func(base, ticket, client string) []any {
		got, _ := g.runOn(keysOf(base), "acquire", ticket, client, "200000", "3000", "", "1", "1").([]any)
		return got
	}
	if got := one(a, "TA", "PA"); len(got) < 4 || got[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("TA = %v, want granted", got)
	}
	held := one(b, "TC", "PC")
	if len(held) < 4 || held[0] != int64(ops.AcqGranted) {
		return fmt.Errorf("TC = %v, want granted", held)
	}
	if got, _ := g.runOn(both, "acquire", "TG", "PB", "200000", "3000", group, "1", "1", "1", "1").([]any); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("TG = %v, want queued", got)
	}
	g.advance(2000)
	if got := one(a, "TZ", "PB"); len(got) < 1 || got[0] != int64(ops.AcqQueued) {
		return fmt.Errorf("TZ = %v, want queued", got)
	}
	g.advance(1500) // PB's field on b (3 s from TG) is dead; on a, alive
	g.runOn(keysOf(a), "refresh", "PB", "200000", "3000", "TG", "1", group, "TZ", "1", "")
	g.runOn(keysOf(b), "release", "TC", "PC", "200000", "3000", "", "0", "1", fmt.Sprint(held[3]))
	n, err := g.r.RDB.ZCard(context.Background(), b+":q").Result()
	if err != nil {
		return err
	}
	if n != 0 {
		return fmt.Errorf("after the release on b, TG (dead there) is still queued on b: the refresh on a brought its field on b back\n%s", g.dump())
	}
	return nil
}

// A grant announced to a waiter (pushed to its wake list by the release
// that hands it on) lasts no longer than the waiter's TTL until its
// process confirms it: a process that died while it waited must not hold
// the permit for a whole lease. The grant's expiry in the wake-up says
// how long it lasts.
func TestAnnouncedGrantLastsTheWaiterTTL(t *testing.T) {
	if err := announcedGrantLastsTheWaiterTTL(t, nil); err != nil {
		t.Fatal(err)
	}
}

// announcedGrantLastsTheWaiterTTL is TestAnnouncedGrantLastsTheWaiterTTL
// on scripts changed by transform: the error says what went wrong.
func announcedGrantLastsTheWaiterTTL(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	// acquire's ARGV: ticket, client, lease, waiter TTL, group, permits,
	// capacity; release's: ticket, client, lease, waiter TTL, group, its
	// mode, permits, token. Leases of 10 s, waiter TTLs of 300 ms.
	held := g.run("acquire", "TA", "PA", "10000", "300", "", "1", "1")
	token := tokenOf(t, held)
	if got, _ := g.run("acquire", "TB", "PB", "10000", "300", "", "1", "1").([]any); len(got) == 0 || fmt.Sprint(got[0]) == "1" {
		return fmt.Errorf("TB's acquire = %v, want it queued", got)
	}
	g.advance(10)
	g.run("release", "TA", "PA", "10000", "300", "", "0", "1", token)
	nowMs := g.now / 1000
	list := keyspace.Keys{Base: "trace:{s}"}.Wake("PB")
	entries, err := g.r.RDB.LRange(context.Background(), list, 0, -1).Result()
	if err != nil {
		return err
	}
	for _, e := range entries {
		// A grant's wake-up: "ticket expiryMs token".
		f := strings.Fields(e)
		if len(f) != 3 || f[0] != "TB" {
			continue
		}
		var expiry int64
		if _, err := fmt.Sscan(f[1], &expiry); err != nil {
			return fmt.Errorf("TB's wake-up %q: %v", e, err)
		}
		if expiry > nowMs+300 {
			return fmt.Errorf("TB's announced grant expires %d ms after it was announced, want at most its waiter TTL, 300 ms", expiry-nowMs)
		}
		return nil
	}
	return fmt.Errorf("TB heard no grant on %s: %q\n%s", list, entries, g.dump())
}

// A signal wakes a condition's oldest waiter: two holders of a semaphore
// of capacity 2 wait on condition x in turn, a third signals one, and the
// first to wait must be the one moved to the semaphore's queue.
func TestSignalWakesTheOldestWaiter(t *testing.T) {
	if err := signalWakesTheOldestWaiter(t, nil); err != nil {
		t.Fatal(err)
	}
}

// signalWakesTheOldestWaiter is TestSignalWakesTheOldestWaiter on scripts
// changed by transform: the error says what went wrong.
func signalWakesTheOldestWaiter(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	base := "trace:{s}"
	all := []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	withCond := append(slices.Clip(all), condKeys(keyspace.Keys{Base: base, All: all}, "x")...)
	// wait's ARGV: ticket, client, lease, waiter TTL, group, its mode,
	// permits, the lease's token, the waiter's ticket, the condition.
	for _, p := range []string{"1", "2"} {
		tok := tokenOf(t, g.run("acquire", "T"+p, "P"+p, "10000", "3000", "", "1", "2"))
		g.advance(1)
		if got := fmt.Sprint(g.runOn(withCond, "wait", "T"+p, "P"+p, "10000", "3000", "", "0", "1", tok, "W"+p, "x")); !strings.HasPrefix(got, "[1 ") {
			return fmt.Errorf("W%s's condition wait = %v, want it waiting", p, got)
		}
		g.advance(1)
	}
	g.advance(1)
	if got := fmt.Sprint(g.runOn(withCond, "signal", "x", "1", "", "S1")); !strings.HasPrefix(got, "[1") {
		return fmt.Errorf("the signal = %v, want one waiter woken\n%s", got, g.dump())
	}
	// Both permits are free: the woken waiter is granted at once, and its
	// process hears the grant on its wake list.
	heard := func(p string) (bool, error) {
		entries, err := g.r.RDB.LRange(context.Background(), keyspace.Keys{Base: base}.Wake("P"+p), 0, -1).Result()
		return slices.ContainsFunc(entries, func(e string) bool { return strings.HasPrefix(e, "W"+p+" ") }), err
	}
	first, err := heard("1")
	if err != nil {
		return err
	}
	second, err := heard("2")
	if err != nil {
		return err
	}
	if second || !first {
		return fmt.Errorf("after the signal W1 (the oldest waiter) was woken: %v, W2: %v; want W1 only\n%s", first, second, g.dump())
	}
	return nil
}

// An idle semaphore's keys live as long as its latest tombstone, also
// when Redis's clock has stepped back since an earlier one was written (a
// failover to a replica whose clock is behind): the withdrawal that makes
// it idle, though it writes a tombstone of its own, reads when the latest
// ends, and the uncontended cycles after it keep an expiry that covers it.
func TestIdleKeysCoverTombstonesAfterClockStepBack(t *testing.T) {
	g := newTraceRig(t)
	check := func(what string) {
		t.Helper()
		st := statecheck.State{Prefix: "trace:", Bases: []string{"trace:{s}"}, At: g.now / 1000, Shift: differential.ExpiryShift}
		if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
			t.Fatalf("after %s: %v\n%s", what, err, g.dump())
		}
	}
	tok := tokenOf(t, g.run("acquire", "TL", "PL", "3600000", "60000", "", "1", "1"))
	// TW queues behind TL and withdraws: its tombstone lasts 10–20 s.
	if got := fmt.Sprint(g.run("acquire", "TW", "PW", "3600000", "60000", "", "1", "1")); !strings.HasPrefix(got, "[2 ") {
		t.Fatalf("TW's acquire = %v, want queued", got)
	}
	g.run("leave", "TW", "PW", "3600000", "60000", "", "0", "1", "0")
	check("TW's withdrawal")
	g.advance(-60000) // Redis's clock steps back a minute
	g.run("leave", "TL", "PL", "3600000", "60000", "", "0", "1", tok)
	check("the holder's withdrawal, a minute back")
	for i := range 2 {
		ta := tokenOf(t, g.run("acquire", "TA"+strconv.Itoa(i), "PA", "10000", "60000", "", "1", "1"))
		if got := fmt.Sprint(g.run("release", "TA"+strconv.Itoa(i), "PA", "10000", "60000", "", "0", "1", ta)); got != "[1 0]" {
			t.Fatalf("uncontended release = %v", got)
		}
		check("an uncontended cycle")
	}
}

// A condition's waiters live until their process's liveness deadline,
// which any call of that process on the semaphore moves (here a wait on
// another condition), and the condition's key must live as long: when a
// call moves the keys' expiry, every condition key with waiters follows
// it, not only those the call wrote. Seen in CI as "key …cx expires at
// …, before its latest waiter's deadline" (TestResentCallsActOnce, a
// queued acquire of a process waiting on a condition).
func TestConditionKeysFollowTheKeysExpiry(t *testing.T) {
	for _, fast := range []bool{true, false} {
		t.Run(fmt.Sprintf("fast=%v", fast), func(t *testing.T) {
			transform := func(s string) string { return s }
			if !fast {
				transform = testhook.NoFastPaths
			}
			if err := conditionKeysFollowTheKeysExpiry(t, transform); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// conditionKeysFollowTheKeysExpiry is TestConditionKeysFollowTheKeysExpiry
// on scripts changed by transform: the error says what went wrong.
func conditionKeysFollowTheKeysExpiry(t *testing.T, transform func(string) string) error {
	g := newTraceRigWith(t, transform)
	const base, wait = "trace:{s}", "3000"
	sem := []string{base + ":s", base + ":q", base + ":d", base + ":h", base + ":t"}
	k := keyspace.Keys{Base: base, All: sem}
	check := func(what string) error {
		st := statecheck.State{Prefix: "trace:", Bases: []string{base}, At: g.now / 1000, Shift: differential.ExpiryShift}
		if err := statecheck.Check(context.Background(), g.r.RDB, st); err != nil {
			return fmt.Errorf("after %s: %w\n%s", what, err, g.dump())
		}
		return nil
	}
	// PB takes the mutex and waits on cond, its lease 1 s, its waiters
	// alive for 3 s unless refreshed (it never is here).
	waitOn := func(held, waiter, cond string) error {
		got := g.run("acquire", held, "PB", "1000", wait, "", "1", "1")
		r, ok := got.([]any)
		if !ok || len(r) < 4 || r[0] != int64(ops.AcqGranted) {
			return fmt.Errorf("%s's acquire = %v, want granted", held, got)
		}
		args := []string{"wait", held, "PB", "1000", wait, "", "0", "1", fmt.Sprint(r[3]), waiter, cond}
		if got := fmt.Sprint(g.runOn(append(sem, condKeys(k, cond)...), args...)); !strings.HasPrefix(got, "[1") {
			return fmt.Errorf("%s's wait on %q = %v, want waiting", waiter, cond, got)
		}
		return check(waiter + "'s wait on " + cond)
	}
	if err := waitOn("T1", "W1", "x"); err != nil {
		return err
	}
	// Each later wait, on another condition, moves PB's deadline 2.5 s
	// on, while W1 is alive: the second within the keys' expiry, the
	// third past it, which moves it (and x's key must follow).
	for i, cond := range []string{"y", "z"} {
		g.advance(2500)
		if err := waitOn("T"+strconv.Itoa(i+2), "W"+strconv.Itoa(i+2), cond); err != nil {
			return err
		}
	}
	return nil
}
