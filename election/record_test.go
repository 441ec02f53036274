package election

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
)

// The record never goes back to a lower term, and holds only the mutex's
// live lease: a leader granted before a pause, recording after its
// successor did, leaves the successor's record; a term whose lease has
// ended, or that was never granted, is never recorded.
func TestRecordNeverGoesBack(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		c, err := fairlock.New(b.Client(t), fairlock.WithPrefix(redistest.Prefix(t)))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		e, err := New(c, "rec")
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		first, err := c.Acquire(ctx, e.mutex())
		if err != nil {
			t.Fatal(err)
		}
		set := func(term int64, value string, want bool) {
			t.Helper()
			if ok, err := e.set(ctx, term, value); err != nil || ok != want {
				t.Fatalf("set(%d, %q) = %v, %v; want %v", term, value, ok, err, want)
			}
		}
		set(first.Token(), "a", true)
		set(first.Token(), "a", true) // renewed
		set(first.Token()+1, "never granted", false)
		if err := first.Release(ctx); err != nil {
			t.Fatal(err)
		}
		set(first.Token(), "released", false)
		second, err := c.Acquire(ctx, e.mutex())
		if err != nil {
			t.Fatal(err)
		}
		set(second.Token(), "b", true)
		set(first.Token(), "late", false)
		if got, err := e.Leader(ctx); err != nil || got != (Info{Value: "b", Term: second.Token()}) {
			t.Fatalf("Leader() = %+v, %v; want b at term %d", got, err, second.Token())
		}
		if err := second.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := e.Leader(ctx); err == nil {
			t.Fatalf("Leader() = %+v once the lease is released; want ErrNoLeader", got)
		}
	})
}
