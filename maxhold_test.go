package fairlock_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/fltest"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/statecheck"
	"github.com/redis/go-redis/v9"
)

// opHook is a go-redis hook on the scripts of one fairlock op ("renew",
// "release"): it fails them (fail) or holds them back until gate closes.
type opHook struct {
	op   string
	fail bool
	gate chan struct{}
}

func (h *opHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *opHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *opHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// A lone lease renews in a batch of one: "renew" covers both.
		if slices.Contains(cmd.Args(), any(h.op)) || (h.op == "renew" && slices.Contains(cmd.Args(), any("renew_batch"))) {
			if h.gate != nil {
				<-h.gate
			}
			if h.fail {
				cmd.SetErr(redistest.ErrCutOff)
				return redistest.ErrCutOff
			}
		}
		return next(ctx, cmd)
	}
}

// clientWith returns a fairlock client whose go-redis client has hook h.
func clientWith(t *testing.T, e *fltest.Env, h redis.Hook, opts ...fairlock.Option) *fairlock.Client {
	rdb := e.B.Client(t)
	hooked := redistest.AddHook[fairlock.Option](rdb, h)
	return e.ClientOn(rdb, append([]fairlock.Option{hooked}, opts...)...)
}

// capDone waits for l's Done, failing the test after within, and returns
// how long after start it closed.
func capDone(t *testing.T, l *fairlock.Lease, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	select {
	case <-l.Done():
		return time.Since(start)
	case <-time.After(within):
		t.Fatalf("Done not closed within %v (Err %v)", within, l.Err())
		return 0
	}
}

// expiryMs returns Redis's expiry (ms, Redis's clock) of the only lease of
// the semaphore name, read from its holders zset.
func expiryMs(t *testing.T, e *fltest.Env, name string) int64 {
	t.Helper()
	zs, err := statecheck.Holders(context.Background(), e.RDB, e.Prefix+"{"+name+"}")
	if err != nil || len(zs) != 1 {
		t.Fatalf("holders of %s = %v, %v; want one", name, zs, err)
	}
	return int64(zs[0].Score)
}

// A lease with a cap is renewed past its TTL up to the cap and
// no further: Done closes, not before the cap, with a cause matching
// ErrMaxHold and ErrLeaseLost; Release then says ErrMaxHold.
func TestMaxHoldEndsLease(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const ttl, d = time.Second, 1500 * time.Millisecond
		c := e.Client(fairlock.WithLeaseTTL(ttl), fairlock.WithMaxHold(d))
		req := fairlock.Request{Name: "cap", Capacity: 1, Permits: 1}
		start := time.Now()
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		// Bounded below by d only: Done must not close before the cap.
		if held := capDone(t, l, start, 10*time.Second); held < d {
			t.Fatalf("Done closed %v after Acquire was called, before the cap %v", held, d)
		}
		fltest.IsErr(t, "Err() at the cap", l.Err(), fairlock.ErrMaxHold)
		fltest.IsErr(t, "Err() at the cap", l.Err(), fairlock.ErrLeaseLost)
		fltest.IsErr(t, "Release after the cap", l.Release(ctx), fairlock.ErrMaxHold)
		fltest.IsErr(t, "second Release", l.Release(ctx), fairlock.ErrNotHeld)
		next, err := e.Client().TryAcquire(ctx, req)
		if err != nil {
			t.Fatalf("TryAcquire after the capped lease's Release: %v", err)
		}
		e.Release(next)
	})
}

// A cap shorter than the lease TTL shortens the grant in Redis
// at once, so Redis frees the permits at the cap, by its own clock, though
// the holder never releases (its releases fail, as if it were cut off
// after its last renewal). The clock is frozen: exact.
func TestMaxHoldShorterThanTTLFreesInRedis(t *testing.T) {
	b := redistest.Mini(t)
	b.Freeze(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	const d = 300 * time.Millisecond
	c := clientWith(t, e, &opHook{op: "release", fail: true}, fairlock.WithLeaseTTL(time.Hour), fairlock.WithMaxHold(d))
	req := fairlock.Request{Name: "short", Capacity: 1, Permits: 1}
	l, err := c.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	capDone(t, l, time.Now(), 10*time.Second)
	fltest.IsErr(t, "Err() at the cap", l.Err(), fairlock.ErrMaxHold)
	grantMs := l.Token() / 1000 // the token is Redis's clock (µs) at the grant
	if got := expiryMs(t, e, "short"); got > grantMs+d.Milliseconds() {
		t.Fatalf("Redis's expiry %d ms after the grant, past the cap %v", got-grantMs, d)
	}
	other := e.Client()
	if _, err := other.TryAcquire(ctx, req); !errors.Is(err, fairlock.ErrNotAcquired) {
		t.Fatalf("TryAcquire before Redis's clock reaches the cap = %v, want ErrNotAcquired", err)
	}
	b.Advance(t, d)
	next, err := other.TryAcquire(ctx, req)
	if err != nil {
		t.Fatalf("TryAcquire once Redis's clock reached the cap: %v", err)
	}
	e.Release(next)
}

// renewals records the lease TTL (ms) that each renew script a client
// sends asks for.
type renewals struct {
	mu  sync.Mutex
	ttl []int64
}

func (h *renewals) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *renewals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *renewals) note(arg any) {
	s, _ := arg.(string) // the arguments go-redis sends, as the engine renders them
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		h.mu.Lock()
		h.ttl = append(h.ttl, ms)
		h.mu.Unlock()
	}
}

func (h *renewals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		// release.lua's ARGV: op, ticket, client, leaseMs, ...
		if i := slices.Index(args, any("renew")); i >= 0 && i+3 < len(args) {
			h.note(args[i+3])
		}
		// acquire.lua's renew_batch: op, client, then ticket, permits,
		// token, announced, leaseMs for each lease.
		if i := slices.Index(args, any("renew_batch")); i >= 0 {
			for j := i + 6; j < len(args); j += 5 {
				h.note(args[j])
			}
		}
		return next(ctx, cmd)
	}
}

// The renewals of a lease whose cap is longer than its TTL stop
// extending it at the cap: each asks for no more than the time left to the
// cap, so Redis's expiry lands at the cap, not a TTL after the last
// renewal. The cap is a little over the TTL: the first renewal, sent at
// least ttl/3 after Acquire was called, has at most d - ttl/3 (+ the time
// Acquire took) to go, 450 ms less than a TTL. On miniredis, whose clock is
// frozen, Redis's expiry is read back exactly (the holder's releases fail,
// so that it stays to be read). No bound here depends on the machine's
// speed.
func TestMaxHoldLastRenewalLandsAtCap(t *testing.T) {
	redistest.Long(t) // waits on real time for seconds: the full suite
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		if !b.Real() {
			b.Freeze(t)
		}
		e := fltest.New(t, b)
		ctx := context.Background()
		const ttl, d = 1500 * time.Millisecond, 1550 * time.Millisecond
		rdb := b.Client(t)
		rec := &renewals{}
		recorded := redistest.AddHook[fairlock.Option](rdb, rec)
		failed := redistest.AddHook[fairlock.Option](rdb, &opHook{op: "release", fail: true})
		c := e.ClientOn(rdb, recorded, failed, fairlock.WithLeaseTTL(ttl), fairlock.WithMaxHold(d))
		start := time.Now()
		l, err := c.Acquire(ctx, fairlock.Request{Name: "last", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		most := (d - ttl/3 + time.Since(start)).Milliseconds()
		capDone(t, l, start, 10*time.Second)
		fltest.IsErr(t, "Err() at the cap", l.Err(), fairlock.ErrMaxHold)
		rec.mu.Lock()
		asked := slices.Clone(rec.ttl)
		rec.mu.Unlock()
		if len(asked) == 0 {
			t.Fatal("no renewal sent before the cap")
		}
		for i, ms := range asked {
			if ms > most {
				t.Fatalf("renewal %d of %v asked for %d ms; at most %d ms were left to the cap %v", i+1, asked, ms, most, d)
			}
		}
		grantMs := l.Token() / 1000 // the token is Redis's clock (µs) at the grant
		got := expiryMs(t, e, "last")
		if !b.Real() && got-grantMs > most {
			t.Fatalf("Redis's expiry %d ms after the grant (frozen clock); at most %d ms were left to the cap %v", got-grantMs, most, d)
		}
		t.Logf("renewals asked for %v ms; Redis's expiry %d ms after the grant, cap %v", asked, got-grantMs, d)
	})
}

// Request.MaxHold replaces the client's cap, shorter or
// longer, and a lease over several semaphores ends at the earliest cap of
// its parts, a part without one taking the client's.
func TestMaxHoldPerRequest(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const d = 200 * time.Millisecond
		for _, tc := range []struct {
			name   string
			client time.Duration
			reqs   []fairlock.Request
		}{
			{"shorter than the client's", time.Hour, []fairlock.Request{{Name: "a", Capacity: 1, Permits: 1, MaxHold: d}}},
			{"no client cap", 0, []fairlock.Request{{Name: "b", Capacity: 1, Permits: 1, MaxHold: d}}},
			{"one part's", 0, []fairlock.Request{
				{Name: "{m}:1", Capacity: 1, Permits: 1}, {Name: "{m}:2", Capacity: 2, Permits: 1, MaxHold: d}}},
			{"the client's for a part without", d, []fairlock.Request{
				{Name: "{n}:1", Capacity: 1, Permits: 1, MaxHold: time.Hour}, {Name: "{n}:2", Capacity: 1, Permits: 1}}},
		} {
			c := e.Client(fairlock.WithMaxHold(tc.client))
			start := time.Now()
			l, err := c.AcquireAll(ctx, tc.reqs...)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if held := capDone(t, l, start, 10*time.Second); held < d {
				t.Fatalf("%s: Done closed after %v, before the cap %v", tc.name, held, d)
			}
			fltest.IsErr(t, tc.name+": Err()", l.Err(), fairlock.ErrMaxHold)
			fltest.IsErr(t, tc.name+": Release", l.Release(ctx), fairlock.ErrMaxHold)
		}
	})
}

// When the renewal meant to shorten a grant that lasts past the
// cap fails, Done still closes at the cap, with ErrMaxHold, not at the
// grant's deadline an hour on, and the holder's client releases the grant.
func TestMaxHoldWhileRenewalsFail(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const d = 300 * time.Millisecond
		c := clientWith(t, e, &opHook{op: "renew", fail: true}, fairlock.WithLeaseTTL(time.Hour), fairlock.WithMaxHold(d))
		req := fairlock.Request{Name: "down", Capacity: 1, Permits: 1}
		start := time.Now()
		l, err := c.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if held := capDone(t, l, start, 10*time.Second); held < d {
			t.Fatalf("Done closed after %v, before the cap %v", held, d)
		}
		fltest.IsErr(t, "Err() at the cap", l.Err(), fairlock.ErrMaxHold)
		other := e.Client()
		e.WaitFor("the grant released at the cap", func() bool {
			next, err := other.TryAcquire(ctx, req)
			if err == nil {
				e.Release(next)
			}
			return err == nil
		})
		fltest.IsErr(t, "Release after the cap", l.Release(ctx), fairlock.ErrMaxHold)
	})
}

// A renewal meant to shorten a grant that lasts past the cap,
// sent to a Redis that does not answer, is given up at the cap: Done
// closes then, with ErrMaxHold, not at the grant's deadline an hour on.
func TestMaxHoldWhileRenewalHangs(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const d = 300 * time.Millisecond
		hang := &opHook{op: "renew", gate: make(chan struct{})}
		c := clientWith(t, e, hang, fairlock.WithLeaseTTL(time.Hour), fairlock.WithMaxHold(d))
		t.Cleanup(func() { close(hang.gate) }) // before c closes
		start := time.Now()
		l, err := c.Acquire(ctx, fairlock.Request{Name: "hang", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		if held := capDone(t, l, start, 10*time.Second); held < d {
			t.Fatalf("Done closed after %v, before the cap %v", held, d)
		}
		fltest.IsErr(t, "Err() at the cap", l.Err(), fairlock.ErrMaxHold)
	})
}

// At the cap the next waiter is granted at once, though it
// queued while the grant still lasted an hour (its wake-up timer is set
// for then, and its liveness refresh is 20 minutes away): the holder's
// client releases the lease as it ends it.
func TestMaxHoldHandsOnAtCap(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const d = 500 * time.Millisecond
		gate := &opHook{op: "renew", gate: make(chan struct{})}
		c := clientWith(t, e, gate, fairlock.WithLeaseTTL(time.Hour), fairlock.WithMaxHold(d))
		req := fairlock.Request{Name: "handoff", Capacity: 1, Permits: 1}
		l, err := c.Acquire(ctx, req) // its renewal to the cap waits at the gate
		if err != nil {
			t.Fatal(err)
		}
		waiter := e.Client(fairlock.WithWaiterTTL(time.Hour))
		got := make(chan error, 1)
		go func() {
			next, err := waiter.Acquire(ctx, req)
			if err == nil {
				err = next.Release(ctx)
			}
			got <- err
		}()
		fltest.WaitWaiters(t, waiter, "handoff", 1)
		close(gate.gate)
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("waiter: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter not granted within 10s of the cap (lease Err %v)", l.Err())
		}
		fltest.IsErr(t, "Err() at the cap", l.Err(), fairlock.ErrMaxHold)
	})
}

// A negative cap is refused, in the option and the request; ErrMaxHold is
// a case of ErrLeaseLost, not the other way round.
func TestMaxHoldInputs(t *testing.T) {
	b := redistest.Mini(t)
	e := fltest.New(t, b)
	ctx := context.Background()
	if _, err := fairlock.New(b.Client(t), fairlock.WithMaxHold(-time.Second)); !errors.Is(err, fairlock.ErrInvalidArgument) {
		t.Fatalf("New(WithMaxHold(-1s)) = %v, want ErrInvalidArgument", err)
	}
	c := e.Client()
	bad := fairlock.Request{Name: "neg", Capacity: 1, Permits: 1, MaxHold: -1}
	_, err := c.Acquire(ctx, bad)
	fltest.IsErr(t, "Acquire(MaxHold -1)", err, fairlock.ErrInvalidArgument)
	_, err = c.TryAcquireAll(ctx, fairlock.Request{Name: "{x}:1", Capacity: 1, Permits: 1}, fairlock.Request{Name: "{x}:2", Capacity: 1, Permits: 1, MaxHold: -1})
	fltest.IsErr(t, "TryAcquireAll(MaxHold -1)", err, fairlock.ErrInvalidArgument)
	if !errors.Is(fairlock.ErrMaxHold, fairlock.ErrLeaseLost) {
		t.Fatal("errors.Is(ErrMaxHold, ErrLeaseLost) = false, want true")
	}
	if errors.Is(fairlock.ErrLeaseLost, fairlock.ErrMaxHold) {
		t.Fatal("errors.Is(ErrLeaseLost, ErrMaxHold) = true, want false")
	}
}

// A Release sent before the cap whose answer comes after it (past the
// lease's deadline, the cap's timer stopped by Release) still ends the
// lease: Done closes, and Release says what Redis answered.
func TestReleaseAcrossTheCapEndsTheLease(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		e := fltest.New(t, b)
		ctx := context.Background()
		const d = 400 * time.Millisecond
		gate := make(chan struct{})
		c := clientWith(t, e, &opHook{op: "release", gate: gate}, fairlock.WithLeaseTTL(time.Second), fairlock.WithMaxHold(d))
		start := time.Now()
		l, err := c.Acquire(ctx, fairlock.Request{Name: "across", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(d / 2) // the renewal that brings Redis's expiry to the cap has landed
		done := make(chan error, 1)
		go func() { done <- l.Release(ctx) }()
		time.Sleep(time.Until(start.Add(d + 100*time.Millisecond)))
		close(gate) // the release reaches Redis past the cap
		rerr := <-done
		if !errors.Is(rerr, fairlock.ErrLeaseLost) {
			t.Errorf("Release reaching Redis past the cap = %v; want ErrLeaseLost (Redis had expired it)", rerr)
		}
		select {
		case <-l.Done():
		case <-time.After(3 * time.Second):
			t.Fatalf("Done not closed 3s after Release returned %v (Err %v)", rerr, l.Err())
		}
	})
}
