// Package sched runs many timed functions on one runtime timer: the
// renewals of a client's leases.
package sched

import (
	"container/heap"
	"sync"
	"time"
)

// A Scheduler runs the renewals of a client's leases on one runtime timer.
// A timer per lease made every acquisition arm a timer of its own, and
// arming a timer earlier than any other wakes the Go runtime's network
// poller (a system call and a thread woken: on a small machine, a fifth of
// an uncontended acquire's client CPU). Here a new renewal is due later than the
// one the timer is armed for, in the common case, and arms nothing; a
// renewal cancelled by a release leaves the timer armed, to fire once for
// nothing.
type Scheduler struct {
	mu    sync.Mutex
	timer *time.Timer // nil until first armed
	at    time.Time   // when timer fires; zero when it is not armed
	q     schedQueue
}

// An Entry is one lease's renewal: its Reset and Stop stand in for a
// *time.Timer's made by time.AfterFunc. f(arg) runs on a goroutine of its
// own.
type Entry struct {
	s   *Scheduler
	f   func(any)
	arg any
	due time.Time
	i   int // index in s.q; -1 when not scheduled
}

// Start makes *e, unused so far, an entry that runs f(arg) after d, and
// returns e. With e a field of arg's struct and f a plain function, a
// renewal costs no allocation (After's closure and entry).
func (s *Scheduler) Start(e *Entry, d time.Duration, f func(any), arg any) *Entry {
	*e = Entry{s: s, f: f, arg: arg, i: -1}
	e.Reset(d)
	return e
}

// After schedules f to run after d, as time.AfterFunc does. The zero
// Scheduler is ready to use.
func (s *Scheduler) After(d time.Duration, f func()) *Entry {
	return s.Start(new(Entry), d, callFunc, f)
}

// callFunc calls f, a func().
func callFunc(f any) { f.(func())() }

// Reset makes e due d from now, scheduled or not.
func (e *Entry) Reset(d time.Duration) {
	s := e.s
	s.mu.Lock()
	defer s.mu.Unlock()
	e.due = time.Now().Add(d)
	if e.i >= 0 {
		heap.Fix(&s.q, e.i)
	} else {
		heap.Push(&s.q, e)
	}
	s.armLocked()
}

// Stop unschedules e; it reports whether e was scheduled.
func (e *Entry) Stop() bool {
	s := e.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.i < 0 {
		return false
	}
	heap.Remove(&s.q, e.i)
	return true
}

// armLocked makes the timer fire no later than the earliest entry's due
// time. It leaves a timer armed for earlier alone.
func (s *Scheduler) armLocked() {
	if len(s.q) == 0 {
		return
	}
	due := s.q[0].due
	if !s.at.IsZero() && !due.Before(s.at) {
		return
	}
	s.at = due
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(due), s.fire)
	} else {
		s.timer.Reset(time.Until(due))
	}
}

// fire runs the entries that are due, each on a goroutine of its own, and
// arms the timer for the next.
func (s *Scheduler) fire() {
	s.mu.Lock()
	s.at = time.Time{}
	now := time.Now()
	type run struct {
		f   func(any)
		arg any
	}
	var due []run
	for len(s.q) > 0 && !s.q[0].due.After(now) {
		e := heap.Pop(&s.q).(*Entry)
		due = append(due, run{e.f, e.arg})
	}
	s.armLocked()
	s.mu.Unlock()
	for _, r := range due {
		go r.f(r.arg)
	}
}

// Lock holds up every entry: none runs until Unlock, as none would in a
// stopped process (tests).
func (s *Scheduler) Lock() { s.mu.Lock() }

// Unlock lets the entries run again (see Lock).
func (s *Scheduler) Unlock() { s.mu.Unlock() }

// schedQueue is a min-heap of entries by due time (container/heap).
type schedQueue []*Entry

func (q schedQueue) Len() int           { return len(q) }
func (q schedQueue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q schedQueue) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].i, q[j].i = i, j
}
func (q *schedQueue) Push(x any) {
	e := x.(*Entry)
	e.i = len(*q)
	*q = append(*q, e)
}
func (q *schedQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.i = -1
	*q = old[:len(old)-1]
	return e
}
