package fairlock

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed queue.lua
	queueLua string
	//go:embed acquire.lua
	acquireLua string
	//go:embed release.lua
	releaseLua string
)

// scripts are the engine's two scripts as one client runs them. Both start
// with queue.lua, the shared model and grant rule. Each runs as a function
// of a library loaded once per Redis (FCALL, see functions.go) where the
// server has functions, and otherwise through Script.Run: EVALSHA, falling
// back to EVAL after SCRIPT FLUSH or on a Redis that has not seen it yet.
// A Client has its own scripts, since what it learns of its Redis (that
// functions are missing) holds for that Redis only.
type scripts struct {
	acquire, release *script
	lib              *library // nil: EVAL only (a test transform is set)
	// evalOnly is set for good once the Redis showed it cannot run the
	// library (no FCALL, or the library does not load there).
	evalOnly atomic.Bool
	loadMu   sync.Mutex    // one load at a time
	loads    atomic.Uint64 // loads done
}

// load loads the library where rdb may need it (see library.load). Calls
// that find it missing together load it once: a call that waited for
// another's load takes that one as its own.
func (set *scripts) load(ctx context.Context, rdb RedisClient) loadResult {
	seen := set.loads.Load()
	set.loadMu.Lock()
	defer set.loadMu.Unlock()
	if set.loads.Load() != seen {
		return loadOK
	}
	r := set.lib.load(ctx, rdb)
	if r == loadOK {
		set.loads.Add(1)
	}
	return r
}

// script is one of a client's scripts: its EVAL form and the name of its
// function in the library.
type script struct {
	set  *scripts
	eval *redis.Script
	fn   string
}

// code is what scripts are made of, built once per transform.
type code struct {
	acquire, release *redis.Script
	lib              *library
}

func newCode(transform func(string) string) *code {
	if transform == nil {
		return &code{
			acquire: redis.NewScript(queueLua + "\n" + acquireLua),
			release: redis.NewScript(queueLua + "\n" + releaseLua),
			lib:     newLibrary(queueLua, acquireLua, releaseLua),
		}
	}
	// The test transforms (internal/halfrun, broken rules) rewrite EVAL
	// sources, so a transformed client runs EVAL only.
	return &code{
		acquire: redis.NewScript(transform(queueLua + "\n" + acquireLua)),
		release: redis.NewScript(transform(queueLua + "\n" + releaseLua)),
	}
}

// defaultCode serves every client made while no test hook is set.
var defaultCode = newCode(nil)

// newScripts returns a client's scripts, passing each source through
// transform when it is not nil (tests only; see internal/scripthook).
func newScripts(transform func(string) string) *scripts {
	k := defaultCode
	if transform != nil {
		k = newCode(transform)
	}
	s := &scripts{lib: k.lib}
	s.acquire = &script{set: s, eval: k.acquire}
	s.release = &script{set: s, eval: k.release}
	if k.lib != nil {
		s.acquire.fn, s.release.fn = k.lib.acquire, k.lib.release
	}
	return s
}

// Run runs s on rdb with keys and args and returns its reply.
func (s *script) Run(ctx context.Context, rdb RedisClient, keys []string, args ...any) *redis.Cmd {
	return s.run(ctx, rdb, func(send func(redis.Scripter) *redis.Cmd) *redis.Cmd { return send(rdb) }, keys, args)
}

// run is the one place where a script runs, whatever the path. exec sends
// the one command send makes, on rdb itself or in a pipeline (with a WAIT
// after it on the same connection; see Client.run), and returns it.
//
// With functions: FCALL; a Redis without the library (a new server, FUNCTION
// FLUSH, a Cluster slot's new owner) gets it loaded, and the call is sent
// again, as EVAL if FCALL still finds no function. A Redis without FCALL
// (miniredis, Redis 6.2) or on which the library does not load makes the
// client use EVAL from then on. A failed FCALL ran nothing, so sending the
// call again cannot apply it twice.
func (s *script) run(ctx context.Context, rdb RedisClient, exec func(func(redis.Scripter) *redis.Cmd) *redis.Cmd, keys []string, args []any) *redis.Cmd {
	set := s.set
	if set.lib != nil && !set.evalOnly.Load() && canLoad(rdb) {
		fcall := func(on redis.Scripter) *redis.Cmd {
			return on.(fcaller).FCall(ctx, s.fn, keys, args...)
		}
		cmd := exec(fcall)
		switch fcallFailure(cmd.Err()) {
		case fnRan:
			return cmd
		case fnMissing:
			switch set.load(ctx, rdb) {
			case loadOK:
				if cmd = exec(fcall); fcallFailure(cmd.Err()) != fnMissing {
					return cmd
				}
			case loadRefused:
				set.evalOnly.Store(true)
			}
		case fnUnsupported:
			set.evalOnly.Store(true)
		}
	}
	cmd := exec(func(on redis.Scripter) *redis.Cmd { return s.eval.EvalSha(ctx, on, keys, args...) })
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd = exec(func(on redis.Scripter) *redis.Cmd { return s.eval.Eval(ctx, on, keys, args...) })
	}
	return cmd
}

// nudgeScript pushes an empty wake-up onto a wake list, to end a blocked
// BLPOP at once when a client closes. It changes no semaphore state.
var nudgeScript = redis.NewScript(`redis.call('RPUSH', KEYS[1], '')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1`)

// labelOf names one semaphore ("a") or several (["a" "b"]) in messages.
func labelOf(names []string) string {
	if len(names) == 1 {
		return strconv.Quote(names[0])
	}
	return fmt.Sprintf("%q", names)
}

// clockSample relates Redis's clock to the local one: a script that
// reported Redis's time redis was sent at local time sent, so Redis's
// moment redis came no earlier than sent.
type clockSample struct {
	sent  time.Time
	redis int64 // ms
}

// localDeadline returns a local time no later than the moment Redis's
// clock reaches at (ms), by s: so a lease counted to it ends, locally,
// before Redis can have expired it.
func (s clockSample) localDeadline(at int64) time.Time {
	return s.sent.Add(time.Duration(at-s.redis) * time.Millisecond)
}
