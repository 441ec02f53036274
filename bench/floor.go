package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// floorLib holds functions that do only the Redis commands a script-based
// lock with fairlock's guarantees cannot do without, and nothing else: what
// a script costs before any logic of its own. The acquire and release replay
// fairlock's uncontended fast paths (lua/fast.lua, key layout 3): the lease
// is kept in the state hash (fields o and oe) and its member is its record,
// so an acquire reads Redis's clock and the state (HMGET of its 13 fields,
// the process's liveness field, the ticket and zq) and writes the state
// (HSET: the counts, the sequence, the lease); a release reads the same
// and deletes the fields it empties (HDEL: the counts that fall to 0, the
// lease; no tombstone).
const floorLib = `#!lua name=fairlock_bench_floor
redis.register_function('fairlock_floor_empty', function(k, a) return 1 end)
redis.register_function('fairlock_floor_acquire', function(k, a)
  local t = redis.call('TIME')
  redis.call('HMGET', k[1], 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'nc', 'layout', 'o', 'oe', 'lmin', 'lP', a[1], 'zq')
  redis.call('HSET', k[1], 'used', 1, 'nh', 1, 'seq', t[2], 'o', a[1], 'oe', t[1])
  return {1, t[1], t[2]}
end)
redis.register_function('fairlock_floor_release', function(k, a)
  redis.call('TIME')
  redis.call('HMGET', k[1], 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'nc', 'layout', 'o', 'oe', 'lmin', 'lP', a[1], 'zq')
  redis.call('HDEL', k[1], 'nh', 'used', 'o', 'oe')
  return {1, 0}
end)
redis.register_function('fairlock_floor_least_acquire', function(k, a)
  local t = redis.call('TIME')
  redis.call('HMGET', k[1], 'used', 'nq', 'seq', a[1])
  redis.call('HSET', k[1], 'used', 1, 'seq', t[2], a[1], t[2])
  return {1, t[1], t[2]}
end)
redis.register_function('fairlock_floor_least_release', function(k, a)
  local t = redis.call('TIME')
  redis.call('HMGET', k[1], 'used', 'nq', 'seq', a[1])
  redis.call('HSET', k[1], 'used', 0, a[1], 'r')
  return {1, 0}
end)
redis.register_function('fairlock_floor_time_rpush', function(k, a)
  redis.call('TIME')
  return redis.call('RPUSH', k[1], a[1])
end)
redis.register_function('fairlock_floor_handoff', function(k, a)
  local t = redis.call('TIME')
  redis.call('HMGET', k[1], 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'nc', 'layout', 'o', 'oe', 'lmin', 'lP', a[1], 'zq')
  redis.call('ZPOPMIN', k[2])
  redis.call('RPUSH', k[4], a[2])
  redis.call('HSET', k[1], 'nq', 1, 'seq', t[2], 'o', a[2], 'oe', t[1])
  redis.call('PEXPIRE', k[4], 3000)
  return {1, 0}
end)`

// floorLocker "locks" with a pair of the floor's acquire and release
// functions: what a lock that runs one script per operation costs Redis at
// the least.
type floorLocker struct {
	rdb              *redis.Client
	keys             []string
	acquire, release string // function names
}

func (f *floorLocker) lock(ctx context.Context, _ string) (func(context.Context) error, error) {
	if err := f.rdb.FCall(ctx, f.acquire, f.keys, "TICKET").Err(); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		return f.rdb.FCall(ctx, f.release, f.keys, "TICKET").Err()
	}, nil
}

func (f *floorLocker) lockBoth(ctx context.Context, a, _ string) (func(context.Context) error, error) {
	return f.lock(ctx, a)
}

func (f *floorLocker) close() {}

// floor measures, on a real server with functions, the latency of calls that
// bound what a script-based lock can reach: PING, an empty function, and
// functions doing only an uncontended acquire's and a release's commands.
func floor(e *env) ([]*Table, []Target, error) {
	t := &Table{Name: "floor", Title: "8. The floor: what a script costs before its logic",
		Note:    "Functions doing only the commands a lock that keeps fairlock's guarantees needs (Redis's clock, the state read, the state written: fairlock's uncontended acquire and release, whose lease the state hash holds; the least script lock's reads and writes fewer fields), and nothing else; calls interleaved, p50 of each. Real servers with functions (Redis 7+, Valkey) only.",
		Columns: []string{"call", "p50", "÷ PING p50", "samples"}}
	na := func(why string) ([]*Table, []Target, error) {
		t.Note = why
		t.Data = append(t.Data, map[string]any{"call": "n/a", "why": why})
		return []*Table{t}, nil, nil
	}
	if !e.real {
		return na("Not measured on the embedded miniredis, which has no functions: run with -redis auto.")
	}
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: e.addr})
	defer rdb.Close()
	if err := rdb.FunctionLoadReplace(ctx, floorLib).Err(); err != nil {
		if strings.Contains(strings.ToLower(err.Error()), "unknown command") {
			return na("n/a: this server has no functions")
		}
		return nil, nil, err
	}
	defer rdb.FunctionDelete(ctx, "fairlock_bench_floor")
	keys := []string{e.run + "{floor}:s"}
	calls := []struct {
		name string
		do   func() error
	}{
		{"PING", func() error { return rdb.Ping(ctx).Err() }},
		{"FCALL of an empty function", func() error { return rdb.FCall(ctx, "fairlock_floor_empty", nil).Err() }},
		{"FCALL: TIME, HMGET, HSET (an uncontended acquire's commands)", func() error {
			return rdb.FCall(ctx, "fairlock_floor_acquire", keys, "TICKET").Err()
		}},
		{"FCALL: TIME, HMGET, HDEL (a release's commands)", func() error {
			return rdb.FCall(ctx, "fairlock_floor_release", keys, "TICKET").Err()
		}},
		{"FCALL: TIME, HMGET, HSET (the least script lock's acquire)", func() error {
			return rdb.FCall(ctx, "fairlock_floor_least_acquire", keys, "TICKET").Err()
		}},
	}
	lat := make([][]time.Duration, len(calls))
	deadline := time.Now().Add(e.cfg.duration)
	for round := 0; round < 5 || time.Now().Before(deadline); round++ {
		for i, c := range calls {
			for range 50 {
				t0 := time.Now()
				if err := c.do(); err != nil {
					return nil, nil, fmt.Errorf("floor: %s: %w", c.name, err)
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		}
	}
	ping := quantile(lat[0], 0.5)
	for i, c := range calls {
		p := quantile(lat[i], 0.5)
		r := float64(p) / float64(ping)
		t.Rows = append(t.Rows, []string{c.name, us(p), f2(r), fmt.Sprint(len(lat[i]))})
		t.Data = append(t.Data, map[string]any{"call": c.name, "p50_us": micros(p), "per_ping": r, "samples": len(lat[i])})
	}
	hand, err := e.floorHandoff(rdb)
	if err != nil {
		return nil, nil, err
	}
	return []*Table{t, hand}, nil, nil
}

// floorHandoff measures a handoff's floor: after 20 ms of silence, a call
// that wakes a client blocked in BLMPOP, from the call's start to the
// blocked client's return, as table 2 measures a handoff: a bare RPUSH,
// and a function doing a handing release's commands (its RPUSH among
// them). Each against an idle PING.
func (e *env) floorHandoff(rdb *redis.Client) (*Table, error) {
	ctx := context.Background()
	const idle = 20 * time.Millisecond
	t := &Table{Name: "floor_handoff", Title: "8b. The floor of a handoff",
		Note:    fmt.Sprintf("After %v of silence, a call wakes a client blocked in BLMPOP; measured from the call's start to the blocked client's return on its goroutine, as table 2 measures a handoff. TIME + RPUSH is the least a script that hands a lock on by push can do (it must read Redis's clock to judge leases). The handing-release function does a handing release's commands (TIME, HMGET, ZPOPMIN, RPUSH, HSET, PEXPIRE) and nothing else; calls interleaved.", idle),
		Columns: []string{"call", "p50", "÷ idle-PING p50", "samples"}}
	waiter := redis.NewClient(&redis.Options{Addr: e.addr})
	defer waiter.Close()
	k := e.run + "{floorh}:"
	list := k + "w"
	keys := []string{k + "s", k + "q", k + "d", list}
	wake := func(call func() error) (time.Duration, error) {
		got := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			_, _, err := waiter.BLMPop(ctx, 0, "left", 1, list).Result()
			got <- time.Now()
			errc <- err
		}()
		time.Sleep(idle)
		t0 := time.Now()
		if err := call(); err != nil {
			return 0, err
		}
		t1 := <-got
		return t1.Sub(t0), <-errc
	}
	calls := []struct {
		name string
		do   func() (time.Duration, error)
	}{
		{"idle PING", func() (time.Duration, error) {
			time.Sleep(idle)
			t0 := time.Now()
			err := rdb.Ping(ctx).Err()
			return time.Since(t0), err
		}},
		{"RPUSH → BLMPOP", func() (time.Duration, error) {
			return wake(func() error { return rdb.RPush(ctx, list, "x").Err() })
		}},
		{"FCALL: TIME + RPUSH → BLMPOP", func() (time.Duration, error) {
			return wake(func() error { return rdb.FCall(ctx, "fairlock_floor_time_rpush", []string{list}, "x").Err() })
		}},
		{"FCALL of a handing release's commands → BLMPOP", func() (time.Duration, error) {
			return wake(func() error { return rdb.FCall(ctx, "fairlock_floor_handoff", keys, "A", "B").Err() })
		}},
	}
	lat := make([][]time.Duration, len(calls))
	deadline := time.Now().Add(e.cfg.duration)
	for round := 0; round < 10 || time.Now().Before(deadline); round++ {
		for i, c := range calls {
			d, err := c.do()
			if err != nil {
				return nil, fmt.Errorf("floor handoff: %s: %w", c.name, err)
			}
			lat[i] = append(lat[i], d)
		}
	}
	ping := quantile(lat[0], 0.5)
	for i, c := range calls {
		p := quantile(lat[i], 0.5)
		r := float64(p) / float64(ping)
		t.Rows = append(t.Rows, []string{c.name, us(p), f2(r), fmt.Sprint(len(lat[i]))})
		t.Data = append(t.Data, map[string]any{"call": c.name, "p50_us": micros(p), "per_idle_ping": r, "samples": len(lat[i])})
	}
	return t, nil
}

// fifoFloorLib is the least a FIFO lock that wakes its waiters by push can
// do: the lock is a key set to its owner, the waiters a list in arrival
// order, and a release hands the lock to the first waiter and pushes onto
// that waiter's own list, on which it blocks. No lease expires, no waiter
// is checked for life, nothing is idempotent: no lock to use, a reference
// for the contended tables.
//
// With a second argument "1" the functions also do, on keys of their own,
// the Redis commands fairlock's scripts do for the same step on a mutex
// (key layout 3, lua/fast.lua) and nothing else: an enqueue's TIME, HMGET
// (the state's 13 fields, the process's liveness field, the ticket, zq),
// ZADD to the queue, HSET (the count, the sequence, the liveness field); a
// handing release's TIME, HMGET, ZPOPMIN (the queue's head), RPUSH (the
// floor's own push onto the waiter's list), HSET (the count, the sequence,
// the head's lease), PEXPIRE (the list). That row tells the cost of those
// commands from the cost of fairlock's logic around them. The release's
// third argument is the releasing owner.
const fifoFloorLib = `#!lua name=fairlock_bench_fifo
redis.register_function('fairlock_fifo_acquire', function(k, a)
  if redis.call('SET', k[1], a[1], 'NX') then return 1 end
  redis.call('RPUSH', k[2], a[1])
  if a[2] == '1' then
    local t = redis.call('TIME')
    redis.call('HMGET', k[3], 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'nc', 'layout', 'o', 'oe', 'lmin', 'lP', a[1], 'zq')
    redis.call('ZADD', k[4], t[2], a[1])
    redis.call('HSET', k[3], 'nq', 1, 'seq', t[2], 'lP', t[1])
  end
  return 0
end)
redis.register_function('fairlock_fifo_release', function(k, a)
  local nxt = redis.call('LPOP', k[2])
  if not nxt then
    redis.call('DEL', k[1])
    return 0
  end
  redis.call('SET', k[1], nxt)
  redis.call('RPUSH', a[1] .. nxt, '1')
  if a[2] == '1' then
    local t = redis.call('TIME')
    redis.call('HMGET', k[3], 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'nc', 'layout', 'o', 'oe', 'lmin', 'lP', a[3], 'zq')
    redis.call('ZPOPMIN', k[4])
    redis.call('HSET', k[3], 'nq', 1, 'seq', t[2], 'o', nxt, 'oe', t[1])
    redis.call('PEXPIRE', a[1] .. nxt, 3000)
  end
  return 1
end)`

// withRefs returns e with the reference rows refs measured beside its
// implementations.
func (e *env) withRefs(refs ...impl) *env {
	sub := *e
	sub.impls = append(slices.Clip(e.impls), refs...)
	return &sub
}

// fifoFloor is the reference row of the contended tables where the server
// has functions (see fifoFloorLib); ok is false elsewhere.
func (e *env) fifoFloor() (ims []impl, ok bool) {
	if !e.real || e.admin.FunctionLoadReplace(context.Background(), fifoFloorLib).Err() != nil {
		return nil, false
	}
	var ids atomic.Int64
	open := func(heavy string) func(rdb *redis.Client, prefix string) (locker, error) {
		return func(rdb *redis.Client, prefix string) (locker, error) {
			return &fifoFloorLocker{rdb: rdb, prefix: prefix, id: strconv.FormatInt(ids.Add(1), 10), heavy: heavy}, nil
		}
	}
	return []impl{
		{name: refFIFOFloor, reference: true, about: "not a lock to use: no TTL, no liveness, no retries; see fifoFloorLib", open: open("0")},
		{name: refFIFOFloorCommands, reference: true, about: "the FIFO floor doing fairlock's Redis commands besides", open: open("1")},
	}, true
}

type fifoFloorLocker struct {
	rdb               *redis.Client
	prefix, id, heavy string
}

func (f *fifoFloorLocker) lock(ctx context.Context, key string) (func(context.Context) error, error) {
	b := f.prefix + "{" + key + "}"
	keys := []string{b + ":o", b + ":q", b + ":s", b + ":fq", b + ":fd"}
	wake := b + ":w:"
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Once queued, it waits for its turn whatever ctx says, and takes the
	// lock (which the caller then releases): this lock has no way to leave
	// the queue.
	ctx = context.WithoutCancel(ctx)
	n, err := f.rdb.FCall(ctx, "fairlock_fifo_acquire", keys, f.id, f.heavy).Int()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		if err := f.rdb.BLMPop(ctx, 0, "left", 1, wake+f.id).Err(); err != nil {
			return nil, err
		}
	}
	return func(ctx context.Context) error {
		return f.rdb.FCall(ctx, "fairlock_fifo_release", keys, wake, f.heavy, f.id).Err()
	}, nil
}

func (f *fifoFloorLocker) lockBoth(ctx context.Context, a, _ string) (func(context.Context) error, error) {
	return f.lock(ctx, a)
}

func (f *fifoFloorLocker) close() {}

// floorRefs are the reference rows of the uncontended table where the server
// has functions: the floor's acquire and release functions (floorLib) as a
// lock, measured in the same loop as the implementations.
func (e *env) floorRefs() ([]impl, bool) {
	if !e.real || e.admin.FunctionLoadReplace(context.Background(), floorLib).Err() != nil {
		return nil, false
	}
	ref := func(name, about, acquire, release string) impl {
		return impl{name: name, reference: true, about: about,
			open: func(rdb *redis.Client, prefix string) (locker, error) {
				b := prefix + "{floor}:"
				return &floorLocker{rdb: rdb, keys: []string{b + "s"}, acquire: acquire, release: release}, nil
			}}
	}
	return []impl{
		ref(refFloorFunctions, "fairlock's commands only, no logic; see floorLib",
			"fairlock_floor_acquire", "fairlock_floor_release"),
		ref(refLeastScript, "TIME, HMGET, HSET per call, no logic: the fewest commands a lock judged by Redis's clock with its state in one hash can run; see floorLib",
			"fairlock_floor_least_acquire", "fairlock_floor_least_release"),
	}, true
}
