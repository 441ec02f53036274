package sched

import (
	"sync"
	"testing"
	"time"
)

// The scheduler runs each entry once it is due, never a stopped one, and
// moves entries that are reset; a new entry due later than the armed
// timer arms nothing.
func TestScheduler(t *testing.T) {
	var s Scheduler
	var mu sync.Mutex
	var ran []string
	done := make(chan struct{}, 8)
	run := func(name string) func() {
		return func() {
			mu.Lock()
			ran = append(ran, name)
			mu.Unlock()
			done <- struct{}{}
		}
	}
	late := s.After(time.Hour, run("late"))
	armed := s.at
	b := s.After(2*time.Hour, run("b"))
	if s.at != armed {
		t.Fatalf("an entry due after the armed time re-armed the timer: %v, was %v", s.at, armed)
	}
	a := s.After(40*time.Millisecond, run("a"))
	if !s.at.Before(armed) {
		t.Fatal("an entry due before the armed time did not arm the timer earlier")
	}
	stopped := s.After(10*time.Millisecond, run("stopped"))
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop reports wrongly whether the entry was scheduled")
	}
	b.Reset(20 * time.Millisecond) // moved ahead of a
	for range 2 {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("entries due did not run; ran %v", ran)
		}
	}
	time.Sleep(50 * time.Millisecond)
	mu.Lock()
	got := append([]string(nil), ran...)
	mu.Unlock()
	if len(got) != 2 || got[0] != "b" || got[1] != "a" {
		t.Fatalf("ran %v, want [b a]", got)
	}
	if a.i != -1 || b.i != -1 || late.i < 0 {
		t.Fatalf("queue indexes after running: a %d, b %d, late %d", a.i, b.i, late.i)
	}
	// An entry run may be scheduled again.
	a.Reset(time.Millisecond)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("an entry reset after it ran did not run again")
	}
	late.Stop()
	if len(s.q) != 0 {
		t.Fatalf("%d entries left", len(s.q))
	}
}

// Many entries, scheduled and stopped in any order, run in due order.
func TestSchedulerOrder(t *testing.T) {
	var s Scheduler
	const n = 200
	out := make(chan int, n)
	es := make([]*Entry, n)
	for i := range n {
		// Due in reverse order of creation, 1 ms apart.
		es[i] = s.After(time.Duration(n-i)*time.Millisecond+20*time.Millisecond, func() { out <- i })
	}
	for i := 0; i < n; i += 2 {
		es[i].Stop()
	}
	prev := n
	for range n / 2 {
		select {
		case i := <-out:
			if i%2 == 0 {
				t.Fatalf("stopped entry %d ran", i)
			}
			// Each runs on its own goroutine, which a loaded machine
			// may start late: entries due within 50 ms of each other
			// may come out of order (a heap out of order fires them
			// up to 200 ms apart).
			if i > prev+50 {
				t.Fatalf("entry %d ran long after %d", i, prev)
			}
			prev = min(prev, i)
		case <-time.After(10 * time.Second):
			t.Fatal("entries due did not run")
		}
	}
}
