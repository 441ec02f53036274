package election

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/redistest"
)

// The record never goes back to a lower term: a leader granted before a
// pause, recording after its successor did, leaves the successor's record.
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
		for _, step := range []struct {
			term  int64
			value string
			ok    bool
		}{{10, "a", true}, {10, "a", true}, {12, "b", true}, {11, "late", false}, {10, "a", false}} {
			ok, err := e.set(ctx, step.term, step.value)
			if err != nil || ok != step.ok {
				t.Fatalf("set(%d, %q) = %v, %v; want %v", step.term, step.value, ok, err, step.ok)
			}
		}
		if got, err := e.get(ctx); err != nil || got != (Info{Value: "b", Term: 12}) {
			t.Fatalf("record %+v, %v; want b at term 12", got, err)
		}
	})
}
