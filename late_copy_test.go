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
		case "latch_wait":
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
	withdrawal := b.held != nil && s.Args[0] == "leave" && s.Args[1] == b.ticket
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
				// The client's scripts are loaded first (a wait's too):
				// the late copy runs as sent.
				warm, err := c.Acquire(bg, Request{Name: "warm", Capacity: 1, Permits: 1})
				if err != nil {
					t.Fatal(err)
				}
				wctx, wcancel := context.WithTimeout(bg, 50*time.Millisecond)
				_, err = warm.condWait(wctx, "w")
				wcancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("warm-up wait = %v", err)
				}
				wctx, wcancel = context.WithTimeout(bg, 50*time.Millisecond)
				_, err = c.latchWait(wctx, "warm", 2, time.Minute, nil)
				wcancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("warm-up latch wait = %v", err)
				}
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
