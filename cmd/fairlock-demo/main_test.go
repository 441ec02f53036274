package main

import (
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The demo's crash is a crash: the holder's lease is left to expire, so
// the waiter is granted once Redis's clock has passed the lease's TTL,
// never at once (as it would be if the crash released the lease). The
// step itself fails if the grant came before the lease's Expiry.
func TestDemoCrashWaitsForTheLease(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const ttl = time.Second
		d := &demo{addr: b.Addr}
		r, err := d.crashed(ttl)
		if err != nil {
			t.Fatal(err)
		}
		if r.after < r.heldFor {
			t.Fatalf("waiter granted %v after the crash, the lease held until %v after it; want the grant after the lease's expiry, about a TTL (%v)", r.after, r.heldFor, ttl)
		}
		if r.next <= r.crashed {
			t.Fatalf("token %d after the crashed holder's %d", r.next, r.crashed)
		}
	})
}
