package fairlock

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/internal/keyslot"
	"github.com/fairlock/fairlock/internal/wait"
)

// slotsBackend is a Backend for walking a client's listeners through their
// fallback states: it answers typesScript with the types set in foreign
// (another program's string at those keys), and its blocking reads wait
// for their context. Nothing else reaches it in the walk.
type slotsBackend struct {
	layout backend.Layout
	mu     sync.Mutex
	types  map[string]string // key -> TYPE; "none" when absent
}

func (b *slotsBackend) Info() backend.Info { return backend.Info{Layout: b.layout} }
func (b *slotsBackend) Script(_ context.Context, s backend.Script) (any, error) {
	if s.Name != wait.TypesScript.SHA && s.Name != wait.TypesScript.Src {
		return nil, nil // a nudge
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]any, len(s.Keys))
	for i, k := range s.Keys {
		out[i] = "none"
		if t, ok := b.types[k]; ok {
			out[i] = t
		}
	}
	return out, nil
}
func (b *slotsBackend) ScriptWait(ctx context.Context, s backend.Script, _ int, _ time.Duration) (any, int64, error, error) {
	r, err := b.Script(ctx, s)
	return r, 0, err, nil
}
func (b *slotsBackend) LoadLibrary(context.Context, string) error { return errors.New("no library") }
func (b *slotsBackend) BlockingPop(ctx context.Context, _ time.Duration, _ int, _ []string) (string, []string, error) {
	<-ctx.Done()
	return "", nil, ctx.Err()
}
func (b *slotsBackend) Pop(context.Context, string, int) ([]string, error) { return nil, nil }
func (b *slotsBackend) Blocking() (backend.Backend, func() error, error)   { return b, nil, nil }

func (b *slotsBackend) plant(key string, foreign bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if foreign {
		b.types[key] = "string"
	} else {
		delete(b.types, key)
	}
}

// Every blocking read a listener sends takes keys of one hash slot, its
// control list's included, in every fallback state: the client's one wake
// list holding another program's value (the rooms move to their
// semaphores' own lists), a control list holding one (the listener takes
// another), both, and back; on every layout. A node in cluster mode that
// serves every slot, behind a client that takes it for one server, refuses
// a read across slots (CROSSSLOT) every time, and its waiters would hear
// their grants only through their refresh.
func TestListenerReadsStayInOneSlot(t *testing.T) {
	names := []string{"a", "b", "{acct}:1", "{acct}:2", "jobs", "{x}y"}
	for _, layout := range []backend.Layout{backend.Single, backend.Cluster, backend.Other} {
		t.Run(map[backend.Layout]string{backend.Single: "single", backend.Cluster: "cluster", backend.Other: "other"}[layout], func(t *testing.T) {
			b := &slotsBackend{layout: layout, types: map[string]string{}}
			c, err := NewWithBackend(b, WithPrefix("p:"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			w := c.waits
			w.Mu.Lock()
			for _, name := range names {
				k, err := c.keys(name)
				if err != nil {
					w.Mu.Unlock()
					t.Fatal(err)
				}
				r := &wait.Room{C: w, K: k, WakeKey: w.WakeKeyLocked(k), Kick: make(chan struct{}, 1),
					Waiters: map[string]*wait.Waiter{"T" + name: {Ticket: "T" + name}}, Running: true, Stop: make(chan struct{})}
				w.Rooms[k.Base] = r
				w.AttachLocked(r)
			}
			w.Mu.Unlock()

			check := func(state string) {
				t.Helper()
				w.Mu.Lock()
				defer w.Mu.Unlock()
				heard := map[*wait.Room]bool{}
				for _, ls := range w.Listeners {
					for _, l := range ls {
						keys := l.ReadKeysLocked()
						for _, k := range keys[1:] {
							if keyslot.Of(k) != keyslot.Of(keys[0]) {
								t.Fatalf("%s: a blocking read takes %q (slot %d) and %q (slot %d): refused as CROSSSLOT", state, keys[0], keyslot.Of(keys[0]), k, keyslot.Of(k))
							}
						}
						for _, r := range l.Rooms {
							heard[r] = heard[r] || l.Wakes[r.WakeKey] > 0
						}
					}
				}
				for _, r := range w.Rooms {
					if !heard[r] {
						t.Fatalf("%s: no listener reads %s's wake list %q", state, r.K.Base, r.WakeKey)
					}
				}
			}
			// foreignAt has every listener look at its read's keys as after
			// a WRONGTYPE (leaveOutForeign), with planted values at keys.
			foreignAt := func(state string, keys func(l *wait.Listener) []string) {
				t.Helper()
				w.Mu.Lock()
				var all []*wait.Listener
				for _, ls := range w.Listeners {
					all = append(all, ls...)
				}
				reads := make([][]string, len(all))
				for i, l := range all {
					reads[i] = l.ReadKeysLocked()
					for _, k := range keys(l) {
						b.plant(k, true)
					}
				}
				w.Mu.Unlock()
				for i, l := range all {
					w.LeaveOutForeign(l, b, reads[i])
				}
				check(state)
			}
			check("at first")
			one := w.ProcessList()
			if one != "" {
				foreignAt("the client's wake list holds another program's value", func(*wait.Listener) []string { return []string{one} })
			}
			foreignAt("and every control list does too", func(l *wait.Listener) []string { return []string{l.Ctl} })
			foreignAt("and the new control lists too", func(l *wait.Listener) []string { return []string{l.Ctl} })
			if one != "" {
				b.plant(one, false)
				w.Mu.Lock()
				w.UseListsLocked(false) // what processListBack does once the value is gone
				w.Mu.Unlock()
				check("the client's wake list is free again")
				foreignAt("a control list holds another program's value, then the client's wake list", func(l *wait.Listener) []string { return []string{l.Ctl} })
				foreignAt("and the client's wake list", func(*wait.Listener) []string { return []string{one} })
			}
		})
	}
}
