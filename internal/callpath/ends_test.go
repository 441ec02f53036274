package callpath

import (
	"context"
	"testing"
	"time"
)

// TestEnds: a call registered with an Ends is ended when its context
// ends, a call that removed itself first is not (whether or not its slot
// was taken again since), a call registered after the end is ended at
// once, and slots are reused.
func TestEnds(t *testing.T) {
	end, stop := context.WithCancel(context.Background())
	e := NewEnds(end)

	call := func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	a, cancelA := call()
	b, cancelB := call()
	slotA, slotB := e.Add(cancelA), e.Add(cancelB)
	if slotA == slotB || slotA < 0 || slotB < 0 {
		t.Fatalf("slots %d and %d: want two distinct slots", slotA, slotB)
	}
	_, cancelX := call()
	slotX := e.Add(cancelX)
	e.Remove(slotB)
	e.Remove(slotX)
	c, cancelC := call()
	if slotC := e.Add(cancelC); slotC != slotX && slotC != slotB {
		t.Errorf("slot %d after slots %d and %d were removed: want one of them reused", slotC, slotB, slotX)
	}
	if e.Err() != nil {
		t.Fatalf("Err = %v before the end", e.Err())
	}

	stop()
	for name, ctx := range map[string]context.Context{"a (registered)": a, "c (in a reused slot)": c} {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Errorf("%s: not ended within 5s of the Ends' context", name)
		}
	}
	// fire ran every cancel at once, a's and c's among them.
	if b.Err() != nil {
		t.Error("b (removed): ended by the Ends")
	}
	if e.Err() == nil {
		t.Error("Err = nil after the end")
	}

	// fire has run: a call registered now is ended at once.
	d, cancelD := call()
	if slot := e.Add(cancelD); slot != -1 {
		t.Errorf("Add after the end returned slot %d, want -1", slot)
	}
	if d.Err() == nil {
		t.Error("a call registered after the end was not ended at once")
	}
	e.Remove(-1) // a no-op
	cancelA()
	cancelB()
	cancelC()
	cancelX()
}
