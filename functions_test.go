package fairlock

// The two ways a client runs its scripts: as functions of a library it
// loads (FCALL, Redis 7.0 and later, Valkey) and as scripts (EVALSHA,
// EVAL) where functions are missing. Each test says which way ran, from
// what the client sent and what the server counted.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/script"
	"github.com/redis/go-redis/v9"
	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
)

// sent counts the commands a go-redis client sends, by name; those sent
// in pipelines (WithReplicaAck's) also as "pipe <name>".
type sent struct {
	mu sync.Mutex
	n  map[string]int
}

// countSent adds a counter to rdb and returns it with the Option that
// adds it to the blocking client of a Client built on rdb.
func countSent(rdb interface{ AddHook(redis.Hook) }) (*sent, Option) {
	s := &sent{n: map[string]int{}}
	return s, redistest.AddHook[Option](rdb, s)
}

func (s *sent) add(pipe bool, cmds ...redis.Cmder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cmds {
		name := c.Name()
		if name == "function" {
			name += " " + strings.ToLower(fmt.Sprint(c.Args()[1]))
		}
		if a := c.Args(); name == "fcall" || name == "evalsha" || name == "eval" {
			// And by op, the first ARGV, as "script:<op>".
			if nkeys, ok := a[2].(int); ok && 3+nkeys < len(a) {
				s.n[fmt.Sprint("script:", a[3+nkeys])]++
			}
		}
		s.n[name]++
		if pipe {
			s.n["pipe "+name]++
		}
	}
}

func (s *sent) get(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n[name]
}

func (s *sent) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { s.add(false, cmd); return next(ctx, cmd) }
}
func (s *sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { s.add(true, cmds...); return next(ctx, cmds) }
}

// noTransform runs the test's clients without the halfrun transform that
// TestMain sets, which would keep them on EVAL.
func noTransform(t *testing.T) { t.Cleanup(setTestTransform(nil)) }

// fnClient returns a client on rdb with a prefix of the test's own; with
// evalOnly it is forced onto EVAL, as on a Redis without functions.
func fnClient(t *testing.T, rdb RedisClient, evalOnly bool, opts ...Option) *Client {
	t.Helper()
	c, err := New(rdb, append([]Option{WithPrefix(redistest.Prefix(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	c.calls.Scripts.EvalOnly.Store(evalOnly)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// coreScenarios runs the engine's main behaviours on c: a grant, a busy
// TryAcquire, a queued waiter granted on release with a later token,
// renewals, several semaphores at once, Status.
func coreScenarios(t *testing.T, c *Client) {
	t.Helper()
	ctx := context.Background()
	mutex := Request{Name: "core", Capacity: 1, Permits: 1}
	held, err := c.Acquire(ctx, mutex)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := c.TryAcquire(ctx, mutex); !errors.Is(err, ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held mutex = %v, want ErrNotAcquired", err)
	}
	got := make(chan *Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := c.Acquire(ctx, mutex)
		if err != nil {
			errc <- err
			return
		}
		got <- l
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := c.Status(ctx, "core")
		if err != nil {
			t.Fatalf("Status: %v", err)
		}
		if st.Queued == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the waiter did not queue: %+v", st)
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case l := <-got:
		if l.Token() <= held.Token() {
			t.Fatalf("waiter's token %d after %d", l.Token(), held.Token())
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("waiter's Release: %v", err)
		}
	case err := <-errc:
		t.Fatalf("waiter: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not granted")
	}
	both, err := c.AcquireAll(ctx, Request{Name: "{pair}:a", Capacity: 2, Permits: 1}, Request{Name: "{pair}:b", Capacity: 3, Permits: 2})
	if err != nil {
		t.Fatalf("AcquireAll: %v", err)
	}
	if err := both.Release(ctx); err != nil {
		t.Fatalf("AcquireAll's Release: %v", err)
	}
}

// renewOnce holds a lease until it has been renewed at least once, as s
// (c's client's commands) shows.
func renewOnce(t *testing.T, c *Client, s *sent) {
	t.Helper()
	ctx := context.Background()
	l, err := c.Acquire(ctx, Request{Name: "renewed", Capacity: 1, Permits: 1})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.get("script:renew")+s.get("script:renew_batch") == 0 {
		if err := l.Err(); err != nil {
			// (A process starved of CPU past the lease's deadline ends
			// it without sending a renewal.)
			t.Fatalf("lease lost before its first renewal: %v", err)
		}
		if time.Now().After(deadline) {
			// (Seen once on a machine at load 13, the lease still live by
			// Err: what the lease believed is logged to find out why.)
			l.rmu.Lock()
			until, announced, stopped := time.Until(l.deadline), l.announced, l.stopped
			l.rmu.Unlock()
			t.Fatalf("no renewal within 10s: %v; the lease: granted %v ago, its deadline in %v, announced %v, stopped %v, TTL %v",
				s.n, time.Since(l.granted).Round(time.Millisecond), until.Round(time.Millisecond), announced, stopped, l.p.ttl(c))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := l.Err(); err != nil {
		t.Fatalf("lease lost while renewed: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release after renewals: %v", err)
	}
}

// commandCalls reads INFO commandstats: calls per command ("fcall",
// "evalsha", ...).
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		out[name], _ = strconv.Atoi(calls)
	}
	return out
}

// The main behaviours on a real server, once through the function library
// and once forced onto EVAL; each run uses its own path only, as the
// client sent it and as the server counted it.
func TestScriptPaths(t *testing.T) {
	b := redistest.RealBackend(t)
	noTransform(t)
	admin := b.Client(t)
	for _, tc := range []struct {
		name     string
		evalOnly bool
		used     string   // the command that must have run the scripts
		unused   []string // commands that must not have
	}{
		{"functions", false, "fcall", []string{"evalsha", "eval"}},
		{"eval", true, "evalsha", []string{"fcall", "function load"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := b.Client(t)
			s, counted := countSent(rdb)
			c := fnClient(t, rdb, tc.evalOnly, counted, WithLeaseTTL(time.Second))
			// A first call loads what the server lacks (a NOSCRIPT or a
			// missing function is not counted as a call by every server).
			if _, err := c.Status(context.Background(), "warm"); err != nil {
				t.Fatal(err)
			}
			before, sentBefore := commandCalls(t, admin), s.get(tc.used)
			coreScenarios(t, c)
			renewOnce(t, c, s)
			after := commandCalls(t, admin)
			if s.get(tc.used) == sentBefore {
				t.Fatalf("client sent no %s: %v", tc.used, s.n)
			}
			// A call whose context ended before it was written is counted
			// here and never reaches the server: the server need only
			// have run some.
			if d := after[tc.used] - before[tc.used]; d == 0 {
				t.Fatalf("server counted no %s calls; client sent %d", tc.used, s.get(tc.used)-sentBefore)
			}
			for _, u := range tc.unused {
				if n := s.get(u); n != 0 {
					t.Fatalf("client sent %d %s: %v", n, u, s.n)
				}
			}
			if !tc.evalOnly {
				// Other tests of this binary run EVAL (halfrun's
				// transform), never FCALL.
				return
			}
			if d := after["fcall"] - before["fcall"]; d != 0 {
				t.Fatalf("server ran %d FCALLs during the EVAL run", d)
			}
		})
	}
}

// On miniredis (no FCALL) the client tries FCALL once, then runs EVALSHA
// for good.
func TestScriptPathWithoutFunctions(t *testing.T) {
	b := redistest.Mini(t)
	noTransform(t)
	rdb := b.Client(t)
	s, counted := countSent(rdb)
	c := fnClient(t, rdb, false, counted)
	coreScenarios(t, c)
	if n := s.get("fcall"); n != 1 {
		t.Fatalf("client sent %d FCALLs to a Redis without them, want 1: %v", n, s.n)
	}
	if s.get("evalsha") == 0 || s.get("function load") != 0 {
		t.Fatalf("commands sent: %v, want EVALSHA and no FUNCTION LOAD", s.n)
	}
	if !c.calls.Scripts.EvalOnly.Load() {
		t.Fatal("the client did not settle on EVAL")
	}
}

// Concurrent first calls learn the server's forms once. On miniredis (no
// functions, no script flags, the script not cached yet) each of a
// hundred first acquisitions sent FCALL, then EVALSHA and EVAL of the
// flagged source, then EVALSHA and EVAL of the plain one: five commands,
// two of them the script's whole source. One call goes first; the others
// then send one EVALSHA each.
func TestFirstCallsLearnTheFormsOnce(t *testing.T) {
	b := redistest.Mini(t)
	noTransform(t)
	rdb := b.Client(t)
	s, counted := countSent(rdb)
	c := fnClient(t, rdb, false, counted)
	// (Under the race detector on a busy machine, the first call's five
	// commands took longer than FirstCallWait.)
	c.calls.Scripts.SetFirstCallWait(time.Minute)
	const n = 100
	ctx := context.Background()
	leases := make(chan *Lease, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			l, err := c.Acquire(ctx, Request{Name: "herd", Capacity: n, Permits: 1})
			if err != nil {
				t.Error(err)
				return
			}
			leases <- l
		})
	}
	wg.Wait()
	close(leases)
	for l := range leases {
		wg.Go(func() {
			if err := l.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	// Two entries ran (acquire and release), each first learning its
	// forms: one FCALL in all, at most two EVALs each.
	if f, e, sha := s.get("fcall"), s.get("eval"), s.get("evalsha"); f != 1 || e > 4 || sha > 2*n+4 {
		t.Fatalf("%d first acquisitions and their releases sent %d FCALL, %d EVAL, %d EVALSHA; want 1, at most 4, at most %d: %v", n, f, e, sha, 2*n+4, s.n)
	}
}

// The library comes back wherever it went missing, and versions of it
// live side by side.
func TestFunctionLibraryRecovers(t *testing.T) {
	b := redistest.RealBackend(t)
	noTransform(t)
	ctx := context.Background()
	admin := b.Client(t)
	rdb := b.Client(t)
	s, counted := countSent(rdb)
	c := fnClient(t, rdb, false, counted)
	acquire := func(what string) {
		t.Helper()
		l, err := c.Acquire(ctx, Request{Name: "back", Capacity: 1, Permits: 1})
		if err != nil {
			t.Fatalf("Acquire %s: %v", what, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release %s: %v", what, err)
		}
	}
	libraries := func() []string {
		t.Helper()
		libs, err := admin.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "fairlock_*"}).Result()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, l := range libs {
			names = append(names, l.Name)
		}
		return names
	}
	has := func(name string) bool {
		for _, n := range libraries() {
			if n == name {
				return true
			}
		}
		return false
	}
	acquire("first")
	if !has(c.calls.Scripts.Lib.Name) {
		t.Fatalf("libraries %v, want %s", libraries(), c.calls.Scripts.Lib.Name)
	}

	// Another fairlock version's library (a rolling upgrade): each client
	// loads its own, and neither replaces the other.
	other := &script.Set{Lib: script.NewLibrary(script.Entries, changed("queue.lua", "\n-- another version"))}
	for i, s := range c.calls.Scripts.List {
		other.List = append(other.List, &script.Script{Set: other, Forms: script.Forms{Eval: s.Eval, Fn: other.Lib.Fns[script.Entries[i].Name]}})
	}
	oc := fnClient(t, b.Client(t), false)
	oc.calls.Scripts = other
	coreScenarios(t, oc)
	acquire("beside another version")
	if !has(c.calls.Scripts.Lib.Name) || !has(other.Lib.Name) {
		t.Fatalf("libraries %v, want both %s and %s", libraries(), c.calls.Scripts.Lib.Name, other.Lib.Name)
	}
	if other.EvalOnly.Load() || c.calls.Scripts.EvalOnly.Load() {
		t.Fatal("a client fell back to EVAL beside another version")
	}

	// An operator flushes the functions, or deletes fairlock's library.
	for _, wipe := range []func() error{
		func() error { return admin.FunctionFlush(ctx).Err() },
		func() error { return admin.FunctionDelete(ctx, c.calls.Scripts.Lib.Name).Err() },
	} {
		if err := wipe(); err != nil {
			t.Fatal(err)
		}
		loads := s.get("function load")
		acquire("after the library was removed")
		if s.get("function load") != loads+1 {
			t.Fatalf("FUNCTION LOADs %d, want one more than %d", s.get("function load"), loads)
		}
		if !has(c.calls.Scripts.Lib.Name) {
			t.Fatalf("library not loaded again: %v", libraries())
		}
	}
	if c.calls.Scripts.EvalOnly.Load() || s.get("evalsha") != 0 {
		t.Fatalf("the client left functions: %v", s.n)
	}
}

// Where the library cannot be used (it does not load, or the user may not
// run FCALL), the client runs EVAL from then on.
func TestFunctionLibraryRefused(t *testing.T) {
	b := redistest.RealBackend(t)
	noTransform(t)
	ctx := context.Background()

	t.Run("does not load", func(t *testing.T) {
		rdb := b.Client(t)
		s, counted := countSent(rdb)
		c := fnClient(t, rdb, false, counted)
		broken := script.NewLibrary(script.Entries, changed("queue.lua", "\nlocal = 1"))
		c.calls.Scripts.Lib = broken
		for i, s := range c.calls.Scripts.List {
			s.Fn = broken.Fns[script.Entries[i].Name]
		}
		coreScenarios(t, c)
		if !c.calls.Scripts.EvalOnly.Load() || s.get("function load") != 1 || s.get("fcall") != 1 {
			t.Fatalf("evalOnly %v after %v, want one FCALL, one FUNCTION LOAD, then EVAL", c.calls.Scripts.EvalOnly.Load(), s.n)
		}
	})

	t.Run("no FCALL for this user", func(t *testing.T) {
		admin := b.Client(t)
		const user = "fairlock-no-fcall"
		if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-fcall").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { admin.Do(ctx, "ACL", "DELUSER", user) })
		rdb := b.Client(t, func(o *redis.Options) { o.Username, o.Password = user, "pw" })
		s, counted := countSent(rdb)
		c := fnClient(t, rdb, false, counted)
		coreScenarios(t, c)
		if !c.calls.Scripts.EvalOnly.Load() || s.get("fcall") != 1 {
			t.Fatalf("evalOnly %v after %v, want one FCALL, then EVAL", c.calls.Scripts.EvalOnly.Load(), s.n)
		}
	})
}

// changed returns a reader of the scripts' sources that appends more to
// file.
func changed(file, more string) func(string) string {
	return func(f string) string {
		if f == file {
			return script.Source(f) + more
		}
		return script.Source(f)
	}
}

// A full Redis (maxmemory reached, noeviction) keeps its locks: leases are
// renewed for four times their TTL (a dozen renewals) and released, a queued waiter stays
// alive and is granted, through FCALL and through EVAL alike, while a new
// request is refused at once.
func TestFullRedisKeepsLocks(t *testing.T) {
	redistest.Long(t)        // waits on real time for seconds: the full suite
	redistest.RealBackend(t) // a real server, or a failure under CI=true
	noTransform(t)
	for _, evalOnly := range []bool{false, true} {
		t.Run(fmt.Sprintf("evalOnly=%v", evalOnly), func(t *testing.T) {
			srv, err := redisserver.Start("--maxmemory-policy", "noeviction")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Stop)
			ctx := context.Background()
			rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
			t.Cleanup(func() { _ = rdb.Close() })
			// Renewals every third of a second: a lease is lost only if
			// this process cannot run for about 0.7 s, which a busy
			// machine's scheduler was seen to cause with 400 ms leases.
			const ttl = time.Second
			c := fnClient(t, rdb, evalOnly, WithLeaseTTL(ttl), WithWaiterTTL(ttl))
			req := Request{Name: "full", Capacity: 2, Permits: 1}
			var held []*Lease
			for range 2 {
				l, err := c.Acquire(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, l)
			}
			waiter := make(chan error, 1)
			go func() {
				l, err := c.Acquire(ctx, req)
				if err == nil {
					held = append(held, l)
				}
				waiter <- err
			}()
			waitQueued(t, c, "full", 1)
			if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
			if err := rdb.Set(ctx, "junk", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM") {
				t.Fatalf("a write with maxmemory 1 = %v, want OOM", err)
			}
			start := time.Now()
			_, err = c.TryAcquire(ctx, Request{Name: "new", Capacity: 1, Permits: 1})
			if !errors.Is(err, ErrRedis) || !strings.Contains(err.Error(), "OOM") {
				t.Errorf("a new request under OOM = %v, want ErrRedis saying OOM", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("the new request was refused after %v, want at once", d)
			}
			time.Sleep(4 * ttl) // renewals and the waiter's refreshes run
			for i, l := range held[:2] {
				if err := l.Err(); err != nil {
					t.Fatalf("lease %d lost under OOM: %v", i, err)
				}
			}
			if err := held[0].Release(ctx); err != nil {
				t.Fatalf("Release under OOM: %v", err)
			}
			select {
			case err := <-waiter:
				if err != nil {
					t.Fatalf("the queued waiter under OOM: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the queued waiter was not granted under OOM")
			}
			if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			st, err := c.Status(ctx, "full")
			if err != nil || st.InUse != 2 || st.Held != 2 || st.Queued != 0 {
				t.Fatalf("Status after: in use %d, held %d, queued %d (%v); want 2, 2, 0", st.InUse, st.Held, st.Queued, err)
			}
			if !evalOnly && c.calls.Scripts.EvalOnly.Load() {
				t.Fatal("the client fell back to EVAL")
			}
		})
	}
}

// waitQueued waits until n requests queue for name.
func waitQueued(t *testing.T, c *Client, name string, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if st, err := c.Status(context.Background(), name); err == nil && st.Queued == n {
			return
		}
	}
	t.Fatalf("%d requests did not queue for %q", n, name)
}

// luaMaxLocals is Lua 5.1's limit of local variables in one function
// (LUAI_MAXVARS): the function library defines the whole prelude, and
// each entry file's body as a local of a block of its own, inside one
// function (define), and an EVAL script is one chunk.
const luaMaxLocals = 200

// preludeLocals counts the names the prelude declares at its top level
// ("local a, b = ...", "local function f").
func preludeLocals(src string) int {
	n := 0
	for _, line := range strings.Split(src, "\n") {
		rest, ok := strings.CutPrefix(line, "local ")
		if !ok {
			continue
		}
		if strings.HasPrefix(rest, "function ") {
			n++
			continue
		}
		rest, _, _ = strings.Cut(rest, "--")
		rest, _, _ = strings.Cut(rest, "=")
		n += len(strings.Split(rest, ","))
	}
	return n
}

// The scripts stay clear of Lua's limit of locals in one function, with
// room for a few more definitions: past it, no script compiles. When this
// fails, group a file's definitions into a module table (one local).
func TestPreludeLocalsLeaveRoom(t *testing.T) {
	// Each entry's body is a local of a block of its own: one at a time.
	n := preludeLocals(script.Prelude(script.Source)) + 1
	t.Logf("%d locals in the function library's define (Lua's limit: %d)", n, luaMaxLocals)
	if n > luaMaxLocals-20 {
		t.Errorf("%d top-level locals in the prelude and the entries' bodies; Lua refuses more than %d in one function", n, luaMaxLocals)
	}
	// The counter's own example. (Checked against Redis 7.4.1: the library
	// loads with the prelude padded to 200 locals, and FUNCTION LOAD
	// refuses it at 201, "function at line 3 has more than 200 local
	// variables".)
	if got := preludeLocals("local a, b = 1, 2 -- x, y\nlocal function f() end\n  local inner = 1\nlocal c"); got != 4 {
		t.Errorf("preludeLocals counts %d in its own example, want 4", got)
	}
}

// luaMaxUpvalues is Lua 5.1's limit of the enclosing functions' locals
// that one function may use (LUAI_MAXUPVALUES). Checked against Redis
// 7.0.15: EVAL compiles a function that adds 60 outer locals, and refuses
// one that adds 61, "function at line 62 has more than 60 upvalues".
const luaMaxUpvalues = 60

// maxUpvalues returns the function of proto (proto itself or one nested
// in it, at any depth) that uses the most upvalues, by the line it starts
// on, and how many it uses.
func maxUpvalues(proto *lua.FunctionProto) (line, n int) {
	line, n = proto.LineDefined, int(proto.NumUpvalues)
	for _, p := range proto.FunctionPrototypes {
		if l, m := maxUpvalues(p); m > n {
			line, n = l, m
		}
	}
	return line, n
}

// TestScriptsUpvaluesLeaveRoom compiles every entry's script, in its EVAL
// and its batch form, and fails when a function in it uses more of its
// enclosing functions' locals than Lua 5.1 lets it: a server's Lua would
// refuse every script, while miniredis's (gopher-lua, which has no such
// limit) would run them all. A function within a few of the limit is
// named in the log: the hot paths gather many of the prelude's helpers.
func TestScriptsUpvaluesLeaveRoom(t *testing.T) {
	compile := func(t *testing.T, name, src string) *lua.FunctionProto {
		t.Helper()
		chunk, err := parse.Parse(strings.NewReader(src), name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		proto, err := lua.Compile(chunk, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return proto
	}
	// The prelude's functions come first in every script, at the same
	// lines: each is reported once.
	most, seen := 0, map[int]bool{}
	for _, e := range script.Entries {
		for form, src := range map[string]string{"eval": script.ScriptSource(e), "batch": script.BatchSource(e)} {
			line, n := maxUpvalues(compile(t, e.Name, src))
			most = max(most, n)
			switch {
			case n > luaMaxUpvalues:
				t.Errorf("entry %s (%s form): the function at line %d uses %d upvalues; Lua refuses more than %d", e.Name, form, line, n, luaMaxUpvalues)
			case n > luaMaxUpvalues-4 && !seen[line]:
				seen[line] = true
				t.Logf("the function at line %d of entry %s's script uses %d of Lua's %d upvalues", line, e.Name, n, luaMaxUpvalues)
			}
		}
	}
	t.Logf("the most upvalues any function of the scripts uses: %d (Lua's limit: %d)", most, luaMaxUpvalues)
	// The counter's own example: g uses a and b; f uses a, b (for g) and c.
	_, n := maxUpvalues(compile(t, "example", "local a, b, c = 1, 2, 3\nlocal function f() local function g() return a + b end return g() + c end\nreturn f()"))
	if n != 3 {
		t.Errorf("maxUpvalues counts %d in its own example, want 3", n)
	}
}
