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
	ctx    context.Context
	mu     sync.Mutex
	ended  bool
	cancel []context.CancelFunc // by slot; nil in a free slot
	free   []int                // free slots
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
// its cancels have run, Add runs cancel itself, at once, and returns -1.
func (e *Ends) Add(cancel context.CancelFunc) int {
	e.mu.Lock()
	if e.ended {
		e.mu.Unlock()
		cancel()
		return -1
	}
	var slot int
	if n := len(e.free); n > 0 {
		slot = e.free[n-1]
		e.free = e.free[:n-1]
		e.cancel[slot] = cancel
	} else {
		slot = len(e.cancel)
		e.cancel = append(e.cancel, cancel)
	}
	e.mu.Unlock()
	return slot
}

// Remove forgets the cancel Add put in slot (none for -1).
func (e *Ends) Remove(slot int) {
	if slot < 0 {
		return
	}
	e.mu.Lock()
	if !e.ended {
		e.cancel[slot] = nil
		e.free = append(e.free, slot)
	}
	e.mu.Unlock()
}

// fire runs every registered cancel, once e's context has ended.
func (e *Ends) fire() {
	e.mu.Lock()
	e.ended = true
	cancels := e.cancel
	e.cancel, e.free = nil, nil
	e.mu.Unlock()
	for _, cancel := range cancels {
		if cancel != nil {
			cancel()
		}
	}
}
