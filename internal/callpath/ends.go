package callpath

import (
	"context"
	"sync"
)

// Ends ends the contexts of the calls registered with it when a context
// of its own ends (a client's close): what a context.AfterFunc per call
// would do, without the two allocations each of those makes. It runs
// the registered cancels as AfterFunc would, on a goroutine of their own,
// once its context has ended.
type Ends struct {
	ctx   context.Context
	mu    sync.Mutex
	ended bool
	slots []endSlot // nil cancel in a free slot
	free  []int     // free slots
	gen   uint64    // the last Slot's
}

type endSlot struct {
	cancel context.CancelFunc
	gen    uint64
}

// Slot is where Add put a call's cancel, for Remove.
type Slot struct {
	i   int
	gen uint64 // tells this registration from a later one in the same slot
}

// NewEnds returns the Ends of ctx.
func NewEnds(ctx context.Context) *Ends {
	e := &Ends{ctx: ctx}
	context.AfterFunc(ctx, e.fire)
	return e
}

// Err is the error of e's context.
func (e *Ends) Err() error { return e.ctx.Err() }

// Add registers cancel to run when e's context ends, and returns the slot
// that Remove takes once the call is over. If e's context has ended and
// its cancels have run, Add runs cancel itself, at once, and returns a
// slot that Remove ignores.
func (e *Ends) Add(cancel context.CancelFunc) Slot {
	e.mu.Lock()
	if e.ended {
		e.mu.Unlock()
		cancel()
		return Slot{i: -1}
	}
	e.gen++
	s := Slot{gen: e.gen}
	if n := len(e.free); n > 0 {
		s.i = e.free[n-1]
		e.free = e.free[:n-1]
		e.slots[s.i] = endSlot{cancel, s.gen}
	} else {
		s.i = len(e.slots)
		e.slots = append(e.slots, endSlot{cancel, s.gen})
	}
	e.mu.Unlock()
	return s
}

// Remove forgets the cancel Add put in s. Removing it again, or after
// the end, does nothing: it cannot reach a later call's cancel.
func (e *Ends) Remove(s Slot) {
	e.mu.Lock()
	if !e.ended && s.i >= 0 && s.i < len(e.slots) && e.slots[s.i].gen == s.gen && e.slots[s.i].cancel != nil {
		e.slots[s.i] = endSlot{}
		e.free = append(e.free, s.i)
	}
	e.mu.Unlock()
}

// fire runs every registered cancel, once e's context has ended.
func (e *Ends) fire() {
	e.mu.Lock()
	e.ended = true
	slots := e.slots
	e.slots, e.free = nil, nil
	e.mu.Unlock()
	for _, s := range slots {
		if s.cancel != nil {
			s.cancel()
		}
	}
}
