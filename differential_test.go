package fairlock

// The differential test: every fast path must do exactly what the general
// path would do in its place. Histories of script calls are recorded from
// real runs (the property machine, the scale scenarios), then replayed
// twice, call by call, on two empty databases: once with the fast paths on
// and once with them off (internal/testhook.NoFastPaths). After every
// call the two replies and the two databases (every key, every field,
// member and score, every list entry, every key's expiry to the
// millisecond) must be equal.
//
// A replay must see what the recorded run saw, so the clock is the
// recorded one: each replayed script reads Redis's TIME from a key that
// the replay sets to the time the recorded call read, and its key
// expiries are moved a day ahead, out of the real clock's reach; before
// each call the replay deletes the keys whose (recorded-clock) expiry has
// passed, as Redis would have. Replies then carry the recorded tokens, and
// the calls that follow (a release naming its lease's token) find what
// they found in the recorded run. Besides the recorded calls, the replay
// sends some calls again, at once or a few calls later, as go-redis does
// when a reply is lost.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/fairlock/fairlock/internal/redisserver"
	"github.com/fairlock/fairlock/internal/redistest"
	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"
)

const (
	// clockKey holds the recorded clock a replayed script reads.
	clockKey = "fltest:clock"
	// fastKey counts the replayed calls that took a fast path.
	fastKey = "fltest:fast"
	// expiryShift moves a replayed script's key expiries out of the real
	// clock's reach; the replay expires keys itself, by the recorded one.
	expiryShift = int64(24 * time.Hour / time.Millisecond)
	// The databases of the real server that replays use.
	replayDBFast, replayDBGeneral = 14, 15
)

// call is one recorded script call.
type call struct {
	Script string   `json:"s"` // scriptName's name of the script
	Keys   []string `json:"k"`
	Args   []string `json:"a"`
	Time   []string `json:"t"` // Redis's TIME as the script read it: seconds, microseconds
}

// nowMs is the call's clock in milliseconds, as the scripts compute it.
func (c call) nowMs() int64 {
	s, _ := strconv.ParseInt(c.Time[0], 10, 64)
	us, _ := strconv.ParseInt(c.Time[1], 10, 64)
	return s*1000 + us/1000
}

// op is the operation the call asks its script for (ARGV[1]).
func (c call) op() string {
	if len(c.Args) == 0 {
		return ""
	}
	return c.Args[0]
}

// later returns c run ms milliseconds later.
func (c call) later(ms int64) call {
	s, _ := strconv.ParseInt(c.Time[0], 10, 64)
	us, _ := strconv.ParseInt(c.Time[1], 10, 64)
	us += s*1e6 + ms*1000
	c.Time = []string{strconv.FormatInt(us/1e6, 10), strconv.FormatInt(us%1e6, 10)}
	return c
}

// longestTTL returns the longest lease or waiter TTL (ms) that the
// acquisitions of calls ask for.
func longestTTL(calls []call) int64 {
	var most int64 = 1
	for _, c := range calls {
		if op := c.op(); len(c.Args) > 4 && (op == "acquire" || op == "try") {
			for _, a := range c.Args[3:5] {
				if n, err := strconv.ParseInt(a, 10, 64); err == nil {
					most = max(most, n)
				}
			}
		}
	}
	return most
}

func (c call) String() string {
	return fmt.Sprintf("%s at %s.%06s: KEYS %q ARGV %q", c.Script, c.Time[0], c.Time[1], c.Keys, c.Args)
}

// scriptName names the entry whose script src is (before any transform);
// entries that share a file share a script.
func scriptName(src string) string {
	for _, e := range entries {
		if strings.HasSuffix(src, entryBody(source(e.file))) {
			return e.name
		}
	}
	panic("differential test: a script it does not know")
}

// runScript runs the script of set that serves c's op, with c's keys and
// arguments.
func runScript(ctx context.Context, set *scripts, rdb RedisClient, c call) (any, error) {
	args := make([]any, len(c.Args))
	for i, a := range c.Args {
		args[i] = a
	}
	o := opNamed(c.op())
	if o == nil {
		return nil, fmt.Errorf("no script serves op %q", c.op())
	}
	return set.forOp(o).Run(ctx, rdb, c.Keys, args...).Result()
}

// onLine makes Lua source take no line of its own, so that a transformed
// script keeps its line numbers.
func onLine(lua string) string { return strings.ReplaceAll(lua, "\n", " ") }

// recording returns a transform (setTestTransform) that records every call of
// the scripts it is given, after passing them through inner (if not nil):
// when a script first reads Redis's TIME, it pushes the call (script,
// keys, arguments, the time read) onto the list logKey.
func recording(logKey string, inner func(string) string) func(string) string {
	return func(src string) string {
		name := scriptName(src)
		if inner != nil {
			src = inner(src)
		}
		// ARGV is copied as it arrives: the scripts' parsers convert its
		// numbers in place.
		prelude := fmt.Sprintf(`local __rec_done, __rec_argv = false, {}
for i, v in ipairs(ARGV) do __rec_argv[i] = v end
local function __rec_time(cmd, res)
  if cmd == 'TIME' and not __rec_done and type(res) == 'table' and not res.err then
    __rec_done = true
    redis.call('RPUSH', %q, cjson.encode({ s = %q, k = KEYS, a = __rec_argv, t = res }))
  end
  return res
end
local function __rec_call(cmd, ...)
  return __rec_time(cmd, redis.call(cmd, ...))
end
local function __rec_pcall(cmd, ...)
  return __rec_time(cmd, redis.pcall(cmd, ...))
end
`, logKey, name)
		// (A wrapper such as internal/halfrun's calls redis.pcall.)
		src = strings.ReplaceAll(src, "redis.call(", "__rec_call(")
		return onLine(prelude) + strings.ReplaceAll(src, "redis.pcall(", "__rec_pcall(")
	}
}

// replayed returns a transform that makes a script run at the recorded
// clock held in clockKey, with its key expiries moved expiryShift ahead
// (see the file's comment), after passing it through inner (if not nil).
func replayed(inner func(string) string) func(string) string {
	prelude := fmt.Sprintf(`local __clk_now = 0
local function __clk_args(cmd, ...)
  local c = string.upper(cmd)
  if c == 'PEXPIREAT' then
    local k, at = ...
    return 'PEXPIREAT', k, string.format('%%d', tonumber(at) + %[2]d)
  elseif c == 'PEXPIRE' then
    local k, d = ...
    return 'PEXPIREAT', k, string.format('%%d', __clk_now + tonumber(d) + %[2]d)
  end
  return cmd, ...
end
local function __clk_call(cmd, ...)
  if cmd == 'TIME' then
    local t = redis.call('HMGET', %[1]q, 's', 'us')
    __clk_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    return { t[1], t[2] }
  end
  return redis.call(__clk_args(cmd, ...))
end
local function __clk_pcall(cmd, ...)
  return redis.pcall(__clk_args(cmd, ...))
end
`, clockKey, expiryShift)
	return func(src string) string {
		if inner != nil {
			src = inner(src)
		}
		src = strings.ReplaceAll(src, "redis.call(", "__clk_call(")
		src = strings.ReplaceAll(src, "redis.pcall(", "__clk_pcall(")
		return onLine(prelude) + src
	}
}

// compose returns the transform that applies fs in order (nil ones
// skipped).
func compose(fs ...func(string) string) func(string) string {
	return func(src string) string {
		for _, f := range fs {
			if f != nil {
				src = f(src)
			}
		}
		return src
	}
}

// readLog returns the calls recorded on rdb under logKey, and deletes
// them.
func readLog(ctx context.Context, rdb *redis.Client, logKey string) ([]call, error) {
	raw, err := rdb.LRange(ctx, logKey, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	rdb.Del(ctx, logKey)
	calls := make([]call, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal([]byte(r), &calls[i]); err != nil {
			return nil, fmt.Errorf("recorded call %d %q: %w", i, r, err)
		}
		if len(calls[i].Time) != 2 {
			return nil, fmt.Errorf("recorded call %d %q has no time", i, r)
		}
	}
	return calls, nil
}

// expireScript deletes the keys whose expiry, by the recorded clock
// (ARGV[1], ms), has passed: as Redis does, a key lives until the clock
// is past its expiry.
var expireScript = redis.NewScript(`
local now, shift, n = tonumber(ARGV[1]), tonumber(ARGV[2]), 0
for _, k in ipairs(redis.call('KEYS', '*')) do
  local at = redis.call('PEXPIRETIME', k)
  if at > 0 and at - shift < now then
    redis.call('DEL', k)
    n = n + 1
  end
end
return n`)

// dumpScript renders the whole database but the test's own keys (ARGV[2]
// starts their names), canonically: keys in
// order, each with its type and absolute expiry (ms, or -1), then its
// content (hash fields sorted, sorted-set members in order with their
// scores, list entries in order, set members sorted, a stream's length). With ARGV[1] "digest" it returns the
// SHA-1 of that text instead.
var dumpScript = redis.NewScript(`
local keys = redis.call('KEYS', '*')
table.sort(keys)
local out = {}
for _, k in ipairs(keys) do
  if string.sub(k, 1, #ARGV[2]) ~= ARGV[2] then
    local t = redis.call('TYPE', k)
    if type(t) == 'table' then t = t.ok or t['ok'] end
    out[#out + 1] = k .. ' ' .. tostring(t) .. ' expiry ' .. tostring(redis.call('PEXPIRETIME', k))
    if t == 'hash' then
      local h, f = redis.call('HGETALL', k), {}
      for i = 1, #h, 2 do f[#f + 1] = h[i] .. ' = ' .. h[i + 1] end
      table.sort(f)
      for _, x in ipairs(f) do out[#out + 1] = '  ' .. x end
    elseif t == 'zset' then
      local z = redis.call('ZRANGE', k, 0, -1, 'WITHSCORES')
      for i = 1, #z, 2 do out[#out + 1] = '  ' .. z[i + 1] .. ' ' .. z[i] end
    elseif t == 'list' then
      for _, x in ipairs(redis.call('LRANGE', k, 0, -1)) do out[#out + 1] = '  [' .. x .. ']' end
    elseif t == 'string' then
      out[#out + 1] = '  ' .. redis.call('GET', k)
    elseif t == 'set' then
      local m = redis.call('SMEMBERS', k)
      table.sort(m)
      for _, x in ipairs(m) do out[#out + 1] = '  {' .. x .. '}' end
    elseif t == 'stream' then
      out[#out + 1] = '  entries ' .. redis.call('XLEN', k)
    end
  end
end
local s = table.concat(out, '\n')
if ARGV[1] == 'digest' then return redis.sha1hex(s) end
return s`)

// replayer runs recorded calls on one database with the fast paths on or
// off.
type replayer struct {
	name    string
	rdb     *redis.Client
	scripts *scripts
	debug   bool // the server allows DEBUG DIGEST-VALUE
}

func (r *replayer) prepare(ctx context.Context, c call) error {
	if err := r.rdb.HSet(ctx, clockKey, "s", c.Time[0], "us", c.Time[1]).Err(); err != nil {
		return err
	}
	return expireScript.Run(ctx, r.rdb, nil, c.nowMs(), expiryShift).Err()
}

// dump renders r's database (see dumpScript) or, for mode "digest", a
// digest of it: on a server that allows DEBUG (the replay server), every
// key's name, type, expiry and content digest (DEBUG DIGEST-VALUE, which
// costs Redis a pass in C rather than one in Lua: crowds hold thousands of
// members); elsewhere the SHA-1 of the rendering.
func (r *replayer) dump(ctx context.Context, mode string) (string, error) {
	if mode != "digest" || !r.debug {
		return dumpScript.Run(ctx, r.rdb, nil, mode, "fltest:").Text()
	}
	keys, err := r.rdb.Keys(ctx, "*").Result()
	if err != nil {
		return "", err
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return strings.HasPrefix(k, "fltest:") })
	if len(keys) == 0 {
		return "", nil
	}
	slices.Sort(keys)
	args := []any{"DEBUG", "DIGEST-VALUE"}
	for _, k := range keys {
		args = append(args, k)
	}
	pipe := r.rdb.Pipeline()
	digests := pipe.Do(ctx, args...)
	types := make([]*redis.StatusCmd, len(keys))
	expiries := make([]*redis.DurationCmd, len(keys))
	for i, k := range keys {
		types[i] = pipe.Type(ctx, k)
		expiries[i] = pipe.PExpireTime(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return "", err
	}
	ds, err := digests.Slice()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for i, k := range keys {
		fmt.Fprintf(&b, "%s %s %d %v\n", k, types[i].Val(), expiries[i].Val().Milliseconds(), ds[i])
	}
	return b.String(), nil
}

// replayPair holds the two replayers of one backend: fast paths on, and
// off; inner (the same for both: a mutation under test, or nil) applies
// before either.
type replayPair struct {
	backend       string
	fast, general *replayer
}

// newReplayPair returns the replayers of a real server (two of its
// databases) or, for real false, of a miniredis of their own (two
// databases; its clock fixed, so that expiries read back exactly). The
// real server is one started for the replays, which allows DEBUG; where
// it cannot be started with that setting (a server before 7.0), the
// shared one.
func newReplayPair(t testing.TB, real bool, inner func(string) string) *replayPair {
	t.Helper()
	dbFast, dbGeneral := replayDBFast, replayDBGeneral
	name, addr, debug := "", "", false
	if real {
		name, addr = "redis-server", redistest.RealBackend(t).Addr
		if srv, err := redisserver.Start("--enable-debug-command", "local"); err == nil {
			t.Cleanup(srv.Stop)
			addr, debug = srv.Addr, true
		}
	} else {
		name = "miniredis"
		m := miniredis.RunT(t)
		m.SetTime(time.Now())
		addr, dbFast, dbGeneral = m.Addr(), 1, 2
	}
	mk := func(name string, db int, transform func(string) string) *replayer {
		rdb := redis.NewClient(&redis.Options{Addr: addr, DB: db})
		t.Cleanup(func() {
			rdb.FlushDB(context.Background())
			rdb.Close()
		})
		return &replayer{name: name, rdb: rdb, scripts: newScripts(transform), debug: debug}
	}
	return &replayPair{
		backend: name,
		fast:    mk("fast paths on", dbFast, replayed(compose(inner, countFast))),
		general: mk("fast paths off", dbGeneral, replayed(compose(inner, testhook.NoFastPaths))),
	}
}

// step runs c (the stepth call of a run) on both sides of p, compares
// their replies and their databases after it, and returns the reply, or
// an error that shows the difference.
func (p *replayPair) step(ctx context.Context, c call, step int) (any, error) {
	var replies [2]string
	var res any
	before, _ := p.general.dump(ctx, "")
	for j, r := range []*replayer{p.fast, p.general} {
		if err := r.prepare(ctx, c); err != nil {
			return nil, fmt.Errorf("%s: preparing step %d: %w", p.backend, step, err)
		}
		out, err := runScript(ctx, r.scripts, r.rdb, c)
		if err != nil && !strings.Contains(err.Error(), "FAIRLOCK_") {
			// Two sides that fail alike are no proof: a script that does
			// not compile, or breaks, fails the replay.
			return nil, fmt.Errorf("%s: step %d: %s\n%s: %w", p.backend, step, c, r.name, err)
		}
		replies[j] = fmt.Sprintf("%#v (error %v)", out, err)
		if j == 0 {
			res = out
		}
	}
	if replies[0] != replies[1] {
		return nil, fmt.Errorf("%s: step %d: %s\nreplies differ:\n  fast paths on:  %s\n  fast paths off: %s\nbefore:\n%s",
			p.backend, step, c, replies[0], replies[1], before)
	}
	var digests [2]string
	for j, r := range []*replayer{p.fast, p.general} {
		d, err := r.dump(ctx, "digest")
		if err != nil {
			return nil, fmt.Errorf("%s: dump after step %d: %w", p.backend, step, err)
		}
		digests[j] = d
	}
	if digests[0] != digests[1] {
		a, _ := p.fast.dump(ctx, "")
		b, _ := p.general.dump(ctx, "")
		return nil, fmt.Errorf("%s: step %d: %s\nreply %s\nthe databases differ (fast paths on -, off +):\n%s\nbefore the call:\n%s",
			p.backend, step, c, replies[0], lineDiff(a, b), before)
	}
	return res, nil
}

// fastTaken is how a script returns a fast path's answer.
const fastTaken = "if out then return out end"

// countFast makes a script count, in fastKey, the calls that a fast path
// answers (acquire's and release's have fast paths, the others none).
func countFast(src string) string {
	for _, f := range []string{"acquire.lua", "release.lua"} {
		if strings.HasSuffix(src, entryBody(source(f))) && !strings.Contains(src, fastTaken) {
			panic("differential test: no fast path's return to count (" + fastTaken + ") in " + f)
		}
	}
	return strings.ReplaceAll(src, fastTaken, "if out then redis.call('INCR', '"+fastKey+"') return out end")
}

// fastCount returns how many replayed calls a fast path has answered.
func (p *replayPair) fastCount(ctx context.Context) int {
	n, _ := p.fast.rdb.Get(ctx, fastKey).Int()
	return n
}

// replay runs calls on both sides of p, sending some again (drawn from
// seed), with a pause before one acquisition or release when pause is
// set, and returns an error describing the first difference.
func (p *replayPair) replay(ctx context.Context, calls []call, seed uint64, pause bool) error {
	for _, r := range []*replayer{p.fast, p.general} {
		if err := r.rdb.FlushDB(ctx).Err(); err != nil {
			return err
		}
	}
	rng := mrand.New(mrand.NewPCG(seed, 0x5eed))
	var resends []int // calls to send again later, in order
	// A pause at one call: from there on every call runs
	// later by up to twice the longest TTL of the history, so that what
	// the recorded run renewed or refreshed in time expires first (a
	// stalled network, a paused fleet). The calls after it find leases and
	// waiters due that no script has dropped yet.
	// The pause comes before an acquisition or a release, the calls with
	// fast paths (in a recorded run, a refresh would mostly come first and
	// drop what died).
	pauseAt, pauseMs := len(calls), int64(0)
	var at []int
	for i, c := range calls {
		if op := c.op(); op == "acquire" || op == "try" || op == "release" {
			at = append(at, i)
		}
	}
	if len(at) > 0 && pause {
		pauseAt = at[rng.IntN(len(at))]
	}
	step := 0
	// one runs call i at the time of call at on both sides and compares.
	one := func(i, at int, what string) error {
		step++
		c := calls[i]
		c.Time = calls[at].Time
		if at == pauseAt && what == "" {
			pauseMs = p.choosePause(ctx, c, rng, longestTTL(calls))
			what = fmt.Sprintf(" (after a pause of %d ms)", pauseMs)
		}
		if at >= pauseAt {
			c = c.later(pauseMs)
		}
		_, err := p.step(ctx, c, step)
		if err != nil {
			return fmt.Errorf("call %d%s: %w", i, what, err)
		}
		return nil
	}
	for i := range calls {
		if err := one(i, i, ""); err != nil {
			return err
		}
		// Resends: at once (its reply was lost), or a few calls later.
		switch rng.IntN(16) {
		case 0:
			if err := one(i, i, " (sent again at once)"); err != nil {
				return err
			}
		case 1:
			resends = append(resends, i)
		}
		if len(resends) > 0 && resends[0] < i && rng.IntN(3) == 0 {
			j := resends[0]
			resends = resends[1:]
			if err := one(j, i, fmt.Sprintf(" (sent again after call %d)", i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// choosePause returns how long (ms) to pause before call c: mostly just
// past the earliest time after c's in one of the sorted sets of c's keys
// (a lease's expiry, a waiter's deadline, a tombstone's end), so that c
// is the first call to find it due; otherwise up to twice the longest
// TTL.
func (p *replayPair) choosePause(ctx context.Context, c call, rng *mrand.Rand, longest int64) int64 {
	now := c.nowMs()
	if rng.IntN(4) != 0 {
		var next []int64
		for _, k := range c.Keys {
			zs, err := p.fast.rdb.ZRangeByScoreWithScores(ctx, k, &redis.ZRangeBy{
				Min: "(" + strconv.FormatInt(now, 10), Max: strconv.FormatInt(now+100*longest+60000, 10), Count: 1}).Result()
			if err == nil && len(zs) == 1 {
				next = append(next, int64(zs[0].Score))
			}
		}
		if len(next) > 0 {
			return next[rng.IntN(len(next))] - now + 1
		}
	}
	return rng.Int64N(2*longest + 1)
}

// lineDiff shows the lines of two dumps that differ, fast paths on (-)
// against off (+).
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	inB := map[string]int{}
	for _, l := range bl {
		inB[l]++
	}
	inA := map[string]int{}
	for _, l := range al {
		inA[l]++
	}
	var out []string
	key := "" // the key a line belongs to
	for _, l := range al {
		if !strings.HasPrefix(l, "  ") {
			key = l
		}
		if inB[l] == 0 {
			out = append(out, "- "+l+"   (in "+key+")")
		}
	}
	for _, l := range bl {
		if !strings.HasPrefix(l, "  ") {
			key = l
		}
		if inA[l] == 0 {
			out = append(out, "+ "+l+"   (in "+key+")")
		}
	}
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("... %d more", len(out)-40))
	}
	return strings.Join(out, "\n")
}

// TestFastPathsMatchGeneralPath replays recorded histories with the fast
// paths on and off, on miniredis and on the real server, and fails at the
// first call whose reply or effect differs.
func TestFastPathsMatchGeneralPath(t *testing.T) {
	t.Run("calls", func(t *testing.T) {
		// Script calls drawn directly, in lockstep.
		checks := 0 // rapid.checks
		if redistest.Race {
			// The full count runs without -race on the other servers.
			n, _ := strconv.Atoi(flag.Lookup("rapid.checks").Value.String())
			checks = max(n/3, 1)
		}
		diffCalls(t, t, checks, nil)
	})
	t.Run("property", func(t *testing.T) {
		redistest.Long(t)
		// The property machine on miniredis: its clock moves, processes
		// crash and pause, Redis's scripts are flushed.
		checks := *diffPropertyChecks
		if redistest.Race {
			checks = max(checks/3, 1) // the full count runs without -race
		}
		diffMachines(t, t, recordingBackend(t), replayPairs(t, nil), checks, nil, func(rt *rapid.T, b *redistest.Backend) {
			runMachine(rt, b, mconfig{frozen: true, wait: pWait, maxCap: 8})
		})
	})
	t.Run("crowds", func(t *testing.T) {
		redistest.Long(t)
		if redistest.Race {
			// Go-side work (thousands of clients' goroutines); CI runs
			// it without -race on the other servers.
			t.Skip("crowds run without the race detector")
		}
		// The machine on the real server, in real time, with crowds (one
		// process, many requests), bulk grants and a doomed crowd's mass
		// expiry.
		b := redistest.RealBackend(t)
		setFlag(t, "rapid.steps", "20")
		// Crowds of thousands are too much for miniredis's interpreter.
		pairs := []*replayPair{newReplayPair(t, true, nil)}
		diffMachines(t, t, b, pairs, *diffCrowdChecks, nil, func(rt *rapid.T, b *redistest.Backend) {
			runMachine(rt, b, mconfig{wait: pWait, maxCap: 8, scale: true, crowd: *diffCrowd, doom: true})
		})
	})
}

// Flags for longer differential runs of the crowd machine.
var (
	diffPropertyChecks = flag.Int("diff.property.checks", 60, "property machines TestFastPathsMatchGeneralPath records")
	diffCrowdChecks    = flag.Int("diff.crowd.checks", 3, "crowd machines TestFastPathsMatchGeneralPath records")
	diffCrowd          = flag.Int("diff.crowd", 300, "largest crowd TestFastPathsMatchGeneralPath draws")
)

// RecordAndReplay runs run, whose clients use b, with every client it
// creates recording its script calls (their scripts passed through
// inner, if not nil), then
// replays them with the fast paths on and off (see
// TestFastPathsMatchGeneralPath) on the real server, faithfully and once
// more with a pause before one call; the first difference fails t. The
// scale scenarios (package fairlock_test) call it.
func RecordAndReplay(t *testing.T, b *redistest.Backend, inner func(string) string, run func()) {
	t.Helper()
	ctx := context.Background()
	rdb := b.Client(t)
	logKey := "fltest:log:" + rand.Text()
	restore := setTestTransform(recording(logKey, inner))
	run()
	restore()
	calls, err := readLog(ctx, rdb, logKey)
	if err != nil {
		t.Fatal(err)
	}
	p := newReplayPair(t, true, nil)
	for _, pause := range []bool{false, true} {
		start := time.Now()
		if err := p.replay(ctx, calls, 1, pause); err != nil {
			t.Fatal(err)
		}
		t.Logf("%d calls (%d answered by a fast path) replayed in %v (pause %v)", len(calls), p.fastCount(ctx), time.Since(start), pause)
	}
}

// recordingBackend returns a miniredis whose clock the property machine moves, for
// recording; it runs even when FAIRLOCK_REAL_ONLY skips the miniredis
// tests, since it only produces histories.
func recordingBackend(t testing.TB) *redistest.Backend {
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	return &redistest.Backend{Name: "miniredis", Addr: m.Addr(), Mini: m}
}

// replayPairs returns the replayers of miniredis (unless
// FAIRLOCK_REAL_ONLY=1) and of the real server (when there is one; under
// CI=true there must be).
func replayPairs(t testing.TB, inner func(string) string) []*replayPair {
	t.Helper()
	var pairs []*replayPair
	if !redistest.RealOnly() {
		pairs = append(pairs, newReplayPair(t, false, inner))
	}
	if _, ok := redistest.Server(); ok || os.Getenv("CI") == "true" || redistest.RealOnly() {
		pairs = append(pairs, newReplayPair(t, true, inner))
	} else {
		t.Log("no redis-server: histories are replayed on miniredis only")
	}
	return pairs
}

// diffMachines runs checks property machines (0: the rapid.checks flag) on
// b, recording, through run, with every script passed through
// inner (a mutation, or nil), and replays each machine's history on
// pairs (whose scripts inner must pass through too); a difference fails the machine, which rapid then shrinks.
//
// Failures are reported to tb: t itself, or a recorder that keeps them
// (to show that a broken rule is caught).
func diffMachines(t *testing.T, tb rapid.TB, b *redistest.Backend, pairs []*replayPair, checks int, inner func(string) string, run func(*rapid.T, *redistest.Backend)) {
	ctx := context.Background()
	logKey := "fltest:log:" + rand.Text()
	defer setTestTransform(recording(logKey, inner))()
	rdb := b.Client(t)
	if checks > 0 {
		setFlag(t, "rapid.checks", strconv.Itoa(checks))
	}
	var calls, runs, fast int
	rapid.Check(tb, func(rt *rapid.T) {
		seed := rapid.Uint64().Draw(rt, "resend seed")
		rdb.Del(ctx, logKey)
		run(rt, b)
		history, err := readLog(ctx, rdb, logKey)
		if err != nil {
			rt.Fatal(err)
		}
		calls += len(history)
		runs++
		pause := rapid.Bool().Draw(rt, "pause")
		for i, p := range pairs {
			if err := p.replay(ctx, history, seed, pause); err != nil {
				rt.Fatal(err)
			}
			if i == 0 {
				fast += p.fastCount(ctx) // the replay began on an empty database
			}
		}
	})
	t.Logf("%d histories, %d calls (%d answered by a fast path), replayed on %d backends", runs, calls, fast, len(pairs))
}
