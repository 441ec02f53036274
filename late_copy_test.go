package fairlock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/redistest"
)

// lateCopyBackend is a Backend that returns by its context's end, as
// rueidis and valkey-go do, and whose first call of op (its ticket, or a
// wait's new ticket) reaches Redis only after its caller has left and the
// client's withdrawal of that ticket has run: as when the command waits on
// one pipelined connection while the withdrawal goes out on another, or
// sits in a socket's buffer while Redis serves a connection it read first.
// The late copy's reply is kept in late; done closes once it has run.
type lateCopyBackend struct {
	backend.Backend
	op string

	mu     sync.Mutex
	armed  bool            // holds the next call of op
	held   *backend.Script // the copy held back
	ticket string          // its ticket
	old    string          // a held wait's lease's ticket
	lost   bool            // that lease's first release was lost
	late   any             // the late copy's reply (or error)
	done   chan struct{}
}

func (b *lateCopyBackend) Info() backend.Info {
	info := b.Backend.Info()
	info.Deadlines = true
	return info
}

func (b *lateCopyBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	if len(s.Args) < 2 {
		return b.Backend.Script(ctx, s)
	}
	b.mu.Lock()
	hold := b.armed && b.held == nil && s.Args[0] == b.op
	if hold {
		b.held = &s
		b.ticket = s.Args[1]
		switch s.Args[0] {
		case "wait":
			b.ticket, b.old = s.Args[len(s.Args)-2], s.Args[1]
		case "latch_wait", "barrier_await":
			b.ticket = s.Args[3]
		}
	}
	// A cut wait's client releases the lease, then withdraws the new
	// ticket: the release is lost on its way (sent again later), so that
	// the late copy finds the lease still held.
	if b.old != "" && !b.lost && s.Args[0] == "release" && s.Args[1] == b.old {
		b.lost = true
		b.mu.Unlock()
		return nil, io.ErrUnexpectedEOF
	}
	// A withdrawal: a leave, or a barrier's break.
	withdrawal := b.held != nil && (s.Args[0] == "leave" && s.Args[1] == b.ticket ||
		s.Args[0] == "barrier_break" && len(s.Args) > 3 && s.Args[3] == b.ticket)
	b.mu.Unlock()
	if hold {
		// The caller leaves at its context's end; the command has not run.
		<-ctx.Done()
		return nil, ctx.Err()
	}
	out, err := b.Backend.Script(ctx, s)
	if withdrawal {
		b.mu.Lock()
		held := *b.held
		b.mu.Unlock()
		late, lerr := b.Backend.Script(context.Background(), held)
		b.mu.Lock()
		if b.late == nil {
			b.late = fmt.Sprint(late, lerr)
			close(b.done)
		}
		b.mu.Unlock()
	}
	return out, err
}

// A call whose command reaches Redis after its caller left and after the
// client withdrew its ticket (every call a caller can cut: an acquire
// granted at once or queued, a try, a multi-lock's acquire, a condition
// wait, a countdown latch's wait) does nothing there: a withdrawal leaves its ticket's tombstone, and
// a copy of the call that comes later finds it. Without it, the late copy
// queued a ticket nobody waits for, or granted it a lease nobody holds:
// the whole capacity was out of reach until the ticket's waiter TTL ran
// out (the fault tests saw it at a client's Close, through valkey-go,
// whose pipelined connections carried the acquire and its withdrawal
// apart).
func TestLateCopyAfterWithdrawalDoesNothing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rdb := b.Client(t)
		prefix := WithPrefix(redistest.Prefix(t))
		other, err := New(rdb, prefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = other.Close() })
		for _, tc := range []struct {
			name, op string
			held     bool // another client holds the mutex meanwhile (the copy would queue)
			call     func(ctx context.Context, c *Client, names []string) error
			names    []string
		}{
			{name: "acquire granted at once", op: "acquire", names: []string{"free"},
				call: func(ctx context.Context, c *Client, n []string) error {
					_, err := c.Acquire(ctx, Request{Name: n[0], Capacity: 2, Permits: 2})
					return err
				}},
			{name: "acquire queued", op: "acquire", held: true, names: []string{"held"},
				call: func(ctx context.Context, c *Client, n []string) error {
					_, err := c.Acquire(ctx, Request{Name: n[0], Capacity: 2, Permits: 2})
					return err
				}},
			{name: "try", op: "try", names: []string{"try"},
				call: func(ctx context.Context, c *Client, n []string) error {
					_, err := c.TryAcquire(ctx, Request{Name: n[0], Capacity: 2, Permits: 2})
					return err
				}},
			{name: "multi-lock acquire", op: "acquire", names: []string{"{m}:a", "{m}:b"},
				call: func(ctx context.Context, c *Client, n []string) error {
					_, err := c.AcquireAll(ctx, Request{Name: n[0], Capacity: 2, Permits: 2}, Request{Name: n[1], Capacity: 2, Permits: 2})
					return err
				}},
			{name: "condition wait", op: "wait", names: []string{"cond"},
				call: func(ctx context.Context, c *Client, n []string) error {
					l, err := c.Acquire(context.Background(), Request{Name: n[0], Capacity: 2, Permits: 2})
					if err != nil {
						return fmt.Errorf("the lease to wait with: %w", err)
					}
					_, err = l.condWait(ctx, "x")
					return err
				}},
			{name: "latch wait", op: "latch_wait", names: []string{"latch"},
				call: func(ctx context.Context, c *Client, n []string) error {
					_, err := c.latchWait(ctx, n[0], 2, time.Minute, nil)
					return err
				}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				lb := &lateCopyBackend{Backend: newGoRedis(rdb), op: tc.op, done: make(chan struct{})}
				c, err := NewWithBackend(lb, prefix)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				bg := context.Background()
				warmScripts(t, c)
				lb.mu.Lock()
				lb.armed = true
				lb.mu.Unlock()
				var holder *Lease
				if tc.held {
					if holder, err = other.Acquire(bg, Request{Name: tc.names[0], Capacity: 2, Permits: 1}); err != nil {
						t.Fatal(err)
					}
				}
				ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
				defer cancel()
				if err := tc.call(ctx, c, tc.names); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("the cut call = %v; want its context's end", err)
				}
				select {
				case <-lb.done:
				case <-time.After(10 * time.Second):
					t.Fatal("no withdrawal of the cut call's ticket within 10 s")
				}
				if holder != nil {
					if err := holder.Release(bg); err != nil {
						t.Fatal(err)
					}
				}
				// Nobody holds or waits: once the releases sent again
				// have landed, the whole capacity of each semaphore is
				// free, and nobody waits on the condition.
				if strings.Contains(fmt.Sprint(lb.late), "NOSCRIPT") {
					t.Fatalf("the late copy did not run: %v", lb.late)
				}
				if tc.op == "latch_wait" {
					// Nobody waits on the latch.
					if _, _, waiting, err := other.latchInspect(bg, tc.names[0]); err != nil || waiting != 0 {
						t.Fatalf("latch after the late copy (reply %v): %d waiting, %v; want none", lb.late, waiting, err)
					}
					return
				}
				for _, name := range tc.names {
					if tc.op == "wait" {
						for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
							if st, err := other.Status(bg, name); err == nil && st.InUse == 0 {
								break
							}
						}
						if n, err := other.signal(bg, name, "x", true); err != nil || n != 0 {
							t.Errorf("signal after the late copy (reply %v) = %d, %v; want nobody woken", lb.late, n, err)
						}
					}
					l, err := other.TryAcquire(bg, Request{Name: name, Capacity: 2, Permits: 2})
					if err != nil {
						st, serr := other.Status(bg, name)
						t.Fatalf("%s after the late copy (reply %v): %v; status %+v %v", name, lb.late, err, st, serr)
					}
					if err := l.Release(bg); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	})
}

// refusedAfterRunBackend runs the first call of op it sees once armed, then
// answers it with a refusal of Redis's own: as when a Redis client's try
// of the call ran and its reply was lost with the connection, and its next
// try was refused (OOM, READONLY in a failover, LOADING): the client then
// returns the last try's error.
type refusedAfterRunBackend struct {
	backend.Backend
	op string

	mu    sync.Mutex
	armed bool
	ran   string // what the try that ran answered
}

func (b *refusedAfterRunBackend) Script(ctx context.Context, s backend.Script) (any, error) {
	b.mu.Lock()
	hit := b.armed && len(s.Args) > 0 && s.Args[0] == b.op
	if hit {
		b.armed = false
	}
	b.mu.Unlock()
	if !hit {
		return b.Backend.Script(ctx, s)
	}
	out, err := b.Backend.Script(ctx, s)
	b.mu.Lock()
	b.ran = fmt.Sprint(out, err)
	b.mu.Unlock()
	return nil, &backend.ReplyError{Reply: "OOM command not allowed when used memory > 'maxmemory'."}
}

// A call that Redis refuses with an error of its own (not a fairlock
// script's refusal, which writes nothing) may answer a resend of a try that
// ran: the client withdraws it, as after a lost reply. Taken for a call
// that wrote nothing, the try that ran left a lease nobody holds, a waiter
// nobody waits as, or a barrier party that left, for their whole TTL.
func TestRefusedResendIsWithdrawn(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rdb := b.Client(t)
		prefix := WithPrefix(redistest.Prefix(t))
		// TTLs far past the test: what is not withdrawn stays.
		long := []Option{prefix, WithLeaseTTL(time.Minute), WithWaiterTTL(time.Minute)}
		other, err := New(rdb, long...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = other.Close() })
		bg := context.Background()
		for _, tc := range []struct {
			name, op string
			held     bool
			call     func(c *Client) error
		}{
			{name: "acquire granted at once", op: "acquire", call: func(c *Client) error {
				_, err := c.Acquire(bg, Request{Name: "free", Capacity: 1, Permits: 1})
				return err
			}},
			{name: "acquire queued", op: "acquire", held: true, call: func(c *Client) error {
				_, err := c.Acquire(bg, Request{Name: "held", Capacity: 1, Permits: 1})
				return err
			}},
			{name: "condition wait", op: "wait", call: func(c *Client) error {
				l, err := c.Acquire(bg, Request{Name: "cond", Capacity: 1, Permits: 1})
				if err != nil {
					return fmt.Errorf("the lease to wait with: %w", err)
				}
				_, err = l.condWait(bg, "x")
				return err
			}},
			{name: "latch wait", op: "latch_wait", call: func(c *Client) error {
				_, err := c.latchWait(bg, "latch", 2, time.Minute, nil)
				return err
			}},
			{name: "barrier await", op: "barrier_await", call: func(c *Client) error {
				_, err := c.barrierAwait(bg, "barrier", 2, time.Minute, nil)
				return err
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rb := &refusedAfterRunBackend{Backend: newGoRedis(rdb), op: tc.op}
				c, err := NewWithBackend(rb, long...)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				name := map[string]string{"acquire": "free", "wait": "cond", "latch_wait": "latch", "barrier_await": "barrier"}[tc.op]
				var holder *Lease
				if tc.held {
					name = "held"
					if holder, err = other.Acquire(bg, Request{Name: name, Capacity: 1, Permits: 1}); err != nil {
						t.Fatal(err)
					}
				}
				warmScripts(t, c)
				rb.mu.Lock()
				rb.armed = true
				rb.mu.Unlock()
				if err := tc.call(c); !errors.Is(err, ErrRedis) {
					t.Fatalf("the refused call = %v; want ErrRedis", err)
				}
				if strings.Contains(rb.ran, "NOSCRIPT") || rb.ran == "" {
					t.Fatalf("the try that ran answered %q", rb.ran)
				}
				if holder != nil {
					if err := holder.Release(bg); err != nil {
						t.Fatal(err)
					}
				}
				// The withdrawal runs in the background: within 10 s,
				// nothing of the call is left.
				var left string
				for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
					left = leftOf(t, other, tc.op, name)
					if left == "" {
						return
					}
					if time.Now().After(end) {
						t.Fatalf("10 s after the refused call (its try that ran answered %s): %s", rb.ran, left)
					}
				}
			})
		}
	})
}

// leftOf says what a call of op on name left in Redis that nobody uses (""
// when nothing): a lease or a waiter, a waiter on the condition "x", a
// latch's waiter, a barrier's party. A barrier's is asked once the round
// is broken or would complete: the check arrives as a party itself.
func leftOf(t *testing.T, c *Client, op, name string) string {
	t.Helper()
	ctx := context.Background()
	switch op {
	case "latch_wait":
		_, _, waiting, err := c.latchInspect(ctx, name)
		if err != nil || waiting != 0 {
			return fmt.Sprintf("%d waiting on the latch (%v)", waiting, err)
		}
		return ""
	case "barrier_await":
		actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		if a, err := c.barrierAwait(actx, name, 2, time.Minute, nil); err == nil && !a.broken {
			return fmt.Sprintf("the round completed with the party that left: %+v", a)
		}
		return ""
	}
	st, err := c.Status(ctx, name)
	if err != nil {
		return err.Error()
	}
	if st.InUse != 0 || st.Queued != 0 {
		return fmt.Sprintf("status %+v", st)
	}
	if op == "wait" {
		if n, err := c.signal(ctx, name, "x", true); err != nil || n != 0 {
			return fmt.Sprintf("a signal woke %d (%v)", n, err)
		}
	}
	return ""
}

// warmScripts has c load every script a test here holds back or refuses
// (an acquire's and a release's, a condition wait's, a latch's, a
// barrier's), so that the call the test arms next runs as sent.
func warmScripts(t *testing.T, c *Client) {
	t.Helper()
	bg := context.Background()
	warm, err := c.Acquire(bg, Request{Name: "warm", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, wait := range []func(context.Context) error{
		func(ctx context.Context) error { _, err := warm.condWait(ctx, "w"); return err },
		func(ctx context.Context) error { _, err := c.latchWait(ctx, "warm", 2, time.Minute, nil); return err },
		func(ctx context.Context) error {
			_, err := c.barrierAwait(ctx, "warm", 2, time.Minute, nil)
			return err
		},
	} {
		ctx, cancel := context.WithTimeout(bg, 50*time.Millisecond)
		err := wait(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("warm-up wait = %v", err)
		}
	}
}
