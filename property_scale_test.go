package fairlock

// Crowds: the property machine at the sizes where Redis's limits bite.
//
// A crowd is one process with many requests of one size on one semaphore,
// started one after another so that their arrival order is known. Crowds
// reach what a handful of single-request processes never do: queues of
// thousands, one release granting thousands (a big holder leaving in
// front of a crowd of small waiters), and thousands of leases expiring
// together (a crashed crowd).
//
// Where miniredis differs from redis-server, and what these tests do about
// it (measured with miniredis v2 and redis-server 7.0.15):
//
//   - Clock. miniredis's clock is frozen by the tests (SetTime) and TIME,
//     script time and key expiry follow it; Redis's clock runs. The
//     miniredis machine moves time and crashes processes; the real-Redis
//     machines use hour-long TTLs for everything live, so nothing expires
//     behind the model's back, and reach expiry only through doomed crowds
//     (short TTLs, crashed at once, waited out in real time before the
//     model drops them: no race with the clock).
//   - Lua limits. Redis's Lua refuses unpack of 8,000 values or more
//     ("too many results to unpack"); miniredis's gopher-lua refuses at
//     5,114 ("registry overflow"): a different limit, so any size near a
//     limit runs on the real server only (TestPropertyRealRedisScale), and
//     the miniredis machines keep crowds small.
//   - Script errors. Redis keeps the writes a script made before a
//     runtime error; what miniredis keeps differs. Only the real server
//     says what a failing bulk script leaves behind.
//   - BLPOP. miniredis serves a blocked BLPOP from its own goroutine and
//     times out by the wall clock, not its frozen clock; the machine never
//     relies on when a wake-up arrives, only that it does (within wait).
//   - TTLs. With ClockTTL, miniredis expires keys when its clock is set,
//     Redis lazily and by a background sweep: the checks read only
//     entries whose time has not passed, and count a key as staying only
//     if it has no TTL.
//   - Speed. A miniredis script is interpreted in Go in the test process;
//     thousands of members per step are affordable only on redis-server.

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/clock"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

// Flags for longer scale runs: go test -run PropertyRealRedisScale
// -prop.scale.checks=50 -prop.scale.crowd=8000.
var (
	scaleChecks = flag.Int("prop.scale.checks", 4, "state machines TestPropertyRealRedisScale runs")
	scaleCrowd  = flag.Int("prop.scale.crowd", 5000, "largest crowd TestPropertyRealRedisScale draws")
)

// doomTTL is a doomed crowd's lease TTL: long enough that its renewals
// seldom run while the crowd fills the semaphore, short enough to wait out.
const doomTTL = 1500 * time.Millisecond

// TestPropertyRealRedisScale runs the machine on redis-server with
// capacities up to 10,000, permits up to the capacity, crowds of
// thousands, bulk grants and mass expiry. It logs the sizes each run
// reached.
func TestPropertyRealRedisScale(t *testing.T) {
	b := redistest.RealBackend(t)
	if testing.Short() {
		t.Skip("-short")
	}
	checks, crowd := *scaleChecks, *scaleCrowd
	if redistest.Race {
		// The race detector slows the crowds' thousands of goroutines
		// several times over; the full sizes run without -race on the
		// other servers.
		checks, crowd = max(checks/2, 1), min(crowd, 1000)
	}
	setFlag(t, "rapid.checks", strconv.Itoa(checks))
	setFlag(t, "rapid.steps", "20")
	setFlag(t, "rapid.shrinktime", "20s")
	st := &propStats{perRun: true}
	rapid.Check(t, func(rt *rapid.T) {
		runMachine(rt, b, mconfig{wait: pWait, maxCap: 8, scale: true, crowd: crowd, doom: true, stats: st})
	})
	st.log(t)
}

// newCrowd starts a crowd's process.
func (m *machine) newCrowd(ttl time.Duration) *crowd {
	cu := &cut{}
	var c *Client
	if ttl == 0 {
		c = m.newClient(cu)
	} else {
		c = m.newClientTTL(cu, ttl, ttl)
	}
	cr := &crowd{id: len(m.crowds), c: c, cut: cu}
	m.crowds = append(m.crowds, cr)
	return cr
}

// member adds an actor to the crowd, asking for n of s.
func (m *machine) member(cr *crowd, s *msem, n int64) *actor {
	a := &actor{id: len(m.actors), c: cr.c, rdb: goRedisOf(cr.c).(*redis.Client), cut: cr.cut, crowd: cr}
	a.parts, a.sem, a.n = []mpart{{s, n}}, s, n
	m.actors = append(m.actors, a)
	cr.members = append(cr.members, a)
	return a
}

// liveCrowds returns the crowds not crashed with a member for which has
// returns true.
func (m *machine) liveCrowds(has func(*actor) bool) []*crowd {
	var out []*crowd
	for _, c := range m.crowds {
		if !c.crashed && slices.ContainsFunc(c.members, has) {
			out = append(out, c)
		}
	}
	return out
}

// crowdSize draws a crowd's size: small, or a large part of the largest.
func (m *machine) crowdSize(t *rapid.T, most int) int {
	most = min(most, m.cfg.crowd)
	if most < 1 {
		t.Skip("no room for a crowd")
	}
	gen := rapid.IntRange(1, min(most, 20))
	if most > 20 {
		gen = rapid.OneOf(gen, rapid.IntRange(max(most/4, 1), most), rapid.Just(most), rapid.Just(most))
	}
	k := gen.Draw(t, "crowd size")
	m.seen.crowd = max(m.seen.crowd, k)
	return k
}

// crowdAcquire starts a crowd whose members Acquire one after another:
// those the model grants at once are granted, the rest queue in order.
func (m *machine) crowdAcquire(t *rapid.T) {
	if len(m.liveCrowds(func(a *actor) bool { return a.state != idle })) >= 3 {
		t.Skip("three crowds are busy")
	}
	s := m.pickSem(t)
	k := m.crowdSize(t, m.cfg.crowd)
	// Sizes that fill the capacity, with a tail that must wait.
	n := rapid.Int64Range(1, max(1, s.cap/int64(k))).Draw(t, "crowd permits")
	cr := m.newCrowd(0)
	m.logf("crowd %d: %d × Acquire(%d of %s (capacity %d))", cr.id, k, n, s.name, s.cap)
	m.modelRun()
	used := s.used()
	for range k {
		a := m.member(cr, s, n)
		grant := len(s.queue) == 0 && used+n <= s.cap
		m.begin(t, a, a.parts, grant)
		if grant {
			used += n
		}
	}
	m.settle(t)
}

// crowdRelease releases every lease a crowd holds, one after another.
func (m *machine) crowdRelease(t *rapid.T) {
	cs := m.liveCrowds(func(a *actor) bool { return a.state == holding })
	if len(cs) == 0 {
		t.Skip("no crowd holds")
	}
	cr := cs[rapid.IntRange(0, len(cs)-1).Draw(t, "crowd")]
	m.logf("crowd %d: Release of all its leases", cr.id)
	for _, a := range cr.members {
		if a.state == holding {
			m.releaseOne(t, a)
		}
	}
}

// crowdCancel cancels every wait of a crowd, one after another.
func (m *machine) crowdCancel(t *rapid.T) {
	cs := m.liveCrowds(func(a *actor) bool { return a.state == waiting })
	if len(cs) == 0 {
		t.Skip("no crowd waits")
	}
	cr := cs[rapid.IntRange(0, len(cs)-1).Draw(t, "crowd")]
	m.logf("crowd %d: cancels all its waits", cr.id)
	for _, a := range cr.members {
		if a.state == waiting {
			m.cancelOne(t, a)
		}
	}
}

// crashCrowd severs a crowd's process from Redis: its entries stay until
// their time runs out.
func (m *machine) crashCrowd(cr *crowd) {
	cr.cut.crash()
	cr.crashed = true
	for _, a := range cr.members {
		if a.state != idle {
			a.state = crashed
		}
	}
	for _, s := range m.sems {
		for _, e := range append(slices.Clone(s.queue), s.holders...) {
			if e.a.crowd == cr {
				e.dead = true
			}
		}
	}
}

// doom fills the free capacity of a semaphore with a crowd's leases
// (TryAcquire, short TTL), crashes the crowd and waits, in real time, until
// Redis's clock has passed every one of its leases' expiry: thousands of
// leases expire together, and the next script must purge them all and
// grant what waits behind them.
func (m *machine) doom(t *rapid.T) {
	s := m.pickSem(t)
	m.modelRun()
	free := s.cap - s.used()
	if len(s.queue) > 0 || free <= 0 {
		t.Skip("no free room for a doomed crowd")
	}
	k := m.crowdSize(t, int(min(free, 10000)))
	n := free / int64(k)
	cr := m.newCrowd(doomTTL)
	m.logf("crowd %d: %d × TryAcquire(%d of %s (capacity %d)), then crashes", cr.id, k, n, s.name, s.cap)
	ctx := context.Background()
	for range k {
		a := m.member(cr, s, n)
		l, err := a.c.TryAcquire(ctx, Request{Name: s.name, Capacity: s.cap, Permits: n})
		if err != nil {
			t.Fatalf("crowd %d: TryAcquire = %v; the model has room and no queue\n%s", cr.id, err, m.dump(s))
		}
		a.state, a.lease, a.ticket = holding, l, l.ticket
		m.sawTokens(t, a, l)
		s.holders = append(s.holders, m.entries(a, l.ticket, m.nowMs()+clock.MS(a.leaseTTL()))...)
	}
	m.crashCrowd(cr)
	// Wait until Redis's clock passes the latest expiry of the crowd's
	// leases (renewals may have moved some before the crash).
	var latest int64
	for _, h := range m.redisHolders(s) {
		if h.client == cr.c.id {
			latest = max(latest, h.at)
		}
	}
	deadline := time.Now().Add(doomTTL + m.wait)
	for {
		now, err := m.rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMilli() > latest {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis's clock did not pass %d", latest)
		}
		time.Sleep(time.Until(time.UnixMilli(latest)) + time.Millisecond)
	}
	// The model's clock does not run on a real server; what expired in
	// Redis expires in the model by being due now.
	for _, e := range s.holders {
		if e.a.crowd == cr {
			e.at = m.nowMs()
		}
	}
	m.settle(t)
}

// runStats are the largest sizes one machine reached.
type runStats struct {
	cap     int64 // capacity
	weight  int64 // permits of one request
	crowd   int   // crowd size
	queue   int   // waiters of one semaphore in Redis
	bulk    int   // requests granted by one step of the model
	expired int   // leases and waiters expiring in one step of the model
	woken   int   // latch waiters woken by the CountDown that opened it
	remade  bool  // the latch's count expired, and a call made it again
	// completed and broken are the most barrier parties one round's end
	// returned: completed by its last arrival, broken by a cancel; died,
	// broken by a dead party, noticed by the live parties' refresh.
	completed, broken, died int
	lost                    bool // an arrival broke a round whose parties had all died
}

func (r runStats) String() string {
	return fmt.Sprintf("capacity %d, permits %d, crowd %d, queue %d, bulk grant %d, expired at once %d, latch waiters woken %d, barrier round completed for %d, broken for %d, broken by a death for %d",
		r.cap, r.weight, r.crowd, r.queue, r.bulk, r.expired, r.woken, r.completed, r.broken, r.died)
}

// propStats gathers runStats over the machines of one test.
type propStats struct {
	perRun bool // log every run, not only the summary
	mu     sync.Mutex
	runs   []runStats
}

func (p *propStats) add(r runStats) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.runs = append(p.runs, r)
}

func (p *propStats) log(t *testing.T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var top runStats
	var lines []string
	reached := map[string]int{}
	for i, r := range p.runs {
		top = runStats{max(top.cap, r.cap), max(top.weight, r.weight), max(top.crowd, r.crowd),
			max(top.queue, r.queue), max(top.bulk, r.bulk), max(top.expired, r.expired), max(top.woken, r.woken), false,
			max(top.completed, r.completed), max(top.broken, r.broken), max(top.died, r.died), false}
		if r.woken > 0 {
			reached["latch opened on waiters"]++
		}
		if r.remade {
			reached["latch remade"]++
		}
		if r.completed >= 2 {
			reached["barrier completed on waiters"]++
		}
		if r.broken >= 1 {
			reached["barrier broken on waiters"]++
		}
		if r.died >= 1 {
			reached["barrier broken by a death"]++
		}
		if r.lost {
			reached["barrier of the dead broken by an arrival"]++
		}
		if r.queue >= 100 {
			reached["queue>=100"]++
		}
		if r.bulk >= 100 {
			reached["bulk>=100"]++
		}
		if r.expired >= 1000 {
			reached["expired>=1000"]++
		}
		if p.perRun {
			lines = append(lines, fmt.Sprintf("run %d: %v", i, r))
		}
	}
	if len(lines) > 0 {
		t.Logf("sizes per run:\n%s", strings.Join(lines, "\n"))
	}
	t.Logf("%d runs; largest: %v; runs reaching %v", len(p.runs), top, reached)
}
