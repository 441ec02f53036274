package fltest

import (
	"sync"

	"github.com/fairlock/fairlock"
)

// Events is a fairlock.Observer that keeps every event it is told of.
type Events struct {
	mu  sync.Mutex
	all []fairlock.Event
}

// Observe keeps e.
func (r *Events) Observe(e fairlock.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, e)
}

// Take returns the events so far and forgets them.
func (r *Events) Take() []fairlock.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.all
	r.all = nil
	return out
}
