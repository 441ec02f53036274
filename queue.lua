--!df flags=allow-undeclared-keys
-- queue.lua: the model every fairlock script shares (the keys, the
-- members, the clock, and the rule every script obeys) and the call
-- machinery that enforces the rule: begin, the write buffer, apply.
--
-- Each op's script is this file, then the includes, then the op's entry,
-- in this order (scripts.go assembles them; the function library defines
-- the includes once per server and registers one function per entry):
--   lua/rules.lua     the model's rules, each one function: due, next
--                     token, grant TTL, wake list, tombstones, bounds, key
--                     expiry, may grant now
--   lua/members.lua   members, keys and the state row: formats, read and
--                     written only there
--   lua/args.lua      the arguments of acquire and release, parsed once
--   lua/resource.lua  a resource as a script sees it: load, record, finish
--   lua/grant.lua     purges, the queue, grants, wake-ups, enqueue
--   lua/cond.lua      condition variables
--   lua/fast.lua      the fast paths of acquire and release
-- Entries (one per script; KEYS, ARGV and reply in each header):
-- acquire.lua (acquire, try), release.lua (release, renew, leave, wait),
-- lua/ops/refresh.lua, renew_batch.lua, signal.lua, pump.lua, status.lua,
-- leader.lua (an election's record), latch.lua (a countdown latch, whose
-- waiters are condition waiters of a resource of its own), barrier.lua (a
-- cyclic barrier, whose parties are too).
--
-- A script serves one or more semaphores ("resources"); KEYS holds five
-- keys for each, in this order (one resource's keys share one hash tag, so
-- one Cluster slot; a multi-resource request needs all in one slot):
--   <b>:s  hash  layout (LAYOUT, below), cap, used (permits held), nh
--                (holders), nq (waiters), seq (last sequence number),
--                exp (when keys expire, ms), tnext (when the oldest
--                tombstone may be trimmed, ms), hmin (no later than the
--                earliest lease expiry in :h, ms: until then nothing
--                there is due, and no script reads it), lmin (no later
--                than the earliest live liveness deadline below, while
--                anybody waits); zq (the sequence number from which
--                every queued waiter's process has a field whose
--                deadline lmin bounds: such a waiter is alive while
--                lmin is not due, with nothing read; see dead_below);
--                nc (waiters on the condition
--                variables bound to it); o, oe: one holder kept in the
--                hash itself, "ticket permits client token" as in :h, and
--                its lease expiry (ms), so that a semaphore with one
--                holder (every mutex) needs no :h; a grant takes this
--                place when it is free, any other goes to :h;
--                a field whose value is 0 (used, nh, nq, nc) is absent;
--                l KEY_SEP client -> "deadline born" for every process
--                with waiters here (queued or on a condition): their
--                liveness (rules.lua's waiter_alive), which its refresh
--                moves on; the waiters it had before born are dead. A
--                process's waiters die together, and any number of dead
--                waiters cost one waiter TTL; a dead one leaves when it
--                reaches the queue's head, or a signal, its refresh or
--                leave finds it. A field found dead when lmin is read
--                anew (about once per waiter TTL) goes; a process
--                without one has no live waiter here;
--                a ticket in :q has no field: its member there is what a
--                resent acquire (ZADD NX answers 0), a refresh and a
--                leave find;
--                ticket -> "c" followed by the condition's name for every
--                ticket waiting on a condition variable (in <b>/c/...);
--                ticket -> token of every live grant, made at once or
--                announced on a wake list, until its lease ends: what a
--                retried or withdrawn call finds; and ticket -> "x" for a
--                while after a lease or request ends without its holder's
--                release (tombstones), so that a resent call does not act
--                twice. A released ticket leaves no trace: a release sent
--                again, finding neither lease nor tombstone, knows that
--                its first run released it. Tickets are upper-case base32
--                text, so they never clash with the lower-case state
--                fields. An idle semaphore (no holder, waiter or
--                tombstone) keeps only this hash, and only while its
--                sequence needs it or its TTL lasts (keys_exp); one whose
--                sequence is a second old is deleted by the release that
--                leaves it idle.
--   <b>:q  zset  waiters, scored by arrival sequence
--   <b>:d        unused (the waiters' deadlines in layouts 1 and 2): still
--                declared in KEYS, never read or written
--   <b>:h  zset  holders "ticket permits client token" (but the one in o),
--                scored by lease expiry (ms)
--   <b>:t  zset  tombstoned tickets, scored by when they may be forgotten
-- Keys beside these are derived (derived_key in rules.lua): <b>, KEY_SEP,
-- a kind, and KEY_SEP and a payload (written <b>/kind/payload below).
-- A condition variable <cond> bound to the resource (a mutex) has one key
-- more, in its slot, declared after the five by the scripts that know the
-- condition (wait, signal, a waiter's leave) and reached from the "c"
-- marker by a refresh or a purge (see cond_load):
--   <b>/c/<cond>  zset  its waiters, scored by sequence (when they began
--                       to wait), members as in :q; their liveness is
--                       their process's field in :s
-- (<cond> is "" for the default condition). A signalled waiter moves to
-- :q under a new sequence number: behind those already queued, in signal
-- order. A waiter is in :q or in one :c, never both.
-- A waiter is "ticket permits client leaseMs waiterMs". A waiter that asks
-- for several resources at once (a multi-request) is queued in each of
-- them, its member followed by a tab and its group: "base\tpermits\tcap"
-- for every resource, tab-separated, in name order. Names and prefixes
-- contain no control characters, so the tabs are unambiguous.
--
-- A waiting process's wake list (wake_list in rules.lua: its one list on a
-- single node, <b>/w/<client> on Cluster) receives "ticket expiryMs
-- token..." when a grant reaches one of that process's tickets; a
-- multi-request's grant carries one token per resource, on the list of the
-- first. Wake lists, and a multi-request's other resources reached from a
-- queue, are named by the data, so they cannot be declared in KEYS. On
-- Cluster they live in the same slot as the declared keys; a process's one
-- list has a slot of its own, which the functions that push there may
-- reach (allow-cross-slot-keys) on a node that serves every slot.
--
-- All times come from Redis's TIME, never from a client. A lease or a waiter
-- whose time has come is gone, whether or not anyone said so (rules.lua's
-- due).
--
-- THE RULE EVERY SCRIPT OBEYS. Redis does not roll a script back: a script
-- that fails after its first write keeps the half. So:
--   1. A script only reads until it has decided everything. Every change
--      goes into a write buffer (write, expire_at); every check that can
--      fail, every error reply, happens while nothing has been written.
--   2. apply writes the buffer at the end, in calls of at most CHUNK
--      arguments (Redis's Lua refuses unpack of about 8,000 values), adds
--      before removals on each key, with commands that cannot fail for data
--      reasons. "Cannot fail" includes a key of the wrong type, written by
--      another program: every key a script writes or gives a TTL is proven
--      to hold what fairlock keeps there (or nothing) before the first
--      write, by a read of it in this call (seen) or by TYPE (must_be);
--      a fast path may leave one key unproven only if its first write is
--      to that key, so that its failure writes nothing. A key of another
--      type fails the call with FAIRLOCK_FOREIGN_KEY, naming the key,
--      having written nothing (run_entry). So does a state hash that
--      another release of fairlock wrote in a layout of its own
--      (FAIRLOCK_LAYOUT, see LAYOUT): each resource's state is read before
--      anything is written, and the check comes with that read.
--   3. A write that may still be refused goes through redis.pcall and is
--      safe to lose: a wake-up (the waiter's refresh finds its grant), a
--      key's TTL (set again by the next script). A wake list whose push
--      was refused (another program's key) is left as it is. Undeclared
--      resources (a multi-request's others) are probed before use; one
--      that cannot be reached (its slot is migrating) is left alone, and
--      the request waits. Reads after apply use redis.pcall.
--   4. Work is bounded: one script makes at most BUDGET grants, purges and
--      drops. Work left over is reported (more = true) and finished by
--      further scripts; between them the invariants hold (nobody barges a
--      queue that has waiters; permits of leases not yet purged count as
--      used).
-- internal/halfrun's test transform checks rule 1-3 on a real server: a
-- call that fails after a write fails the test; TestForeignKeys puts a
-- value of every other type at every key of every op and checks that the
-- op either refuses, naming that key and changing nothing, or does what it
-- would have done without touching that key.
--
-- miniredis's Lua (gopher-lua) miscomputes "x = f() and y" when x is a
-- local declared before (it takes f's result as true): such an expression
-- goes into a fresh local ("local z = f() and y; x = z").

-- Lua 5.1 (Redis, Valkey) has unpack; Lua 5.4 (Dragonfly) has table.unpack.
local unpack = unpack or table.unpack
-- The scripts' most called built-ins, as locals (a global is a table
-- look-up at every use).
local tonumber, format = tonumber, string.format

local BUDGET = 400     -- grants, purges and drops one script may make
local CHUNK = 256      -- arguments of one write call (even: pairs stay whole)
local PAGE = 64        -- queue members read at once after the first
local TOMB_MS = 20000  -- a tombstone lives between half this and this
local IDLE_MS = 120000 -- an idle semaphore's state lives at most this long
-- KEY_SEP separates the parts of a key derived from a resource's base
-- (derived_key in rules.lua; keySep in keys.go, which a test holds equal):
-- a control character, which no name, condition name, prefix or client
-- holds, so a derived key is never another object's.
local KEY_SEP = '\031'

-- A resource's five keys, in the order KEYS declares them (see above), by
-- name: <b>:s, <b>:q, <b>:h, <b>:t; the third, <b>:d, is unused.
local KS, KQ, KH, KT = 1, 2, 4, 5

-- The state of one call, set by begin. The definitions below are made once
-- per server (at the first call of the function library, see functions.go)
-- or once per script (EVAL), so nothing else may carry over from one call
-- to the next.
local keys          -- the call's KEYS
local now_us, now   -- Redis's time, in microseconds and in milliseconds
local budget        -- grants, purges and drops left
local more          -- work was left for the next script
local writes, wlast, expires, expire_of -- the write buffer
local loaded, by_base                   -- resources read (see load)
local wakes, wake_order                 -- wake-ups to push (see wake)
local proven        -- keys read in this call (seen), or checked (must_be)
-- Keys a call reached that KEYS does not declare (a multi-request's other
-- resources, a condition), key -> the type fairlock keeps there: where
-- run_entry looks for a key of another type.
local reached
-- What a fast path (see fast.acquire) read before it found the general
-- path needed: Redis's clock and the first resource's state, which begin
-- and load take instead of reading them again. Set only by a fast path
-- that returns nil, and taken by the begin that follows at once.
local pre, pre_call

-- FOREIGN starts the error of a call that met a key of another type than
-- fairlock keeps there: "FAIRLOCK_FOREIGN_KEY <found> <kept> <key>".
local FOREIGN = 'FAIRLOCK_FOREIGN_KEY'

-- LAYOUT is the layout of the keys these scripts keep, written in every
-- state hash they create. A state hash whose 'layout' field says another
-- (or that has none: the first layout, of releases before 0.2.0) was
-- written by another release of fairlock; a call that meets one fails
-- with "FAIRLOCK_LAYOUT <found> <kept> <key>" having written nothing, so
-- that releases with different layouts never both act on one semaphore
-- (check_layout checks; run_entry replies). For that, every release keeps
-- its state hash for as long as any other key of the semaphore lives
-- (the first layout refuses a hash whose field names another, too).
local LAYOUT = '3'
local LAYOUT_ERR = 'FAIRLOCK_LAYOUT'

-- type_of returns the type of key, as TYPE names it ('none' if absent).
local function type_of(key)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then t = t.ok end
  return t
end

-- must_be raises the foreign-key error (see run_entry) unless key is
-- absent or holds kind ('hash', 'zset'); it proves key for this call.
local function must_be(key, kind)
  local t = type_of(key)
  if t ~= 'none' and t ~= kind then
    error({ fairlock_foreign = key, found = t, kept = kind })
  end
  if proven then proven[key] = true end
end

-- seen notes that a read of key succeeded in this call, which proves that
-- it holds what fairlock keeps there, or nothing.
local function seen(key)
  if proven then proven[key] = true end
end

-- reach notes an undeclared key (and the type fairlock keeps there) that
-- this call is about to read.
local function reach(key, kind)
  reached = reached or {}
  reached[#reached + 1] = { key, kind }
end

-- unreachable reports whether this call cannot touch key (not declared):
-- its slot is migrating, so any command on it fails. The probe changes
-- nothing.
local function unreachable(key)
  local probe = redis.pcall('EXISTS', key)
  return type(probe) == 'table' and probe.err ~= nil
end

-- Types an entry declares for KEYS that kind_of would not give (an
-- election's record), by index.
local declared_kinds

-- declare_kind says that KEYS[i] holds a value of type kind.
local function declare_kind(i, kind)
  declared_kinds = declared_kinds or {}
  declared_kinds[i] = kind
end

-- kind_of returns the type fairlock keeps at the i-th of n KEYS: five
-- keys per resource (:s a hash, the others sorted sets), then a
-- condition's key, unless the entry declared another.
local function kind_of(i, n)
  if declared_kinds and declared_kinds[i] then return declared_kinds[i] end
  if i <= n - n % 5 and i % 5 == 1 then return 'hash' end
  return 'zset'
end

-- find_foreign returns the first key this call declared or reached that
-- holds another type than fairlock keeps there, with both types.
local function find_foreign(K)
  for i, k in ipairs(K) do
    local kind = kind_of(i, #K)
    local t = type_of(k)
    if t ~= 'none' and t ~= kind then return k, t, kind end
  end
  for _, kk in ipairs(reached or {}) do
    local t = type_of(kk[1])
    if t ~= 'none' and t ~= kk[2] then return kk[1], t, kk[2] end
  end
  return nil
end

-- run_entry runs an entry's body (every entry runs through it) and turns a
-- key of another type, met by a read or by must_be (THE RULE, 2: nothing
-- has been written then), into the error that names it. Any other error is
-- raised again as it came.
local function run_entry(body, K, A)
  reached, proven, declared_kinds = nil, nil, nil
  local ok, res = pcall(body, K, A)
  if ok then return res end
  local key, found, kept
  if type(res) == 'table' and res.fairlock_foreign then
    key, found, kept = res.fairlock_foreign, res.found, res.kept
  elseif type(res) == 'table' and res.fairlock_layout then
    return redis.error_reply(LAYOUT_ERR .. ' ' .. res.found .. ' ' .. LAYOUT .. ' ' .. res.fairlock_layout)
  else
    local msg = res
    if type(res) == 'table' then msg = res.err end
    if type(msg) == 'string' and string.find(msg, 'WRONGTYPE', 1, true) then
      key, found, kept = find_foreign(K)
    end
  end
  if key then
    return redis.error_reply(FOREIGN .. ' ' .. found .. ' ' .. kept .. ' ' .. key)
  end
  -- miniredis reports a raised table by its address; Redis keeps the
  -- table's message.
  if type(res) == 'table' and not redis.REDIS_VERSION then res = res.err end
  error(res, 0)
end

-- set_now takes Redis's TIME reply as the call's clock.
local function set_now(clock)
  now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  now = math.floor(now_us / 1000)
end

-- begin starts a call: every script's first statement. Keys past the
-- last whole group of five (a condition variable's two) are returned, not
-- taken as a resource's.
local function begin(call_keys)
  local extra = {}
  keys = call_keys
  if #call_keys % 5 ~= 0 then
    keys = {}
    local whole = #call_keys - #call_keys % 5
    for i = 1, #call_keys do
      if i <= whole then keys[i] = call_keys[i] else extra[#extra + 1] = call_keys[i] end
    end
  end
  pre_call, pre = pre, nil
  set_now(pre_call and pre_call.clock or redis.call('TIME'))
  budget, more = BUDGET, false
  writes, wlast, expires, expire_of = {}, {}, {}, {}
  loaded, by_base = {}, {}
  wakes, wake_order = {}, {}
  proven = {}
  return extra
end

-- num formats an integer-valued number (or numeric string) without
-- exponent notation.
local function num(x)
  return format('%d', x)
end

-- The write buffer: writes in order, consecutive ones of one command to one
-- key merged; key TTLs apart, last one wins.

local function write(cmd, key, a, b)
  local e = wlast[key]
  if not e or e.cmd ~= cmd then
    e = { cmd = cmd, key = key, args = {}, add = (cmd == 'ZADD' or cmd == 'HSET') }
    writes[#writes + 1] = e
    wlast[key] = e
  end
  local args = e.args
  if a ~= nil then args[#args + 1] = a end
  if b ~= nil then args[#args + 1] = b end
end

local function expire_at(key, at)
  if not expire_of[key] then expires[#expires + 1] = key end
  expire_of[key] = at
end

-- push_to pushes entries onto list to, in calls of at most CHUNK, and
-- reports whether it took them all.
local function push_to(to, entries)
  local n = #entries
  for i = 1, n, CHUNK do
    local res = redis.pcall('RPUSH', to, unpack(entries, i, math.min(i + CHUNK - 1, n)))
    if type(res) ~= 'number' then return false end
  end
  return true
end

-- push_wake pushes entries (a wake-up each) onto wake list list, or, if
-- another program's value holds it, onto fallback (if any), in calls of at
-- most CHUNK; it returns the list that took them, or nil. Wake lists are
-- not declared (losing a wake-up is safe), so they are not proven: a
-- refused push writes nothing.
local function push_wake(list, fallback, entries)
  if push_to(list, entries) then return list end
  if fallback ~= nil and push_to(fallback, entries) then return fallback end
  return nil
end

-- wake buffers the wake-up entry for list (fallback: see wake_list),
-- which must live ttl ms from now.
local function wake(list, fallback, entry, ttl)
  local id = list .. '\n' .. (fallback or '')
  local b = wakes[id]
  if not b then
    b = { list = list, fallback = fallback, entries = {}, ttl = ttl }
    wakes[id] = b
    wake_order[#wake_order + 1] = b
  end
  b.ttl = math.max(b.ttl, ttl)
  b.entries[#b.entries + 1] = entry
end

local apply
do
  -- kind_written returns the type a buffered write's command works on.
  local function kind_written(cmd)
    if cmd == 'HSET' or cmd == 'HDEL' or cmd == 'DEL' then return 'hash' end
    return 'zset'
  end

  -- call_chunks performs buffered write e (a DEL has no arguments).
  local function call_chunks(e)
    local a, n = e.args, #e.args
    if n == 0 then
      redis.call(e.cmd, e.key)
      return
    end
    for i = 1, n, CHUNK do
      redis.call(e.cmd, e.key, unpack(a, i, math.min(i + CHUNK - 1, n)))
    end
  end

  -- apply performs the buffered writes: first it proves every key it will
  -- write or give a TTL (THE RULE, 2); then on each key its additions (they
  -- never touch a member that a removal in the same script names), so no key
  -- is deleted and created again by one script, then the removals, then
  -- TTLs, then the wake-ups. A wake list whose push was refused keeps its
  -- TTL.
  function apply()
    for _, e in ipairs(writes) do
      if not proven[e.key] then must_be(e.key, kind_written(e.cmd)) end
    end
    -- Every key given a TTL is a resource's or a condition's; a state hash
    -- has been read (load).
    for _, key in ipairs(expires) do
      if not proven[key] then must_be(key, 'zset') end
    end
    for _, e in ipairs(writes) do
      if e.add then call_chunks(e) end
    end
    for _, e in ipairs(writes) do
      if not e.add then call_chunks(e) end
    end
    -- A key emptied by this script no longer exists; in a migrating slot
    -- touching it fails, harmlessly.
    for _, key in ipairs(expires) do redis.pcall('PEXPIREAT', key, expire_of[key]) end
    local ttl_of, pushed = {}, {}
    for _, b in ipairs(wake_order) do
      local to = push_wake(b.list, b.fallback, b.entries)
      if to then
        if not ttl_of[to] then pushed[#pushed + 1] = to end
        ttl_of[to] = math.max(ttl_of[to] or 0, b.ttl)
      end
    end
    for _, to in ipairs(pushed) do redis.pcall('PEXPIRE', to, num(ttl_of[to])) end
  end
end

-- more_flag reports, for replies, whether work was left for later scripts.
local function more_flag()
  if more then return 1 end
  return 0
end
