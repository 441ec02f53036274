// Package differential replays recorded histories of the engine's script
// calls twice, call by call, on two empty databases: once with the fast
// paths on and once with them off (testhook.NoFastPaths). After every call
// the two replies and the two databases (every key, every field, member
// and score, every list entry, every key's expiry to the millisecond) must
// be equal: every fast path must do exactly what the general path would do
// in its place.
//
// Histories are recorded from real runs by a transform of the scripts
// ([Recording]) that pushes each call onto a list. A replay must see what
// the recorded run saw, so the clock is the recorded one: each replayed
// script ([Replayed]) reads Redis's TIME from a key that the replay sets
// to the time the recorded call read, and its key expiries are moved a day
// ahead, out of the real clock's reach; before each call the replay
// deletes the keys whose (recorded-clock) expiry has passed, as Redis
// would have. Replies then carry the recorded tokens, and the calls that
// follow (a release naming its lease's token) find what they found in the
// recorded run. Besides the recorded calls, the replay sends some calls
// again, at once or a few calls later, as a client does when a reply is
// lost.
//
// The root package replays histories of its go-redis clients through
// go-redis; internal/conformance records and replays through the client
// under test, so that each client's rendering of arguments and of replies
// meets both paths.
package differential

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/internal/testhook"
	"github.com/redis/go-redis/v9"
)

const (
	// ClockKey holds the recorded clock a replayed script reads.
	ClockKey = "fltest:clock"
	// FastKey counts the replayed calls that took a fast path.
	FastKey = "fltest:fast"
	// ExpiryShift moves a replayed script's key expiries out of the real
	// clock's reach; the replay expires keys itself, by the recorded one.
	ExpiryShift = int64(24 * time.Hour / time.Millisecond)
	// The databases of the real server that replays use.
	ReplayDBFast, ReplayDBGeneral = 14, 15
)

// Call is one recorded script call.
type Call struct {
	Script string   `json:"s"` // its script's name (testhook.EntryName)
	Keys   []string `json:"k"`
	Args   []string `json:"a"`
	Time   []string `json:"t"` // Redis's TIME as the script read it: seconds, microseconds
}

// NowMs is the call's clock in milliseconds, as the scripts compute it.
func (c Call) NowMs() int64 {
	s, _ := strconv.ParseInt(c.Time[0], 10, 64)
	us, _ := strconv.ParseInt(c.Time[1], 10, 64)
	return s*1000 + us/1000
}

// Op is the operation the call asks its script for (ARGV[1]).
func (c Call) Op() string {
	if len(c.Args) == 0 {
		return ""
	}
	return c.Args[0]
}

// Later returns c run ms milliseconds later.
func (c Call) Later(ms int64) Call {
	s, _ := strconv.ParseInt(c.Time[0], 10, 64)
	us, _ := strconv.ParseInt(c.Time[1], 10, 64)
	us += s*1e6 + ms*1000
	c.Time = []string{strconv.FormatInt(us/1e6, 10), strconv.FormatInt(us%1e6, 10)}
	return c
}

// LongestTTL returns the longest lease or waiter TTL (ms) that the
// acquisitions of calls ask for.
func LongestTTL(calls []Call) int64 {
	var most int64 = 1
	for _, c := range calls {
		if op := c.Op(); len(c.Args) > 4 && (op == "acquire" || op == "try") {
			for _, a := range c.Args[3:5] {
				if n, err := strconv.ParseInt(a, 10, 64); err == nil {
					most = max(most, n)
				}
			}
		}
	}
	return most
}

func (c Call) String() string {
	return fmt.Sprintf("%s at %s.%06s: KEYS %q ARGV %q", c.Script, c.Time[0], c.Time[1], c.Keys, c.Args)
}

// Runner runs a call's script (the one that serves its op) with its keys
// and arguments as they are, and returns the reply.
type Runner func(ctx context.Context, c Call) (any, error)

// ClientRunner returns the Runner that runs calls through client (a
// *fairlock.Client; see testhook.RunScript).
func ClientRunner(client any) Runner {
	return func(ctx context.Context, c Call) (any, error) {
		return testhook.RunScript(ctx, client, c.Op(), c.Keys, c.Args)
	}
}

// onLine makes Lua source take no line of its own, so that a transformed
// script keeps its line numbers.
func onLine(lua string) string { return strings.ReplaceAll(lua, "\n", " ") }

// Recording returns a transform (testhook.Transform) that records every call of
// the scripts it is given, after passing them through inner (if not nil):
// when a script first reads Redis's TIME, it pushes the call (script,
// keys, arguments, the time read) onto the list logKey. A script that
// declares no-writes (testhook.NoWrites: a read, such as a status) is not
// recorded, on any server: Redis 7 refuses its every write, and it
// changes nothing.
func Recording(logKey string, inner func(string) string) func(string) string {
	return func(src string) string {
		name := testhook.EntryName(src)
		if name == "" {
			panic("differential: a script it does not know")
		}
		if strings.HasSuffix(name, testhook.BatchSuffix) {
			// A batch holds several calls, which this recording (the
			// first TIME a script reads) would take for one: a recorded
			// client must not batch.
			line, _ := testhook.SplitShebang(src)
			return line + "return redis.error_reply('differential: a batch of calls (WithBatching) is not recorded')"
		}
		if inner != nil {
			src = inner(src)
		}
		if testhook.NoWrites(src) {
			return src
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
		line, body := testhook.SplitShebang(src)
		body = strings.ReplaceAll(body, "redis.call(", "__rec_call(")
		return line + onLine(prelude) + strings.ReplaceAll(body, "redis.pcall(", "__rec_pcall(")
	}
}

// Replayed returns a transform that makes a script run at the recorded
// clock held in ClockKey, with its key expiries moved ExpiryShift ahead
// (see the package's comment), after passing it through inner (if not nil).
func Replayed(inner func(string) string) func(string) string {
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
`, ClockKey, ExpiryShift)
	return func(src string) string {
		if inner != nil {
			src = inner(src)
		}
		line, body := testhook.SplitShebang(src)
		body = strings.ReplaceAll(body, "redis.call(", "__clk_call(")
		body = strings.ReplaceAll(body, "redis.pcall(", "__clk_pcall(")
		return line + onLine(prelude) + body
	}
}

// Compose returns the transform that applies fs in order (nil ones
// skipped).
func Compose(fs ...func(string) string) func(string) string {
	return func(src string) string {
		for _, f := range fs {
			if f != nil {
				src = f(src)
			}
		}
		return src
	}
}

// ReadLog returns the calls recorded on rdb under logKey, and deletes
// them. A recorded call of an op whose script declares no-writes
// (testhook.OpFlags) is an error: Recording leaves those scripts alone.
func ReadLog(ctx context.Context, rdb redis.Cmdable, logKey string) ([]Call, error) {
	raw, err := rdb.LRange(ctx, logKey, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	rdb.Del(ctx, logKey)
	calls := make([]Call, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal([]byte(r), &calls[i]); err != nil {
			return nil, fmt.Errorf("recorded call %d %q: %w", i, r, err)
		}
		if len(calls[i].Time) != 2 {
			return nil, fmt.Errorf("recorded call %d %q has no time", i, r)
		}
		if testhook.OpFlags != nil {
			if flags, _ := testhook.OpFlags(calls[i].Op()); slices.Contains(flags, "no-writes") {
				return nil, fmt.Errorf("recorded call %d (%s): its script declares no-writes, and a recording must add no write to it", i, calls[i])
			}
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

// A Replayer runs recorded calls on one database with the fast paths on or
// off.
type Replayer struct {
	Name string
	// RDB is a go-redis client of the replayer's database, for what the
	// replay reads and writes besides the calls.
	RDB *redis.Client
	Run Runner
	// Debug: the server allows DEBUG DIGEST-VALUE.
	Debug bool
}

// Prepare sets r's database to c's moment: the recorded clock set, and
// the keys due by it expired.
func (r *Replayer) Prepare(ctx context.Context, c Call) error {
	if err := r.RDB.HSet(ctx, ClockKey, "s", c.Time[0], "us", c.Time[1]).Err(); err != nil {
		return err
	}
	return expireScript.Run(ctx, r.RDB, nil, c.NowMs(), ExpiryShift).Err()
}

// Dump renders r's database (see dumpScript) or, for mode "digest", a
// digest of it: on a server that allows DEBUG (the replay server), every
// key's name, type, expiry and content digest (DEBUG DIGEST-VALUE, which
// costs Redis a pass in C rather than one in Lua: crowds hold thousands of
// members); elsewhere the SHA-1 of the rendering.
func (r *Replayer) Dump(ctx context.Context, mode string) (string, error) {
	if mode != "digest" || !r.Debug {
		return dumpScript.Run(ctx, r.RDB, nil, mode, "fltest:").Text()
	}
	keys, err := r.RDB.Keys(ctx, "*").Result()
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
	pipe := r.RDB.Pipeline()
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

// A Pair is two replayers (Backend names where they run): fast
// paths on (their scripts passed through Replayed(Compose(inner,
// CountFast))), and off (Replayed(Compose(inner, testhook.NoFastPaths))),
// where inner is the same for both: a mutation under test, or nil.
type Pair struct {
	Backend       string
	Fast, General *Replayer
	// Mirror, if not nil, runs each call as Fast does through another
	// client: its replies and its database must equal Fast's too.
	Mirror *Replayer
	// Steps counts the calls Step has run (resends included), by op.
	Steps map[string]int
}

// Transforms returns the transforms of a Pair's two sides' scripts (see
// Pair), inner (if not nil) applied first in both.
func Transforms(inner func(string) string) (fast, general func(string) string) {
	return Replayed(Compose(inner, CountFast)), Replayed(Compose(inner, testhook.NoFastPaths))
}

// Step runs c (the stepth call of a run) on both sides of p, compares
// their replies and their databases after it, and returns the reply, or
// an error that shows the difference.
func (p *Pair) Step(ctx context.Context, c Call, step int) (any, error) {
	if p.Steps == nil {
		p.Steps = map[string]int{}
	}
	p.Steps[c.Op()]++
	sides := []*Replayer{p.Fast, p.General}
	if p.Mirror != nil {
		sides = append(sides, p.Mirror)
	}
	replies := make([]string, len(sides))
	var res any
	before, _ := p.General.Dump(ctx, "")
	for j, r := range sides {
		if err := r.Prepare(ctx, c); err != nil {
			return nil, fmt.Errorf("%s: preparing step %d: %w", p.Backend, step, err)
		}
		out, err := r.Run(ctx, c)
		if err != nil && !strings.Contains(err.Error(), "FAIRLOCK_") {
			// Two sides that fail alike are no proof: a script that does
			// not compile, or breaks, fails the replay.
			return nil, fmt.Errorf("%s: step %d: %s\n%s: %w", p.Backend, step, c, r.Name, err)
		}
		replies[j] = render(out, err, p.Mirror != nil)
		if j == 0 {
			res = out
		}
	}
	for j := 1; j < len(sides); j++ {
		if replies[j] != replies[0] {
			return nil, fmt.Errorf("%s: step %d: %s\nreplies differ:\n  %s: %s\n  %s: %s\nbefore:\n%s",
				p.Backend, step, c, sides[0].Name, replies[0], sides[j].Name, replies[j], before)
		}
	}
	digests := make([]string, len(sides))
	for j, r := range sides {
		d, err := r.Dump(ctx, "digest")
		if err != nil {
			return nil, fmt.Errorf("%s: dump after step %d: %w", p.Backend, step, err)
		}
		digests[j] = d
	}
	for j := 1; j < len(sides); j++ {
		if digests[j] != digests[0] {
			a, _ := sides[0].Dump(ctx, "")
			b, _ := sides[j].Dump(ctx, "")
			return nil, fmt.Errorf("%s: step %d: %s\nreply %s\nthe databases differ (%s -, %s +):\n%s\nbefore the call:\n%s",
				p.Backend, step, c, replies[0], sides[0].Name, sides[j].Name, LineDiff(a, b), before)
		}
	}
	return res, nil
}

// render renders a reply and its error for comparison. Where a Pair has a
// mirror (another client), an error is compared by the engine's words only (from
// FAIRLOCK_ to the end of Redis's message, before the script's name),
// since each client wraps Redis's error reply in its own text.
func render(out any, err error, mirror bool) string {
	if err != nil && mirror {
		msg := err.Error()
		if i := strings.Index(msg, "FAIRLOCK_"); i >= 0 {
			msg = msg[i:]
		}
		msg, _, _ = strings.Cut(msg, " script:")
		return fmt.Sprintf("%#v (error %s)", out, msg)
	}
	return fmt.Sprintf("%#v (error %v)", out, err)
}

// fastTaken is how a script returns a fast path's answer.
const fastTaken = "if out then return out end"

// CountFast makes a script count, in FastKey, the calls that a fast path
// answers (acquire's and release's have fast paths, the others none).
func CountFast(src string) string {
	if e := testhook.EntryName(src); (e == "acquire" || e == "release") && !strings.Contains(src, fastTaken) {
		panic("differential: no fast path's return to count (" + fastTaken + ") in " + e)
	}
	return strings.ReplaceAll(src, fastTaken, "if out then redis.call('INCR', '"+FastKey+"') return out end")
}

// FastCount returns how many replayed calls a fast path has answered.
func (p *Pair) FastCount(ctx context.Context) int {
	n, _ := p.Fast.RDB.Get(ctx, FastKey).Int()
	return n
}

// Replay runs calls on both sides of p, sending some again (drawn from
// seed), with a pause before one acquisition or release when pause is
// set, and returns an error describing the first difference.
func (p *Pair) Replay(ctx context.Context, calls []Call, seed uint64, pause bool) error {
	for _, r := range []*Replayer{p.Fast, p.General, p.Mirror} {
		if r == nil {
			continue
		}
		if err := r.RDB.FlushDB(ctx).Err(); err != nil {
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
		if op := c.Op(); op == "acquire" || op == "try" || op == "release" {
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
			pauseMs = p.choosePause(ctx, c, rng, LongestTTL(calls))
			what = fmt.Sprintf(" (after a pause of %d ms)", pauseMs)
		}
		if at >= pauseAt {
			c = c.Later(pauseMs)
		}
		_, err := p.Step(ctx, c, step)
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
func (p *Pair) choosePause(ctx context.Context, c Call, rng *mrand.Rand, longest int64) int64 {
	now := c.NowMs()
	if rng.IntN(4) != 0 {
		var next []int64
		for _, k := range c.Keys {
			zs, err := p.Fast.RDB.ZRangeByScoreWithScores(ctx, k, &redis.ZRangeBy{
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

// LineDiff shows the lines of two dumps that differ, fast paths on (-)
// against off (+).
func LineDiff(a, b string) string {
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
