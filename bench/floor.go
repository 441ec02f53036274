package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// floorLib holds functions that do only the Redis commands a script-based
// lock with fairlock's guarantees cannot do without, and nothing else: what
// a script costs before any logic of its own.
const floorLib = `#!lua name=fairlock_bench_floor
redis.register_function('fairlock_floor_empty', function(k, a) return 1 end)
redis.register_function('fairlock_floor_acquire', function(k, a)
  local t = redis.call('TIME')
  redis.call('HMGET', k[1], 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'dmin', a[1])
  redis.call('ZADD', k[2], t[1], a[1])
  redis.call('HSET', k[1], 'used', 1, 'nh', 1, 'seq', t[2], a[1], t[2])
  redis.call('PEXPIRE', k[2], 20000)
  return {1, t[1], t[2]}
end)
redis.register_function('fairlock_floor_release', function(k, a)
  local t = redis.call('TIME')
  redis.call('HMGET', k[1], 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'dmin', a[1])
  redis.call('ZSCORE', k[2], a[1])
  redis.call('HSET', k[1], 'used', 0, 'nh', 0, a[1], 'r')
  redis.call('ZADD', k[3], t[1], a[1])
  redis.call('ZREM', k[2], a[1])
  return {1, 0}
end)`

// floor measures, on a real server with functions, the latency of calls that
// bound what a script-based lock can reach: PING, an empty function, and
// functions doing only an uncontended acquire's and a release's commands.
func floor(e *env) ([]*Table, []Target, error) {
	t := &Table{Name: "floor", Title: "8. The floor: what a script costs before its logic",
		Note:    "Functions doing only the commands a lock that keeps fairlock's guarantees needs (Redis's clock, the state read, the lease written, the state written, a TTL), and nothing else; calls interleaved, p50 of each. Real servers with functions (Redis 7+, Valkey) only.",
		Columns: []string{"call", "p50", "÷ PING p50", "samples"}}
	na := func(why string) ([]*Table, []Target, error) {
		t.Note = why
		t.Rows = append(t.Rows, []string{"n/a", "n/a", "n/a", "0"})
		t.Data = append(t.Data, map[string]any{"call": "n/a", "why": why})
		return []*Table{t}, nil, nil
	}
	if !e.real {
		return na("n/a on the embedded miniredis (no functions)")
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
	keys := []string{e.run + "{floor}:s", e.run + "{floor}:h", e.run + "{floor}:t"}
	calls := []struct {
		name string
		do   func() error
	}{
		{"PING", func() error { return rdb.Ping(ctx).Err() }},
		{"FCALL of an empty function", func() error { return rdb.FCall(ctx, "fairlock_floor_empty", nil).Err() }},
		{"FCALL: TIME, HMGET, ZADD, HSET, PEXPIRE (an uncontended acquire's commands)", func() error {
			return rdb.FCall(ctx, "fairlock_floor_acquire", keys, "TICKET").Err()
		}},
		{"FCALL: TIME, HMGET, ZSCORE, HSET, ZADD, ZREM (a release's commands)", func() error {
			return rdb.FCall(ctx, "fairlock_floor_release", keys, "TICKET").Err()
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
	return []*Table{t}, nil, nil
}
