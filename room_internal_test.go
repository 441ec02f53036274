package fairlock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/wait"
)

// A client keeps the room of an acquisition granted at once (made, never
// run) for its next room: on another semaphore, that room listens on the
// other semaphore's wake list, and its waiter hears its grant by a
// wake-up. A room that ran is never kept, even when it ended with
// waiters: its maintain and its listener may still hold it.
func TestSpareRoom(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := New(b.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		other, err := New(b.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		req := func(name string) Request { return Request{Name: name, Capacity: 1, Permits: 1} }
		spare := func() *wait.Room {
			c.waits.Mu.Lock()
			defer c.waits.Mu.Unlock()
			return c.waits.Spare
		}
		// roomOf waits until c has a running room on name, and returns it.
		roomOf := func(name string) *wait.Room {
			t.Helper()
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				c.waits.Mu.Lock()
				for _, r := range c.waits.Rooms {
					if r.Running && strings.Contains(r.K.Base, "{"+name+"}") {
						c.waits.Mu.Unlock()
						return r
					}
				}
				c.waits.Mu.Unlock()
			}
			t.Fatalf("no running room on %s", name)
			return nil
		}

		// Another program's value on the client's one wake list moves its
		// waiters to a wake list per semaphore (the scripts push there,
		// the rooms listen there): a waiter's room learns of it, and a
		// room made for one semaphore then does not serve another as it
		// is.
		kx, err := c.keys("spare-x")
		if err != nil {
			t.Fatal(err)
		}
		if kx.Wake(c.id) == kx.OwnWake(c.id) {
			t.Fatalf("the client has no one wake list")
		}
		if err := b.Client(t).Set(ctx, kx.Wake(c.id), "another program's", 0).Err(); err != nil {
			t.Fatal(err)
		}
		held, err := other.Acquire(ctx, req("spare-x"))
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			l, err := c.Acquire(ctx, req("spare-x"))
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		roomOf("spare-x")
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		c.waits.Mu.Lock()
		own := c.waits.OwnLists
		c.waits.Mu.Unlock()
		if !own {
			t.Fatalf("the client does not listen on a wake list per semaphore")
		}

		// An acquisition granted at once leaves its room as the spare.
		l, err := c.Acquire(ctx, req("spare-a"))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		kept := spare()
		if kept == nil || !strings.Contains(kept.K.Base, "{spare-a}") {
			t.Fatalf("after a grant at once, the spare room is %+v, want spare-a's", kept)
		}

		// The next room, on spare-b, is that one, made over for spare-b.
		held, err = other.Acquire(ctx, req("spare-b"))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			l, err := c.Acquire(ctx, req("spare-b"))
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		r := roomOf("spare-b")
		c.waits.Mu.Lock()
		want := c.waits.WakeKeyLocked(r.K)
		wakeKey := r.WakeKey
		c.waits.Mu.Unlock()
		if r != kept {
			t.Errorf("the room on spare-b is not the spare")
		}
		if wakeKey != want {
			t.Errorf("the room on spare-b listens on %s, want %s", wakeKey, want)
		}
		_, woken, _ := c.waits.Grants.Get()
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if _, n, _ := c.waits.Grants.Get(); n != woken+1 {
			t.Errorf("the waiter on spare-b learned its grant by %d wake-ups, want 1", n-woken)
		}

		// A room that ran and ended with a waiter (as when its listener is
		// dropped) is not kept when that waiter leaves.
		held, err = other.Acquire(ctx, req("spare-c"))
		if err != nil {
			t.Fatal(err)
		}
		defer held.Release(context.Background())
		wctx, stop := context.WithCancel(ctx)
		go func() {
			_, err := c.Acquire(wctx, req("spare-c"))
			got <- err
		}()
		r = roomOf("spare-c")
		c.waits.Mu.Lock()
		c.waits.StopRoomLocked(r)
		c.waits.Mu.Unlock()
		stop()
		if err := <-got; !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled waiter's Acquire: %v, want context.Canceled", err)
		}
		if s := spare(); s == r {
			t.Errorf("a room that ran is the spare")
		}
	})
}
