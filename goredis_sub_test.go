package fairlock

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

// A Receive that returns at its context's deadline leaves its read to
// the next Receive, whose context lives: the read's end by the first
// context (go-redis heeds a deadline as the read's own) is not the next
// Receive's error. It once was: "i/o timeout", taken for a failed
// connection.
func TestGoRedisReceiveAfterOneCutShort(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		g := newGoRedis(b.Client(t))
		sub, err := g.Subscribe(context.Background(), redistest.Prefix(t)+"ch")
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		// The subscription's confirmation.
		if _, subscribed, _, err := sub.Receive(context.Background(), 5*time.Second); err != nil || !subscribed {
			t.Fatalf("first Receive = subscribed %v, %v; want the subscription", subscribed, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		// (It may report silence: the read's own deadline is the
		// context's, which may come first.)
		_, _, _, _ = sub.Receive(ctx, 5*time.Second)
		time.Sleep(200 * time.Millisecond) // the left read ends
		payload, _, ok, err := sub.Receive(context.Background(), 300*time.Millisecond)
		if err != nil {
			t.Fatalf("Receive after a Receive cut short = %q, %v, %v; want silence, no error", payload, ok, err)
		}
	})
}
