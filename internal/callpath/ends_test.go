package callpath

import (
	"context"
	"testing"
	"time"
)

// TestEnds: at the end, an Ends ends every call registered with it and
// no call removed from it, whether or not its slot was taken again, and
// whether or not it was removed twice; a call registered after the end is
// ended at once.
func TestEnds(t *testing.T) {
	call := func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	e := NewEnds(context.Background()) // ended below by fire itself

	a, cancelA := call()
	b, cancelB := call()
	x, cancelX := call()
	slotA, slotB, slotX := e.Add(cancelA), e.Add(cancelB), e.Add(cancelX)
	if slotA.i == slotB.i || slotB.i == slotX.i || slotA.i == slotX.i {
		t.Fatalf("slots %d, %d and %d: want three distinct slots", slotA.i, slotB.i, slotX.i)
	}
	e.Remove(slotB)
	e.Remove(slotX)
	c, cancelC := call()
	slotC := e.Add(cancelC)
	if slotC.i != slotX.i && slotC.i != slotB.i {
		t.Errorf("slot %d after slots %d and %d were removed: want one of them reused", slotC.i, slotB.i, slotX.i)
	}
	// x's call is over twice (its done run again): c, now in a slot x
	// had or beside it, stays registered.
	e.Remove(slotX)
	e.Remove(slotX)
	if e.Err() != nil {
		t.Fatalf("Err = %v before the end", e.Err())
	}

	e.fire()
	for _, w := range []struct {
		name  string
		ctx   context.Context
		ended bool
	}{
		{"a (registered)", a, true},
		{"b (removed)", b, false},
		{"x (removed twice)", x, false},
		{"c (in a reused slot)", c, true},
	} {
		if got := w.ctx.Err() != nil; got != w.ended {
			t.Errorf("%s: ended %v at the end, want %v", w.name, got, w.ended)
		}
	}

	d, cancelD := call()
	if slot := e.Add(cancelD); slot.i != -1 {
		t.Errorf("Add after the end returned slot %d, want -1", slot.i)
	}
	if d.Err() == nil {
		t.Error("a call registered after the end was not ended at once")
	}
	e.Remove(Slot{i: -1}) // a no-op
	for _, cancel := range []context.CancelFunc{cancelA, cancelB, cancelC, cancelX} {
		cancel()
	}
}

// TestEndsFollowsItsContext: NewEnds runs its cancels when its own
// context ends, and Err says so.
func TestEndsFollowsItsContext(t *testing.T) {
	end, stop := context.WithCancel(context.Background())
	e := NewEnds(end)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e.Add(cancel)
	stop()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a registered call was not ended within 5s of the Ends' context")
	}
	if e.Err() == nil {
		t.Error("Err = nil after the end")
	}
}
