// Package halfrun is a test helper that checks, mechanically, the rule
// every fairlock script must keep: it never fails after its first write.
// Redis does not roll a script back, so a script that errors after a write
// leaves half of its change behind.
//
// [Transform] rewrites a script's source so that every redis.call goes
// through a local wrapper that remembers whether a write command has
// succeeded. When a command, or the Lua code itself (unpack of too many
// values, a nil index), fails after a write, or the script returns an
// error reply after one, the script fails with
//
//	FAIRLOCK_HALF_RUN after <first write>: <error>
//
// and pushes that message onto the list <KEYS[1]>:halfrun, which [Check]
// reads. Errors before any write pass through unchanged. Install the
// transform with internal/testhook's option on the clients a test creates.
package halfrun

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
)

// Marker starts every half-run error message.
const Marker = "FAIRLOCK_HALF_RUN"

// Suffix ends the name of the list on which a half-run script records its
// message: KEYS[1] followed by Suffix (same hash tag, so same Cluster
// slot).
const Suffix = ":halfrun"

// writes lists the commands that change data, by upper-case name. A
// command absent from it is treated as a read.
var writes = []string{
	"APPEND", "COPY", "DECR", "DECRBY", "DEL", "EXPIRE", "EXPIREAT", "GETDEL", "GETEX", "GETSET",
	"HDEL", "HINCRBY", "HINCRBYFLOAT", "HMSET", "HSET", "HSETNX",
	"INCR", "INCRBY", "INCRBYFLOAT",
	"LINSERT", "LMOVE", "LPOP", "LPUSH", "LPUSHX", "LREM", "LSET", "LTRIM",
	"MSET", "MSETNX", "PERSIST", "PEXPIRE", "PEXPIREAT", "PSETEX", "RENAME", "RENAMENX", "RESTORE",
	"RPOP", "RPOPLPUSH", "RPUSH", "RPUSHX",
	"SADD", "SDIFFSTORE", "SET", "SETEX", "SETNX", "SETRANGE", "SINTERSTORE", "SMOVE", "SPOP", "SREM",
	"SUNIONSTORE", "UNLINK", "XADD", "XDEL", "XTRIM",
	"ZADD", "ZDIFFSTORE", "ZINCRBY", "ZINTERSTORE", "ZPOPMAX", "ZPOPMIN", "ZRANGESTORE", "ZREM",
	"ZREMRANGEBYLEX", "ZREMRANGEBYRANK", "ZREMRANGEBYSCORE", "ZUNIONSTORE",
}

// IsWrite reports whether the command name (any case) changes data, as
// the wrapper decides it.
func IsWrite(name string) bool {
	for _, w := range writes {
		if strings.EqualFold(w, name) {
			return true
		}
	}
	return false
}

// prelude defines the wrapper. Redis 7 forbids new globals, so everything
// is local; names start with __halfrun to stay clear of the script's own.
// A command runs through redis.pcall; its error is raised again as the
// error table redis.call would have raised, so that Redis replies with the
// same message. miniredis (which has no redis.REDIS_VERSION) reports a
// raised table by its address, so there errors are raised as strings.
func prelude() string {
	var b strings.Builder
	b.WriteString("local __halfrun_writes = {")
	for _, w := range writes {
		b.WriteString(w + "=true,")
	}
	b.WriteString("}\n")
	b.WriteString(`local __halfrun_wrote, __halfrun_err = nil, nil
local function __halfrun_raise(e)
  if redis.REDIS_VERSION then error(e) end
  if type(e) == 'table' then e = e.err end
  error(e, 0)
end
local function __halfrun_fail(m)
  m = '` + Marker + ` after ' .. __halfrun_wrote .. ': ' .. tostring(m)
  if KEYS[1] then redis.pcall('RPUSH', KEYS[1] .. '` + Suffix + `', m) end
  return m
end
local function __halfrun_call(cmd, ...)
  local res = redis.pcall(cmd, ...)
  if type(res) == 'table' and res.err then
    if __halfrun_wrote then error(__halfrun_fail(res.err), 0) end
    __halfrun_err = res
    __halfrun_raise(res)
  end
  if not __halfrun_wrote and __halfrun_writes[string.upper(tostring(cmd))] then
    __halfrun_wrote = string.upper(cmd)
  end
  return res
end
`)
	return b.String()
}

// Transform returns src rewritten as the package doc says: every
// "redis.call(" calls the wrapper, and the whole script runs inside a
// protected call so that Lua errors after a write are caught too.
func Transform(src string) string {
	// A script's "#!lua" line (its flags) stays first.
	line, body := testhook.SplitShebang(src)
	body = strings.ReplaceAll(body, "redis.call(", "__halfrun_call(")
	// The prelude takes no line of its own, so errors keep the script's
	// line numbers.
	head := strings.ReplaceAll(prelude(), "\n", " ")
	return line + head + `local __halfrun_ok, __halfrun_res = pcall(function() ` + body + `
end)
if not __halfrun_ok then
  local e = __halfrun_res
  local m = e
  if type(e) == 'table' then m = e.err end
  m = tostring(m)
  local at = string.find(m, '` + Marker + `', 1, true)
  if at then __halfrun_raise({err = string.sub(m, at)}) end
  if __halfrun_wrote then __halfrun_raise({err = __halfrun_fail(m)}) end
  if __halfrun_err and (e == __halfrun_err or m == __halfrun_err.err) then __halfrun_raise(__halfrun_err) end
  error(e, 0)
end
if __halfrun_wrote and type(__halfrun_res) == 'table' and __halfrun_res.err then
  return redis.error_reply(__halfrun_fail(__halfrun_res.err))
end
return __halfrun_res
`
}

// Is reports whether err is, or wraps, a half-run failure.
func Is(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if strings.Contains(err.Error(), Marker) {
			return true
		}
	}
	return false
}

// Records returns the half-run messages recorded under keys matching
// pattern (a SCAN pattern, such as a test's key prefix followed by "*"),
// and the keys that hold them.
func Records(ctx context.Context, rdb redis.UniversalClient, pattern string) (map[string][]string, error) {
	out := map[string][]string{}
	iter := rdb.Scan(ctx, 0, pattern+Suffix, 1000).Iterator()
	for iter.Next(ctx) {
		msgs, err := rdb.LRange(ctx, iter.Val(), 0, -1).Result()
		if err != nil {
			return out, err
		}
		out[iter.Val()] = msgs
	}
	return out, iter.Err()
}

// Check fails t, when it ends, if a script run on rdb under keys matching
// pattern (a SCAN pattern, "*" for every key) recorded a half run; the
// records are deleted then, so they fail only one test. A failure to read
// them fails t too.
func Check(t testing.TB, rdb redis.UniversalClient, pattern string) {
	t.Helper()
	t.Cleanup(func() {
		ctx := context.Background()
		recs, err := Records(ctx, rdb, pattern)
		if err != nil {
			t.Errorf("halfrun: reading records: %v", err)
		}
		for k, msgs := range recs {
			n := len(msgs)
			if n > 3 {
				msgs = msgs[:3]
			}
			t.Errorf("halfrun: %d script(s) failed after a write (%s): %s", n, k, strings.Join(msgs, " | "))
			rdb.Del(ctx, k)
		}
	})
}
