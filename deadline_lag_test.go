package fairlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/callpath"
	"github.com/fairlock/fairlock/internal/redistest"
)

// lagCtx is a context whose deadline has passed while its Err is still
// nil: its Done closes lag later, as a context.WithDeadline's does when
// its timer's goroutine runs late (measured at up to 280 ms under the race
// detector on two busy cores), or as a context whose Done does not close
// at its deadline never does.
type lagCtx struct {
	context.Context // values only
	deadline        time.Time
	done            chan struct{}
	once            sync.Once
	timer           *time.Timer
}

func newLagCtx(lag time.Duration) *lagCtx {
	c := &lagCtx{Context: context.Background(), deadline: time.Now().Add(-time.Millisecond), done: make(chan struct{})}
	c.timer = time.AfterFunc(lag, func() { c.once.Do(func() { close(c.done) }) })
	return c
}

func (c *lagCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *lagCtx) Done() <-chan struct{}       { return c.done }
func (c *lagCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// socketDeadlines is a go-redis Backend whose scripts fail as a client's
// do when it sets its socket's deadline from the caller's context and
// that deadline has passed: with os.ErrDeadlineExceeded ("i/o timeout"),
// not a context's error. sent says whether the script reaches Redis first
// (a reply lost at the deadline) or not (a dial or write cut off).
// deadlines is what Info says of backend.Info.Deadlines.
type socketDeadlines struct {
	*goRedis
	sent, deadlines bool
}

func (b *socketDeadlines) Info() backend.Info {
	info := b.goRedis.Info()
	info.Deadlines = b.deadlines
	return info
}

func (b *socketDeadlines) cut(ctx context.Context) error {
	if !callpath.PastDeadline(ctx) {
		return nil
	}
	return &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
}

func (b *socketDeadlines) Script(ctx context.Context, s backend.Script) (any, error) {
	err := b.cut(ctx)
	if err == nil || b.sent {
		v, serr := b.goRedis.Script(context.WithoutCancel(ctx), s)
		if err == nil {
			return v, serr
		}
	}
	return nil, err
}

func (b *socketDeadlines) ScriptWait(ctx context.Context, s backend.Script, replicas int, timeout time.Duration) (any, int64, error, error) {
	v, err := b.Script(ctx, s)
	return v, 0, err, err
}

// A call whose context's deadline passes before the context says so fails
// with the caller's deadline, as with any context that has ended, not
// with ErrRedis: whatever the op (every op that takes a context, an
// election's record included), whether
// the script reached Redis or not, and whether the Backend returns by the
// context's end itself or the client waits for it. What the call left in
// Redis is cleaned up as after any ended context: a moment later the
// semaphore holds nothing and nobody waits on it.
//
// (The bench's contended scenario met it: valkey-go's dial under a
// deadline just passed failed "dial tcp: i/o timeout" while ctx.Err() was
// still nil, and Acquire returned ErrRedis.)
func TestDeadlinePassedBeforeItsContextSaysSo(t *testing.T) {
	type row struct {
		name string
		// hold: the row needs a lease held on the semaphore first.
		hold bool
		do   func(ctx context.Context, c *Client, held *Lease) error
	}
	req := func(name string) Request { return Request{Name: name, Capacity: 1, Permits: 1} }
	rows := []row{
		{"Acquire free", false, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.Acquire(ctx, req("s"))
			return err
		}},
		{"Acquire queued", true, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.Acquire(ctx, req("s"))
			return err
		}},
		{"TryAcquire", false, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.TryAcquire(ctx, req("s"))
			return err
		}},
		{"AcquireAll", true, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.AcquireAll(ctx, req("s"), req("t"))
			return err
		}},
		{"TryAcquireAll", false, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.TryAcquireAll(ctx, req("s"), req("t"))
			return err
		}},
		{"Status", true, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.Status(ctx, "s")
			return err
		}},
		{"Release", true, func(ctx context.Context, _ *Client, held *Lease) error {
			return held.Release(ctx)
		}},
		{"condition wait", true, func(ctx context.Context, _ *Client, held *Lease) error {
			l, err := held.condWait(ctx, "cv")
			if l != nil {
				_ = l.Release(context.Background())
			}
			return err
		}},
		{"signal", true, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.signal(ctx, "s", "cv", false)
			return err
		}},
		{"broadcast", true, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.signal(ctx, "s", "cv", true)
			return err
		}},
		{"record a leader", false, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.leaderSet(ctx, "e", 1, "me", time.Second)
			return err
		}},
		{"clear a leader", false, func(ctx context.Context, c *Client, _ *Lease) error {
			return c.leaderClear(ctx, "e", 1)
		}},
		{"read the leader", false, func(ctx context.Context, c *Client, _ *Lease) error {
			_, err := c.leaderGet(ctx, "e")
			return err
		}},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, r := range rows {
			for _, sent := range []bool{false, true} {
				for _, deadlines := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/sent=%v/deadlines=%v", r.name, sent, deadlines), func(t *testing.T) {
						bg := context.Background()
						prefix := WithPrefix(redistest.Prefix(t))
						// A waiter TTL far past the check below: a ticket the
						// call left queued stays until cleaned up.
						c, err := NewWithBackend(&socketDeadlines{goRedis: newGoRedis(b.Client(t)), sent: sent, deadlines: deadlines},
							prefix, WithWaiterTTL(time.Minute))
						if err != nil {
							t.Fatal(err)
						}
						defer c.Close()
						var held *Lease
						if r.hold {
							if held, err = c.Acquire(bg, req("s")); err != nil {
								t.Fatal(err)
							}
						}
						// The context never says its deadline passed while
						// the call runs: the call alone must see it.
						ctx := newLagCtx(time.Minute)
						defer ctx.timer.Stop()
						err = r.do(ctx, c, held)
						if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrRedis) {
							t.Fatalf("%s under a deadline passed a moment before its context said so = %v, want the deadline's error, not ErrRedis", r.name, err)
						}
						if held != nil {
							_ = held.Release(bg)
						}
						// Nothing is left behind.
						observer, err := New(b.Client(t), prefix)
						if err != nil {
							t.Fatal(err)
						}
						defer observer.Close()
						deadline := time.Now().Add(5 * time.Second)
						for _, name := range []string{"s", "t"} {
							for {
								st, err := observer.Status(bg, name)
								if err != nil {
									t.Fatal(err)
								}
								if len(st.Holders)+len(st.Waiters) == 0 {
									break
								}
								if time.Now().After(deadline) {
									t.Fatalf("%s: %d holders and %d waiters on %q 5 s after the call, want none", r.name, len(st.Holders), len(st.Waiters), name)
								}
								time.Sleep(10 * time.Millisecond)
							}
						}
					})
				}
			}
		}
	})
}
