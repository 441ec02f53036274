package fairlock

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// opStall is a Redis that stops answering the script calls of some ops:
// while armed, a script call of one of the ops in stall fails once with
// io.EOF (a dropped connection: transient) if failFirst is set, and after
// that gets no answer (see opStallBackend and opStallHook for how long
// its caller waits). free, closed at the test's end, lets every call go.
type opStall struct {
	armed     atomic.Bool
	failFirst bool
	failed    atomic.Bool
	stall     map[string]bool
	entered   atomic.Int32
	far       atomic.Int32 // of entered: under a deadline more than a minute away
	free      chan struct{}
}

// stalls reports whether a call of op is stalled, and then, if it fails
// first, io.EOF, or else an error of nil and the call stalls.
func (s *opStall) stalls(ctx context.Context, op string) (bool, error) {
	if !s.armed.Load() || !s.stall[op] {
		return false, nil
	}
	if s.failFirst && s.failed.CompareAndSwap(false, true) {
		return true, io.EOF
	}
	s.entered.Add(1)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) > time.Minute {
		s.far.Add(1)
	}
	return true, nil
}

// errFreed is what a stalled call returns when the test frees it.
var errFreed = errors.New("opStall: freed at the test's end")

// opStallBackend returns by its context's end (backend.Info.Deadlines, as
// rueidis and valkey-go do): a stalled call returns when its context ends.
type opStallBackend struct {
	backend.Backend
	*opStall
}

func (s *opStallBackend) Info() backend.Info {
	info := s.Backend.Info()
	info.Deadlines = true
	return info
}

func (s *opStallBackend) Script(ctx context.Context, sc backend.Script) (any, error) {
	if len(sc.Args) > 0 {
		if stalled, err := s.stalls(ctx, sc.Args[0]); err != nil {
			return nil, err
		} else if stalled {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-s.free:
				return nil, errFreed
			}
		}
	}
	return s.Backend.Script(ctx, sc)
}

// opStallHook is a go-redis hook: a stalled call waits, whatever its
// context, as go-redis waits for a Redis that does not answer (without
// ContextTimeoutEnabled): hold, a read timeout for each try the client
// makes (four for a Cluster client), then fails with an i/o timeout.
type opStallHook struct {
	*opStall
	hold time.Duration
}

func (h *opStallHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *opStallHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *opStallHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		// EVALSHA, EVAL and FCALL name the op first after their keys.
		args := cmd.Args()
		if len(args) > 3 {
			nkeys, _ := args[2].(int)
			if i := 3 + nkeys; i < len(args) {
				op, _ := args[i].(string)
				stalled, err := h.stalls(ctx, op)
				if stalled && err == nil {
					select {
					case <-time.After(h.hold):
						err = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
					case <-h.free:
						err = errFreed
					}
				}
				if stalled {
					cmd.SetErr(err)
					return err
				}
			}
		}
		return next(ctx, cmd)
	}
}

// Close returns by its bound, whatever Redis does, with every call of the
// client's on its way at the close either ended by the close (returned,
// an acquisition, a condition wait, a signal or a release with ErrClosed)
// or, through a Redis client that keeps it past the bound, left by the
// close at its bound with the fact in its error (matching ErrRedis); and a
// call that would return within the bound is waited for. The bound is one
// waiter TTL from the close and closeSlack, and, through go-redis, its
// read timeout (see answerWait), for a try sent before the close.
//
// Each row leaves one call on its way to a Redis that no longer answers
// it, then closes the client, through:
//
//   - deadlines: a Backend that returns by its context's end (rueidis,
//     valkey-go). A Release or a condition wait under a context that
//     cannot end held the lease's mutex for as long, and Close's release
//     of that lease waited for it: Close did not return.
//   - go-redis: its try holds its caller one read timeout, whatever the
//     context; the close waits for it.
//   - go-redis, four tries: as a Cluster client's, past the close's
//     bound; a call under a context that can end ends at the close,
//     one under a context that cannot is left at the bound, and said.
//
// The calls: an Acquire, a Release, a renewal, a condition wait, a signal,
// each under a context that cannot end and one that can but outlasts the
// bound; and a release sent again in the background (a Release failed on
// a dropped connection, its resend under the lease's deadline, an hour
// away). An election's calls are these (Resign is a Release; its record's
// clearing at the close runs under the close's bound).
func TestCloseBoundEveryCallOnItsWay(t *testing.T) {
	type call struct {
		name  string
		stall []string // ops whose script calls stall
		// waited: Close waits for the call (it holds a lease's mutex, or
		// counts as an acquisition under way).
		waited    bool
		lease     bool          // the call needs a lease of "m", acquired first
		leaseTTL  time.Duration // the lease's Request.LeaseTTL
		failFirst bool
		bare      bool // no caller's context: one row only
		// run makes the call; nil: the call is the client's own (a
		// renewal, a resend), begun by prepare.
		run     func(ctx context.Context, c *Client, l *Lease) error
		prepare func(t *testing.T, l *Lease)
	}
	calls := []call{
		{name: "acquire", stall: []string{"acquire"}, waited: true,
			run: func(ctx context.Context, c *Client, _ *Lease) error {
				_, err := c.Acquire(ctx, Request{Name: "m", Capacity: 1, Permits: 1})
				return err
			}},
		{name: "release", stall: []string{"release"}, waited: true, lease: true,
			run: func(ctx context.Context, _ *Client, l *Lease) error { return l.Release(ctx) }},
		{name: "renewal", stall: []string{"renew", "renew_batch"}, lease: true, leaseTTL: 600 * time.Millisecond, bare: true},
		{name: "condition wait", stall: []string{"wait"}, waited: true, lease: true,
			run: func(ctx context.Context, _ *Client, l *Lease) error {
				_, err := l.condWait(ctx, "cv")
				return err
			}},
		{name: "signal", stall: []string{"signal"},
			run: func(ctx context.Context, c *Client, _ *Lease) error {
				_, err := c.signal(ctx, "m", "cv", false)
				return err
			}},
		{name: "resend", stall: []string{"release"}, lease: true, leaseTTL: time.Hour, failFirst: true, bare: true,
			prepare: func(t *testing.T, l *Lease) {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				if err := l.Release(ctx); !errors.Is(err, ErrRedis) {
					t.Fatalf("Release on a dropped connection = %v, want an error matching ErrRedis", err)
				}
			}},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, via := range []struct {
			name  string
			tries int // go-redis's tries of a stalled call; 0: a Backend that returns by its context's end
		}{{"deadlines", 0}, {"go-redis", 1}, {"go-redis, four tries", 4}} {
			for _, cl := range calls {
				for _, cancellable := range []bool{false, true} {
					if cl.bare && cancellable {
						continue
					}
					name := via.name + "/" + cl.name
					if !cl.bare {
						name += map[bool]string{false: "/cannot end", true: "/can end"}[cancellable]
					}
					t.Run(name, func(t *testing.T) {
						// A client and keys of its own; the row mostly
						// waits on its stall.
						t.Parallel()
						if via.tries > 1 {
							// The longest rows (each try waits out the read
							// timeout): the full suite's.
							redistest.Long(t)
						}
						closeOnItsWay(t, b, via.tries, cl.stall, cl.failFirst, cl.lease, cl.leaseTTL, cl.waited, cancellable, cl.run, cl.prepare)
					})
				}
			}
		}
	})
}

// closeOnItsWay runs one row of TestCloseBoundEveryCallOnItsWay: see
// there. tries is go-redis's tries of a stalled call (0: a Backend that
// returns by its context's end); a call that is not the client's own runs
// under a context that can end if cancellable.
func closeOnItsWay(t *testing.T, b *redistest.Backend, tries int, stall []string, failFirst, lease bool, leaseTTL time.Duration, waited, cancellable bool,
	run func(ctx context.Context, c *Client, l *Lease) error, prepare func(t *testing.T, l *Lease)) {
	const waiterTTL = 200 * time.Millisecond
	const readTimeout = 300 * time.Millisecond
	st := &opStall{stall: map[string]bool{}, failFirst: failFirst, free: make(chan struct{})}
	for _, op := range stall {
		st.stall[op] = true
	}
	rdb := b.Client(t, func(o *redis.Options) { o.ReadTimeout = readTimeout })
	var be backend.Backend = &opStallBackend{Backend: newGoRedis(rdb), opStall: st}
	if tries > 0 {
		rdb.AddHook(&opStallHook{opStall: st, hold: time.Duration(tries) * readTimeout})
		be = newGoRedis(rdb)
	}
	c, err := NewWithBackend(be, WithPrefix(redistest.Prefix(t)), WithWaiterTTL(waiterTTL))
	if err != nil {
		t.Fatal(err)
	}
	var l *Lease
	if lease {
		if l, err = c.Acquire(context.Background(), Request{Name: "m", Capacity: 1, Permits: 1, LeaseTTL: leaseTTL}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if cancellable {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
	}
	st.armed.Store(true)
	returned := make(chan error, 1)
	if run != nil {
		go func() { returned <- run(ctx, c, l) }()
	}
	if prepare != nil {
		prepare(t, l)
	}
	if failFirst {
		advWaitFor(t, "the resend on its way", func() bool { return st.far.Load() > 0 })
	} else {
		advWaitFor(t, "the call on its way", func() bool { return st.entered.Load() > 0 })
	}
	defer func() {
		close(st.free) // (every stalled call goes, and the client's work ends)
		if run != nil {
			select {
			case <-returned:
			case <-time.After(10 * time.Second):
				t.Error("the call did not return once Redis answered")
			}
		}
		_ = c.Close()
	}()
	bound := waiterTTL + closeSlack + c.answerWait
	limit := bound + time.Second // a margin: the bound is a limit, not a measure
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	var cerr error
	select {
	case cerr = <-closed:
	case <-time.After(limit):
		t.Fatalf("Close still waiting %v after it began (bound %v): a call on its way to a Redis that does not answer holds it", limit, bound)
	}
	took := time.Since(start)
	t.Logf("Close returned in %v (bound %v): %v", took.Round(time.Millisecond), bound, cerr)
	if cerr != nil && !errors.Is(cerr, ErrRedis) {
		t.Fatalf("Close = %v, want nil or an error matching ErrRedis", cerr)
	}
	if st.stall["release"] && cerr == nil {
		// No release lands while Redis stalls them: not the holder's,
		// not one sent again, not the close's own.
		t.Fatal("Close = nil, with a release of its client's that did not land: want an error matching ErrRedis that says so")
	}
	if run == nil {
		return
	}
	// Past the bound only through go-redis's four tries under a context
	// that cannot end: nothing else may be left by the close.
	left := tries > 1 && !cancellable
	// Close sees a call end in its last deferred step (an acquisition's
	// count, a lease's mutex), a moment before the call hands its result
	// over: that moment is allowed, no more.
	var callErr error
	select {
	case callErr = <-returned:
		returned <- callErr // (for the deferred wait)
	case <-time.After(100 * time.Millisecond):
		switch {
		case !waited:
			// The close does not wait for it, but it returns by then.
			select {
			case callErr = <-returned:
				returned <- callErr
			case <-time.After(limit - took):
				t.Fatalf("the call on its way at the close had not returned %v after the close began", limit)
			}
		case !left:
			t.Fatalf("the call on its way at the close had not returned when Close did (%v, bound %v): Close %s",
				took.Round(time.Millisecond), bound, map[bool]string{false: "ended it not", true: "gave up early"}[tries == 1 && !cancellable])
		case cerr == nil:
			t.Fatal("Close left a call on its way at its bound, and returned nil")
		default:
			return // left, and said
		}
	}
	t.Logf("the call returned %v", callErr)
	if tries == 0 || cancellable {
		// Ended by the close (unless it was already done: a signal
		// delivered before the close).
		if !errors.Is(callErr, ErrClosed) {
			t.Errorf("the call on its way at the close returned %v, want an error matching ErrClosed", callErr)
		}
	} else if callErr == nil {
		t.Errorf("the call on its way at the close returned nil from a Redis that did not answer it")
	}
}
