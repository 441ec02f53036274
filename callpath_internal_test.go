package fairlock

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/ops"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/redis/go-redis/v9"
)

// go-redis is sent the arguments a Script names, whatever the engine boxed
// beforehand: a call whose boxed arguments (opCall.argv) differ from its
// Args in any way is sent as its Args.
func TestBoxedArgumentsAreTheArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []any
		args []string
		same bool
	}{
		{"equal", []any{"a", "1"}, []string{"a", "1"}, true},
		{"none", nil, nil, true},
		{"shorter", []any{"a"}, []string{"a", "1"}, false},
		{"longer", []any{"a", "1", "2"}, []string{"a", "1"}, false},
		{"a value differs", []any{"a", "2"}, []string{"a", "1"}, false},
		{"not a string", []any{"a", 1}, []string{"a", "1"}, false},
		{"missing", nil, []string{"a"}, false},
	} {
		if got := sameArgs(tc.argv, tc.args); got != tc.same {
			t.Errorf("%s: sameArgs(%q, %q) = %v, want %v", tc.name, tc.argv, tc.args, got, tc.same)
		}
	}

	// Every call the engine builds boxes its arguments as they are.
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	c, err := New(rdb, WithPrefix("p:"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	one, err := c.plan([]Request{{Name: "a", Capacity: 3, Permits: 2}})
	if err != nil {
		t.Fatal(err)
	}
	two, err := c.plan([]Request{{Name: "{x}:a", Capacity: 3, Permits: 2}, {Name: "{x}:b", Capacity: 1, Permits: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []plan{one, two} {
		tokens := make([]int64, len(p.parts))
		for i := range tokens {
			tokens[i] = int64(7 + i)
		}
		for name, oc := range map[string]script.Call{
			"acquire":         p.acquireCall(script.OpAcquire, "t1", nil, c),
			"try":             p.acquireCall(script.OpTry, "t1", nil, c),
			"release":         p.releaseCall(script.OpRelease, "t1", c, false, tokens),
			"leave announced": p.releaseCall(script.OpLeave, "t1", c, true, nil),
			"renew at a cap":  p.releaseCallTTL(script.OpRenew, "t1", c, false, tokens, time.Second),
			"wait":            p.waitCall(p, "t1", c, false, tokens, "t2", "cond"),
			"pump":            ops.PumpCall(p.keys),
		} {
			if !sameArgs(oc.Argv, oc.Args) {
				t.Errorf("%s on %v: boxed %q, arguments %q", name, p.names, oc.Argv, oc.Args)
			}
		}
	}
}

// The goroutines that run the client's background tasks (spawn's
// workers) end when the client closes, though they would wait for the
// next task far longer; and Close waits for the tasks under way.
func TestSpawnWorkersEndAtClose(t *testing.T) {
	defer workerIdle.Store(workerIdle.Load())
	workerIdle.Store(int64(time.Hour))
	rdb := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer rdb.Close()
	c, err := New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var done atomic.Int32
	for range 3 {
		c.spawn(func() { done.Add(1) })
	}
	c.spawn(func() { <-release; done.Add(1) })
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if n := done.Load(); n != 4 {
		t.Errorf("Close returned with %d of 4 tasks done", n)
	}
	// Each worker ends once it sees the client closed: wait for that.
	for deadline := time.Now().Add(10 * time.Second); c.workers.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers still wait for a task 10 s after Close", c.workers.Load())
		}
	}
}
