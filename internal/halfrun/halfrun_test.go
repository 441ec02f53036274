package halfrun_test

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/internal/halfrun"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// run runs src, plain and transformed, on a fresh key and returns both
// results.
func run(t *testing.T, rdb *redis.Client, key, src string) (plain, checked any, plainErr, checkedErr error) {
	t.Helper()
	ctx := context.Background()
	rdb.Del(ctx, key, key+halfrun.Suffix)
	plain, plainErr = redis.NewScript(src).Run(ctx, rdb, []string{key}).Result()
	rdb.Del(ctx, key, key+halfrun.Suffix)
	checked, checkedErr = redis.NewScript(halfrun.Transform(src)).Run(ctx, rdb, []string{key}).Result()
	return plain, checked, plainErr, checkedErr
}

func TestTransform(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rdb := b.Client(t)
		ctx := context.Background()
		key := redistest.Prefix(t) + "{k}"
		for _, tc := range []struct {
			name, src string
			half      string // the expected "after <write>", "" for no half run
			realOnly  bool
		}{
			{"command error after a write",
				"redis.call('HSET', KEYS[1], 'f', 'v')\nredis.call('INCR', KEYS[1])\nreturn 1", "after HSET", false},
			{"lower-case write",
				"redis.call('zadd', KEYS[1], 1, 'm')\nreturn redis.call('LPUSH', KEYS[1], 'x')", "after ZADD", false},
			{"Lua error after a write",
				"redis.call('RPUSH', KEYS[1], 'a')\nlocal t = nil\nreturn t.x", "after RPUSH", false},
			{"error reply after a write",
				"redis.call('PEXPIRE', KEYS[1], 1000)\nredis.call('DEL', KEYS[1])\nreturn redis.error_reply('NOPE late')", "after PEXPIRE", false},
			// Redis's Lua refuses to unpack about 8,000 values; miniredis's
			// does not.
			{"unpack of too many values after a write",
				"redis.call('SET', KEYS[1] .. 'x', '1')\nlocal f = {}\nfor i = 1, 20000 do f[i] = 'f' .. i end\nreturn redis.call('HSET', KEYS[1], unpack(f))", "after SET", true},
			{"write then read error",
				"redis.call('SET', KEYS[1], 'v')\nreturn redis.call('HGET', KEYS[1], 'f')", "after SET", false},
			// A write command that fails wrote nothing.
			{"command error before any write",
				"redis.call('GET', KEYS[1])\nredis.call('INCRBY', KEYS[1], 'x')\nreturn 1", "", false},
			{"no error",
				"redis.call('HSET', KEYS[1], 'a', '1')\nreturn {1, 'two', redis.call('HGET', KEYS[1], 'a'), {3}}", "", false},
			{"error reply, no write",
				"if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('FAIRLOCK_CAPACITY 3 1') end\nreturn 1", "", false},
			{"Lua error, no write",
				"local x = redis.call('GET', KEYS[1])\nreturn x.y", "", false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if tc.realOnly && !b.Real() {
					t.Skip("miniredis's Lua has no unpack limit")
				}
				plain, checked, plainErr, checkedErr := run(t, rdb, key, tc.src)
				recs, err := halfrun.Records(ctx, rdb, key)
				if err != nil {
					t.Fatal(err)
				}
				if tc.half == "" {
					// Unchanged: the same reply or the same error.
					if (plainErr == nil) != (checkedErr == nil) || (plainErr != nil && !sameError(plainErr.Error(), checkedErr.Error())) {
						t.Fatalf("error %v, want the plain script's %v", checkedErr, plainErr)
					}
					if plainErr == nil && !equal(plain, checked) {
						t.Fatalf("reply %#v, want the plain script's %#v", checked, plain)
					}
					if len(recs) != 0 || halfrun.Is(checkedErr) {
						t.Fatalf("half run reported: %v %v", recs, checkedErr)
					}
					t.Logf("plain %v / %v; checked %v / %v", plain, plainErr, checked, checkedErr)
					return
				}
				if plainErr == nil && tc.name != "no error" && !strings.Contains(tc.name, "reply") {
					t.Logf("the plain script did not fail (%v)", plain)
				}
				if !halfrun.Is(checkedErr) || !strings.Contains(checkedErr.Error(), halfrun.Marker+" "+tc.half+": ") {
					t.Fatalf("error %v, want %s %s: ...", checkedErr, halfrun.Marker, tc.half)
				}
				msgs := recs[key+halfrun.Suffix]
				if len(msgs) != 1 || !strings.HasPrefix(msgs[0], halfrun.Marker+" "+tc.half+": ") {
					t.Fatalf("records %v, want one %s %s", recs, halfrun.Marker, tc.half)
				}
				t.Logf("caught: %v (plain script: %v)", checkedErr, plainErr)
			})
		}
	})
}

// position is where miniredis's Lua says an error was raised.
var position = regexp.MustCompile(`(^|\s):\d+:`)

// sameError compares error messages, ignoring the script's hash and
// miniredis's traceback and error positions.
func sameError(a, b string) bool {
	cut := func(s string) string {
		// Redis names the script by its hash; miniredis adds a traceback
		// that names the frames.
		for _, tail := range []string{" script: ", "stack traceback"} {
			if i := strings.Index(s, tail); i >= 0 {
				s = s[:i]
			}
		}
		return strings.TrimSpace(position.ReplaceAllString(s, ""))
	}
	return cut(a) == cut(b)
}

func equal(a, b any) bool {
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok != bok {
		return false
	}
	if !aok {
		return a == b
	}
	if len(as) != len(bs) {
		return false
	}
	for i := range as {
		if !equal(as[i], bs[i]) {
			return false
		}
	}
	return true
}

func TestIsWrite(t *testing.T) {
	for name, want := range map[string]bool{"hset": true, "ZRemRangeByScore": true, "PEXPIREAT": true, "ZRANGE": false, "TIME": false, "hmget": false} {
		if halfrun.IsWrite(name) != want {
			t.Errorf("IsWrite(%q) = %v, want %v", name, !want, want)
		}
	}
}
