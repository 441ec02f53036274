--!df flags=allow-undeclared-keys
-- queue.lua: the ticket queue that every fairlock script shares.
--
-- fairlock prepends this file to acquire.lua and release.lua, so every state
-- change runs as one script that sees the same model and the same grant rule.
--
-- A script serves one or more semaphores ("resources"); KEYS holds five
-- keys for each, in this order (one resource's keys share one hash tag, so
-- one Cluster slot; a multi-resource request needs all in one slot):
--   <b>:s  hash  cap, used (permits held), nh (holders), nq (waiters),
--                seq (last sequence number), exp (when keys expire, ms),
--                tnext (when the oldest tombstone may be trimmed, ms),
--                hmin, dmin (no later than the earliest lease expiry in
--                :h and the earliest waiter deadline in :d, ms: until
--                then nothing there is due, and no script reads them);
--                nc (waiters on the condition variables bound to it);
--                ticket -> "q" for every ticket in :q (what a resent
--                acquire and a refresh find);
--                ticket -> "c" followed by the condition's name for every
--                ticket waiting on a condition variable (in :c...);
--                ticket -> token of every live grant made at once, until
--                released, and of every grant announced on a wake list,
--                until its process confirms it: what a retried or
--                withdrawn call finds; and ticket -> "r" (released) or
--                "x" (ended otherwise) for a while after a lease ends
--                (tombstones), so that a resent call does not act twice.
--                Tickets are upper-case base32 text, so they never clash
--                with the lower-case state fields.
--   <b>:q  zset  waiters, scored by arrival sequence
--   <b>:d  zset  the same waiters, scored by liveness deadline (ms)
--   <b>:h  zset  holders "ticket permits client token", scored by lease
--                expiry (ms)
--   <b>:t  zset  tombstoned tickets, scored by when they may be forgotten
-- A condition variable <cond> bound to the resource (a mutex) has two keys
-- more, in its slot, declared after the five by the scripts that know the
-- condition (wait, signal, a waiter's leave) and reached from the "c"
-- marker by a refresh (see cond_load):
--   <b>:c[:<cond>]  zset  its waiters, scored by sequence (when they began
--                         to wait), members as in :q
--   <b>:e[:<cond>]  zset  the same waiters, scored by liveness deadline (ms)
-- (no ":<cond>" for the condition named ""). A signalled waiter moves to
-- :q under a new sequence number: behind those already queued, in signal
-- order.
-- A waiter is "ticket permits client leaseMs waiterMs". A waiter that asks
-- for several resources at once (a multi-request) is queued in each of
-- them, its member followed by a tab and its group: "base\tpermits\tcap"
-- for every resource, tab-separated, in name order. Names and prefixes
-- contain no control characters, so the tabs are unambiguous.
--
-- Wake lists <b>:w:<client> (one per waiting process) receive "ticket
-- expiryMs token..." when a grant reaches one of that process's tickets; a
-- multi-request's grant carries one token per resource, on the list of the
-- first. Wake lists, and a multi-request's other resources reached from a
-- queue, are named by the data, so they cannot be declared in KEYS; they
-- live in the same slot as the declared keys.
--
-- All times come from Redis's TIME, never from a client. A lease or a waiter
-- whose time has come (expiry <= now) is gone, whether or not anyone said so.
--
-- THE RULE EVERY SCRIPT OBEYS. Redis does not roll a script back: a script
-- that fails after its first write keeps the half. So:
--   1. A script only reads until it has decided everything. Every change
--      goes into a write buffer (write, expire_at); every check that can
--      fail, every error reply, happens while nothing has been written.
--   2. apply writes the buffer at the end, in calls of at most CHUNK
--      arguments (Redis's Lua refuses unpack of about 8,000 values), adds
--      before removals on each key, with commands that cannot fail for data
--      reasons on keys the script has read or declared.
--   3. A write that may still be refused goes through redis.pcall and is
--      safe to lose: a wake-up (the waiter's refresh finds its grant), a
--      key's TTL (set again by the next script). Undeclared resources (a
--      multi-request's others) are probed before use; one that cannot be
--      reached (its slot is migrating) is left alone, and the request
--      waits. Reads after apply use redis.pcall.
--   4. Work is bounded: one script makes at most BUDGET grants, purges and
--      drops. Work left over is reported (more = true) and finished by
--      further scripts; between them the invariants hold (nobody barges a
--      queue that has waiters; permits of leases not yet purged count as
--      used).
-- internal/halfrun's test transform checks rule 1-3 on a real server: a
-- call that fails after a write fails the test.

-- Lua 5.1 (Redis, Valkey) has unpack; Lua 5.4 (Dragonfly) has table.unpack.
local unpack = unpack or table.unpack

-- FAST_PATHS lets the commonest calls take their fast path (see
-- fast_acquire). internal/scripthook.NoFastPaths turns it off in tests, so
-- that every call takes the general path and the two can be compared.
local FAST_PATHS = true

local BUDGET = 400     -- grants, purges and drops one script may make
local CHUNK = 256      -- arguments of one write call (even: pairs stay whole)
local PAGE = 64        -- queue members read at once after the first
local TOMB_MS = 20000  -- a tombstone lives between half this and this

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
local wakes, wake_lists                 -- wake-ups to push, by list
-- What a fast path (see fast_acquire) read before it found the general
-- path needed: Redis's clock and the first resource's state, which begin
-- and load take instead of reading them again. Set only by a fast path
-- that returns nil, and taken by the begin that follows at once.
local pre, pre_call

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
  wakes, wake_lists = {}, {}
  return extra
end

-- num formats an integer-valued number (or numeric string) without
-- exponent notation.
local function num(x)
  return string.format('%d', x)
end

-- The write buffer: writes in order, consecutive ones of one command to one
-- key merged; key TTLs apart, last one wins.

local function write(cmd, key, a, b)
  local e = wlast[key]
  if not e or e.cmd ~= cmd then
    e = { cmd = cmd, key = key, args = {}, add = (cmd == 'ZADD' or cmd == 'HSET' or cmd == 'RPUSH') }
    writes[#writes + 1] = e
    wlast[key] = e
  end
  local args = e.args
  args[#args + 1] = a
  if b ~= nil then args[#args + 1] = b end
end

local function expire_at(key, at, rel)
  if not expire_of[key] then expires[#expires + 1] = key end
  expire_of[key] = { at = at, rel = rel }
end

local function call_chunks(e)
  local a, n = e.args, #e.args
  for i = 1, n, CHUNK do
    local j = math.min(i + CHUNK - 1, n)
    if e.cmd == 'RPUSH' then
      -- A wake list is undeclared: losing a wake-up is safe.
      redis.pcall(e.cmd, e.key, unpack(a, i, j))
    else
      redis.call(e.cmd, e.key, unpack(a, i, j))
    end
  end
end

-- apply performs the buffered writes: on each key its additions first (they
-- never touch a member that a removal in the same script names), so no key
-- is deleted and created again by one script, then the removals, then TTLs.
local function apply()
  for _, e in ipairs(writes) do
    if e.add then call_chunks(e) end
  end
  for _, e in ipairs(writes) do
    if not e.add then call_chunks(e) end
  end
  for _, key in ipairs(expires) do
    local x = expire_of[key]
    -- A key emptied by this script no longer exists; in a migrating slot
    -- touching it fails, harmlessly.
    if x.rel then
      redis.pcall('PEXPIRE', key, x.at)
    else
      redis.pcall('PEXPIREAT', key, x.at)
    end
  end
end

local function waiter_member(ticket, n, client, lease, wait, group)
  local m = ticket .. ' ' .. num(n) .. ' ' .. client .. ' ' .. num(lease) .. ' ' .. num(wait)
  if group and group ~= '' then m = m .. '\t' .. group end
  return m
end

-- holder_member takes permits and token already formatted.
local function holder_member(ticket, ns, client, ts)
  return ticket .. ' ' .. ns .. ' ' .. client .. ' ' .. ts
end

-- parse_group reads a multi-request's group into its parts {base, n, cap}.
local function parse_group(group)
  local parts, f = {}, {}
  for x in string.gmatch(group, '[^\t]+') do f[#f + 1] = x end
  for i = 1, #f - 2, 3 do
    parts[#parts + 1] = { base = f[i], n = tonumber(f[i + 1]), cap = tonumber(f[i + 2]) }
  end
  return parts
end

local function parse_waiter(m)
  local tab = string.find(m, '\t', 1, true)
  local head = m
  if tab then head = string.sub(m, 1, tab - 1) end
  local ticket, n, client, lease, wait = string.match(head, '^(%S+) (%d+) (%S+) (%d+) (%d+)$')
  if not ticket then return nil end
  local w = { ticket = ticket, n = tonumber(n), ns = n, client = client, lease = tonumber(lease), wait = tonumber(wait) }
  if tab then
    w.group = string.sub(m, tab + 1)
    w.parts = parse_group(w.group)
  end
  return w
end

-- read_state reads resource state hash S and ticket's field in it: cap,
-- used, nh, nq, seq, exp, tnext, hmin, dmin, nc, then the ticket's.
local function read_state(S, ticket)
  return redis.call('HMGET', S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'dmin', 'nc', ticket)
end

-- counts returns, from a state row read by read_state, the capacity (nil
-- if unknown), permits used, holders, waiters and the last sequence number.
local function counts(st)
  return tonumber(st[1]), tonumber(st[2]) or 0, tonumber(st[3]) or 0, tonumber(st[4]) or 0, tonumber(st[5]) or 0
end

-- Resources are loaded once per script, into tables that hold their state
-- until finish buffers it for writing (loaded, by_base).

-- rebuild recounts a resource's state from its sorted sets, should its state
-- hash be missing while they are not (it is never evicted alone under
-- noeviction). It reads every holder: a recovery path, not a common one.
local function rebuild(r)
  if r.cap or redis.call('EXISTS', r.H, r.Q) == 0 then return end
  r.nh, r.nq, r.used = redis.call('ZCARD', r.H), redis.call('ZCARD', r.Q), 0
  for _, m in ipairs(redis.call('ZRANGE', r.H, 0, -1)) do
    r.used = r.used + (tonumber(string.match(m, '^%S+ (%d+)')) or 0)
  end
  r.nh0, r.nq0, r.used0 = 0, 0, 0
  r.hmin, r.dmin = nil, nil
  r.wrote_h, r.wrote_q = true, r.nq > 0
end

-- load returns the resource with key base base, reading its state on first
-- use. k is the index in KEYS of its first key, if it was declared; ticket,
-- if given, is looked up in its grants (r.grant). An undeclared resource
-- whose keys this node cannot serve now (its slot is migrating) comes back
-- with r.off set and no state: nothing may be granted on it or written to
-- it in this script.
local function load(base, k, ticket)
  local r = by_base[base]
  if r then return r end
  local S, Q, D, H, T
  if k then
    S, Q, D, H, T = keys[k], keys[k + 1], keys[k + 2], keys[k + 3], keys[k + 4]
  else
    S, Q, D, H, T = base .. ':s', base .. ':q', base .. ':d', base .. ':h', base .. ':t'
    local probe = redis.pcall('EXISTS', S, Q, D, H, T)
    if type(probe) == 'table' and probe.err then
      r = { base = base, off = true, nq = 0, nh = 0, used = 0 }
      by_base[base] = r
      return r
    end
  end
  local st, grant
  if ticket then
    if pre_call and pre_call.S == S then
      st = pre_call.st
    else
      st = read_state(S, ticket)
    end
    grant = st[11]
  else
    st = redis.call('HMGET', S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'dmin', 'nc')
  end
  local nc = tonumber(st[10]) or 0
  local cap, used, nh, nq, seq = counts(st)
  -- A bound read with nobody behind it is stale: nothing is due there.
  local hmin0, dmin0 = tonumber(st[8]), tonumber(st[9])
  local hmin, dmin = hmin0, dmin0
  if nh <= 0 then hmin = math.huge end
  if nq <= 0 then dmin = math.huge end
  -- One constructor with every field: growing a table field by field
  -- costs more than the rest of this function.
  r = {
    base = base, S = S, Q = Q, D = D, H = H, T = T, grant = grant,
    cap = cap, used = used, nh = nh, nq = nq, seq = seq, exp = tonumber(st[6]) or 0,
    nc = nc, nc0 = nc, conds = {}, conds_by = {}, -- condition waiters; conditions loaded (cond_load)
    tnext = tonumber(st[7]), had_t = (tonumber(st[7]) or 0) > 0,
    -- Bounds (see hmin, dmin above): nil unknown, math.huge nothing there.
    -- hbuf, dbuf: the earliest score this script adds (buffered).
    hmin = hmin, dmin = dmin, hbuf = math.huge, dbuf = math.huge,
    -- as read, to write back only what changed
    used0 = used, nh0 = nh, nq0 = nq, seq0 = seq, hmin0 = hmin0, dmin0 = dmin0,
    horizon = 0, -- latest deadline written by this script
    -- Keys this script added members to, which may have been created (or
    -- emptied and created again) here and so have no TTL yet.
    wrote_h = false, wrote_q = false, wrote_t = false,
    hpurged = false, wpurged = false, newcap = false,
    -- Grants to record (ticket -> token), tombstone (ticket -> 'r' or
    -- 'x') or forget (ticket -> false) in S, and their order.
    grants = {}, gorder = {},
    -- Members this script removed (buffered), which reads still return.
    hgone = {}, qgone = {},
    -- The queue as read so far: page, position in it, members read.
    page = nil, pos = 1, qread = 0,
  }
  rebuild(r)
  by_base[base] = r
  loaded[#loaded + 1] = r
  return r
end

-- declared returns the resources whose keys the caller passed in KEYS,
-- looking ticket up in each.
local function declared(ticket)
  local rs = {}
  for i = 1, #keys, 5 do
    rs[#rs + 1] = load(string.sub(keys[i], 1, -3), i, ticket)
  end
  return rs
end

-- record notes a grant's token (a string), a tombstone ('r' released, 'x'
-- ended otherwise) or forgets the ticket (false); finish buffers it.
local function record(r, ticket, v)
  if r.grants[ticket] == nil then r.gorder[#r.gorder + 1] = ticket end
  r.grants[ticket] = v
end

-- time_at buffers member m's time at in the holders' expiries ('h') or
-- the waiters' deadlines ('d'), keeping that zset's bounds (hmin or dmin,
-- and hbuf or dbuf: the earliest time this script writes) no later than
-- the earliest.
local function time_at(r, z, at, m)
  local key, bound, buf = r.H, 'hmin', 'hbuf'
  if z == 'd' then key, bound, buf = r.D, 'dmin', 'dbuf' end
  write('ZADD', key, num(at), m)
  if at < r[buf] then r[buf] = at end
  if r[bound] and at < r[bound] then r[bound] = at end
  r.horizon = math.max(r.horizon, at)
end

-- hold_at buffers a holder's expiry; wait_at a waiter's deadline.
local function hold_at(r, at, m) time_at(r, 'h', at, m) end
local function wait_at(r, at, m) time_at(r, 'd', at, m) end

-- next_seq hands out the next number of a resource's one sequence, used
-- both as arrival order and as fencing token. It is at least the current
-- time in microseconds, so it keeps increasing after the state hash is gone:
-- the hash lives until a second after Redis's clock passes the last number.
local function next_seq(r)
  r.seq = math.max(r.seq + 1, now_us)
  return r.seq
end

-- drop_holder forgets a lease of n permits (n is read from the member
-- when not given), frees its permits and leaves a tombstone (tomb: 'r'
-- when its holder released it, 'x' otherwise).
local function drop_holder(r, m, n, tomb)
  if r.hgone[m] then return end
  r.hgone[m] = true
  write('ZREM', r.H, m)
  local ticket = string.match(m, '^%S+')
  if not n then n = tonumber(string.match(m, '^%S+ (%d+)')) or 0 end
  r.used = r.used - n
  r.nh = r.nh - 1
  record(r, ticket, tomb or 'x')
end

-- read_due returns the members of zset key whose time (score) has come,
-- at most the budget left, and a new bound on its earliest score, given
-- bound (no later than its earliest score; nil unknown) and buf (the
-- earliest score this script adds to it). Nothing is read while the bound
-- has not passed.
local function read_due(key, bound, buf)
  if bound and bound > now then return {}, bound end
  if budget <= 0 then
    more = true
    return {}, bound
  end
  local due = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, budget)
  if #due >= budget then
    more = true
    return due, bound
  end
  -- The first member not due bounds the rest.
  local nxt = redis.call('ZRANGE', key, #due, #due, 'WITHSCORES')
  return due, math.min(tonumber(nxt[2]) or math.huge, buf)
end

-- purge_holders drops leases whose expiry has passed, at most the budget
-- left. Time stands still while a script runs, so once per script is
-- enough, unless the budget ran out.
local function purge_holders(r)
  if r.nh <= 0 or r.hpurged or r.off then return end
  r.hpurged = true
  local due
  due, r.hmin = read_due(r.H, r.hmin, r.hbuf)
  for _, m in ipairs(due) do
    if not r.hgone[m] then
      budget = budget - 1
      drop_holder(r, m)
    end
  end
end

-- unqueue takes waiter m out of one resource's queue. known says m was read
-- from that queue; otherwise it is looked up first.
local function unqueue(r, m, known)
  if r.qgone[m] or r.off then return end
  if not known and not redis.call('ZSCORE', r.Q, m) then return end
  r.qgone[m] = true
  write('ZREM', r.Q, m)
  write('ZREM', r.D, m)
  r.nq = r.nq - 1
  record(r, string.match(m, '^%S+'), false)
end

-- drop_waiter takes waiter w out of every queue it is in (r, where it was
-- read, and its group's others).
local function drop_waiter(r, m, w)
  unqueue(r, m, true)
  for _, p in ipairs(w.parts) do
    if p.base ~= r.base then
      unqueue(load(p.base), waiter_member(w.ticket, p.n, w.client, w.lease, w.wait, w.group), false)
    end
  end
end

-- purge_waiters drops waiters whose process stopped refreshing, at most the
-- budget left. Each deadline is absolute and its own: a dead waiter never
-- pushes anybody else's deadline later, so any number of dead waiters cost
-- one TTL.
local function purge_waiters(r)
  if r.nq <= 0 or r.wpurged or r.off then return end
  r.wpurged = true
  local due
  due, r.dmin = read_due(r.D, r.dmin, r.dbuf)
  local fresh = r.fresh or {}
  for _, m in ipairs(due) do
    -- A waiter refreshed by this script is not due (its new deadline is
    -- still in the buffer).
    if not r.qgone[m] and not fresh[m] then
      budget = budget - 1
      local w = parse_waiter(m)
      if w and w.parts then
        drop_waiter(r, m, w)
      else
        unqueue(r, m, true)
      end
    end
  end
end

-- hold records a lease of n permits (ns, formatted) of r for ticket,
-- lasting ttl ms, and returns its token, formatted.
local function hold(r, ticket, n, ns, client, ttl)
  local ts = num(next_seq(r))
  hold_at(r, now + ttl, holder_member(ticket, ns, client, ts))
  record(r, ticket, ts)
  -- Holders added to a key that held some are never all removed by one
  -- script (adds go first), so the key keeps its TTL.
  if r.nh0 <= 0 then r.wrote_h = true end
  r.used = r.used + n
  r.nh = r.nh + 1
  return ts
end

-- fits reports whether n more permits of r fit now, purging expired leases
-- if that is what it takes.
local function fits(r, n)
  if not r.cap or r.off then return false end
  if r.used + n > r.cap then purge_holders(r) end
  return r.used + n <= r.cap
end

-- head returns the first live waiter of r's queue and its member. The queue
-- is read in pages; members this script removed are skipped.
local function head(r)
  purge_waiters(r)
  if r.nq <= 0 or r.off then return nil end
  while true do
    local page = r.page
    if page then
      while r.pos <= #page do
        local m = page[r.pos]
        if not r.qgone[m] then return m, parse_waiter(m) end
        r.pos = r.pos + 1
      end
      if #page < r.want then
        -- The queue ended: the counter had drifted.
        r.nq = 0
        return nil
      end
    end
    -- The first read takes the head alone (the common case); later ones
    -- take a page.
    local size = 1
    if page then size = PAGE end
    r.want = size
    r.page = redis.call('ZRANGE', r.Q, r.qread, r.qread + size - 1)
    r.qread = r.qread + #r.page
    r.pos = 1
  end
end

-- ready reports whether multi-request w, at the head of one of its
-- queues, is at the head of all of them and fits in all of them. A
-- request missing from one of its queues (dropped there as dead while its
-- refresh could not reach that queue) can never be granted: ready reports
-- it broken, and it is dropped; its process queues it again.
local function ready(w)
  for _, p in ipairs(w.parts) do
    local r = load(p.base)
    if r.off then return false end
    -- A resource whose state was lost takes the capacity the group
    -- records.
    if not r.cap and r.nq > 0 then r.cap, r.newcap = p.cap, true end
    local m = head(r)
    local want = waiter_member(w.ticket, p.n, w.client, w.lease, w.wait, w.group)
    if m ~= want then
      if r.qgone[want] or not redis.call('ZSCORE', r.Q, want) then return false, true end
      return false
    end
    if not fits(r, p.n) then return false end
  end
  return true
end

-- announce grants waiter w (already out of its queues) everything it asked
-- for, and tells its process on the wake list of its first resource. An
-- announced grant lasts only the waiter TTL until its process confirms it
-- by renewing, so a grant that reaches a process that has just died delays
-- the queue by one waiter TTL, not one lease TTL.
local function announce(w, parts)
  local ttl = math.min(w.lease, w.wait)
  local tokens = {}
  for i, p in ipairs(parts) do
    tokens[i] = hold(load(p.base), w.ticket, p.n, p.ns or num(p.n), w.client, ttl)
  end
  local list = parts[1].base .. ':w:' .. w.client
  if not wakes[list] then
    wakes[list] = ttl
    wake_lists[#wake_lists + 1] = list
  end
  wakes[list] = math.max(wakes[list], ttl)
  write('RPUSH', list, w.ticket .. ' ' .. num(now + ttl) .. ' ' .. table.concat(tokens, ' '))
end

-- pump grants r's waiting tickets strictly in arrival order while the head
-- fits. A head that does not fit stops the loop even when a later, smaller
-- ticket would fit: letting that one pass is barging, and a stream of small
-- requests could then starve a large one forever. A multi-request at the
-- head is granted only when it heads every one of its queues and fits in
-- all of them at once; it never holds a part while it waits for the rest.
-- Every queue orders all requests by when their scripts ran, so the
-- earliest waiting request heads all its queues, and waits only for leases
-- to end: nothing waits in a cycle. Returns the other resources a grant
-- changed, whose queues may move now.
local function pump(r)
  local touched = {}
  if not r.cap or r.off then return touched end
  while true do
    -- Full: no waiter can be granted, so none is read.
    if r.used >= r.cap then
      purge_holders(r)
      if r.used >= r.cap then break end
    end
    local m, w = head(r)
    if not m then break end
    if budget <= 0 then
      more = true
      break
    end
    if not w then
      unqueue(r, m, true) -- not a waiter fairlock wrote
    elseif w.parts then
      local ok, broken = ready(w)
      if broken then
        drop_waiter(r, m, w)
      else
        if not ok then break end
        drop_waiter(r, m, w)
        announce(w, w.parts)
        for _, p in ipairs(w.parts) do
          if p.base ~= r.base then touched[#touched + 1] = load(p.base) end
        end
      end
    else
      if not fits(r, w.n) then break end
      unqueue(r, m, true)
      announce(w, { { base = r.base, n = w.n, ns = w.ns } })
    end
    budget = budget - 1
  end
  return touched
end

-- run_queues pumps the given resources, and every resource a grant on them
-- changed, until no queue can move or the budget is spent.
local function run_queues(rs)
  local todo = {}
  for i, r in ipairs(rs) do todo[i] = r end
  local i = 1
  while i <= #todo do
    for _, r in ipairs(pump(todo[i])) do todo[#todo + 1] = r end
    i = i + 1
  end
end

-- trim_due reports whether a tombstone trim is due, by tnext (when the
-- oldest tombstone may be trimmed; 0 or nil for none).
local function trim_due(tnext)
  return tnext ~= nil and tnext > 0 and tnext <= now
end

-- trim_tombstones forgets tombstones whose time has come, when the oldest
-- one's has (tnext); each trim takes those due within half a lifetime, so
-- trims are rare.
local function trim_tombstones(r)
  if r.off or not trim_due(r.tnext) or budget <= 0 then return end
  local limit = budget
  local due = redis.call('ZRANGEBYSCORE', r.T, '-inf', now + TOMB_MS / 2, 'LIMIT', 0, limit)
  for _, t in ipairs(due) do
    budget = budget - 1
    -- A ticket this script changes again keeps its entry.
    if r.grants[t] == nil then
      write('ZREM', r.T, t)
      record(r, t, false)
    end
  end
  if #due >= limit then
    r.tnext = now -- more are due: the next script goes on
    more = true
  else
    local nxt = redis.call('ZRANGE', r.T, #due, #due, 'WITHSCORES')
    r.tnext = tonumber(nxt[2])
  end
  r.tnext_set = true
end

-- keys_exp returns when a resource's keys are to expire (ms), given when
-- they do now (exp), the latest deadline they hold (horizon), the last
-- sequence number, and whether the resource is idle. The keys move only
-- when they must, or when they would otherwise live long past the need:
-- most scripts set no TTL.
local function keys_exp(exp, horizon, seq, idle)
  -- The sequence is kept until Redis's clock passes its last number.
  local need = math.max(horizon, math.floor(seq / 1000) + 1000)
  if idle then
    -- The queue and holders are empty, so Redis has deleted those keys
    -- (or will, when the buffer is applied). The state hash stays for the
    -- sequence and the tombstones, and at most half a tombstone's life
    -- longer.
    if exp < need or exp > need + TOMB_MS / 2 then return need + TOMB_MS / 4 end
    return exp
  end
  -- Move the horizon well past what is needed, so that renewals seldom
  -- have to move it again.
  if need > exp then return math.max(exp, need + math.max(need - now, 1000)) end
  return exp
end

-- put adds field = v to the field list f when v differs from v0.
local function put(f, field, v, v0)
  if v ~= v0 then
    f[#f + 1] = field
    f[#f + 1] = num(v)
  end
end

-- finish_one buffers what changed of a resource's state, and keeps its
-- keys alive until the last deadline they hold. A semaphore with no holders
-- and no waiters keeps only its state hash (for the sequence, and its
-- tombstones) and only for a second past the sequence.
local function finish_one(r)
  if r.off then return end
  trim_tombstones(r)
  local changed = false
  for _, t in ipairs(r.gorder) do
    local v = r.grants[t]
    if v == 'r' or v == 'x' then
      -- A tombstone: forgotten with the index's entry.
      write('HSET', r.S, t, v)
      write('ZADD', r.T, num(now + TOMB_MS), t)
      if not r.had_t then r.wrote_t = true end
      r.horizon = math.max(r.horizon, now + TOMB_MS)
      if not r.tnext or r.tnext == 0 or r.tnext > now + TOMB_MS then r.tnext, r.tnext_set = now + TOMB_MS, true end
    elseif v then
      write('HSET', r.S, t, v)
    else
      write('HDEL', r.S, t)
    end
    changed = true
  end
  local f = {}
  if r.newcap then put(f, 'cap', r.cap or 0, nil) end
  put(f, 'used', r.used, r.used0)
  put(f, 'nh', r.nh, r.nh0)
  put(f, 'nq', r.nq, r.nq0)
  put(f, 'seq', r.seq, r.seq0)
  put(f, 'nc', r.nc, r.nc0)
  if r.tnext_set then put(f, 'tnext', r.tnext or 0, nil) end
  if r.nh > 0 and r.hmin and r.hmin < math.huge then put(f, 'hmin', r.hmin, r.hmin0) end
  if r.nq > 0 and r.dmin and r.dmin < math.huge then put(f, 'dmin', r.dmin, r.dmin0) end
  local idle = r.nh <= 0 and r.nq <= 0 and r.nc <= 0
  local exp = r.exp
  if not idle or #f > 0 or changed then exp = keys_exp(r.exp, r.horizon, r.seq, idle) end
  local moved = exp ~= r.exp
  -- A condition's keys written here live as long as the state hash, which
  -- holds its waiters' markers (and lives past their deadlines).
  for _, cv in ipairs(r.conds) do
    if cv.wrote then
      expire_at(cv.C, num(exp))
      expire_at(cv.E, num(exp))
    end
  end
  if #f == 0 and not changed and not (moved or r.wrote_h or r.wrote_q or r.wrote_t) then return end
  local at = num(exp)
  if moved then
    f[#f + 1] = 'exp'
    f[#f + 1] = at
  end
  for i = 1, #f, 2 do write('HSET', r.S, f[i], f[i + 1]) end
  if moved then expire_at(r.S, at) end
  if moved or r.wrote_t then expire_at(r.T, at) end
  if idle then return end
  if moved or r.wrote_h then expire_at(r.H, at) end
  if moved or r.wrote_q then
    expire_at(r.Q, at)
    expire_at(r.D, at)
  end
end

-- finish buffers every loaded resource's state and the wake-ups, then
-- applies the buffer. Nothing may fail after it.
local function finish()
  for _, r in ipairs(loaded) do finish_one(r) end
  for _, list in ipairs(wake_lists) do expire_at(list, num(wakes[list]), true) end
  apply()
end

-- next_event returns the milliseconds until the earliest lease expiry or
-- waiter deadline of the resources this script loaded, when a queue may
-- move without anybody releasing, or -1 for none or overdue; 0 when work
-- was left over. It runs
-- after finish, so its reads may not fail: a key it cannot read tells
-- nothing.
local function next_event()
  if more then return 0 end
  local at = nil
  -- A bound that is unknown, or passed (stale: what it bounded may have
  -- moved on), is read; reads after apply may not fail.
  local function first(bound, key)
    if not bound or bound <= now then
      local x = redis.pcall('ZRANGE', key, 0, 0, 'WITHSCORES')
      bound = type(x) == 'table' and tonumber(x[2])
    end
    if bound and bound < math.huge and (at == nil or bound < at) then at = bound end
  end
  for _, r in ipairs(loaded) do
    if not r.off then
      if r.nh > 0 then first(r.hmin, r.H) end
      if r.nq > 0 then first(r.dmin, r.D) end
    end
  end
  if at == nil then return -1 end
  -- Overdue (< 0): a lease or waiter this script could not drop (on
  -- another resource); the caller's periodic refresh sees to it. Only work
  -- left over asks for the next script at once (0).
  if at <= now then return -1 end
  return at - now
end

-- Condition variables (see the key layout above). A condition's waiter
-- leaves it atomically in one of four ways: woken by a signal (cond_wake:
-- granted at once or queued), dropped as dead by a signal (its deadline
-- passed), withdrawn by its process (leave), or found inconsistent by a
-- refresh. Each takes its member out of both keys and its marker out of S.

-- cond_keys names the keys of the condition name of the resource at base.
local function cond_keys(base, name)
  if name == '' then return base .. ':c', base .. ':e' end
  return base .. ':c:' .. name, base .. ':e:' .. name
end

-- cond_load returns the condition name of resource r. declared holds the
-- condition keys the caller passed in KEYS (possibly none); keys not
-- declared are probed first, and a condition whose keys cannot be reached
-- now (its slot is migrating) comes back with off set: nothing may be
-- written to it in this script.
local function cond_load(r, name, declared_c, declared_e)
  local cv = r.conds_by[name]
  if cv then return cv end
  local C, E = cond_keys(r.base, name)
  cv = { name = name, C = C, E = E, wrote = false, gone = {} }
  if C ~= declared_c or E ~= declared_e then
    local probe = redis.pcall('EXISTS', C, E)
    if type(probe) == 'table' and probe.err then cv.off = true end
  end
  r.conds_by[name] = cv
  r.conds[#r.conds + 1] = cv
  return cv
end

-- cond_add makes ticket a waiter of condition cv of r: it waits there in
-- arrival order, alive until now + wait unless refreshed.
local function cond_add(r, cv, ticket, ns, client, lease, wait)
  local m = waiter_member(ticket, ns, client, lease, wait, '')
  write('ZADD', cv.C, num(next_seq(r)), m)
  write('ZADD', cv.E, num(now + wait), m)
  r.horizon = math.max(r.horizon, now + wait)
  record(r, ticket, 'c' .. cv.name)
  r.nc = r.nc + 1
  cv.wrote = true
end

-- cond_drop takes waiter m (read from cv) out of condition cv of r.
local function cond_drop(r, cv, m)
  if cv.gone[m] then return end
  cv.gone[m] = true
  write('ZREM', cv.C, m)
  write('ZREM', cv.E, m)
  r.nc = math.max(r.nc - 1, 0)
  record(r, string.match(m, '^%S+'), false)
  cv.wrote = true
end

-- cond_wake moves waiter m (parsed: w) from condition cv into r's queue,
-- under a new sequence number: behind every ticket already queued, and
-- behind the waiters woken before it. When nobody is queued (r's queue has
-- been run by the caller) and it fits, it is granted at once instead: the
-- queue reads what Redis holds, not what this script has buffered, so a
-- waiter queued here could not be granted before the next script.
local function cond_wake(r, cv, m, w)
  cond_drop(r, cv, m)
  if r.nq <= 0 and fits(r, w.n) then
    announce(w, { { base = r.base, n = w.n, ns = w.ns } })
    return
  end
  write('ZADD', r.Q, num(next_seq(r)), m)
  wait_at(r, now + w.wait, m)
  record(r, w.ticket, 'q')
  if r.nq0 <= 0 then r.wrote_q = true end
  r.nq = r.nq + 1
end

-- cond_purge drops the waiters of cv whose process stopped refreshing
-- them, at most the budget left; it reports whether it had to stop there.
local function cond_purge(r, cv)
  if budget <= 0 then return true end
  local limit = budget
  local due = redis.call('ZRANGEBYSCORE', cv.E, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(due) do
    budget = budget - 1
    cond_drop(r, cv, m)
  end
  return #due >= limit
end

-- more_flag reports, for replies, whether work was left for later scripts.
local function more_flag()
  if more then return 1 end
  return 0
end

-- Fast paths. The commonest calls (an acquire granted at once, or queued
-- behind a holder; a release that hands on to the queue's head, or to
-- nobody) need five to twelve Redis commands; the general path (load, the
-- write buffer, finish) costs several times those commands in Lua work. Each fast path takes a call only when it can see,
-- from what it has read, that the general path would do exactly what it
-- does (the same writes, the same reply); otherwise it returns nil having
-- written nothing, and leaves what it read in pre for the general path.
-- Both read everything first and write with commands that cannot fail for
-- data reasons, the first of which is the only one that may fail at all
-- (a key of the wrong type), the rule above.

-- fast_start reads Redis's clock and resource state hash S with ticket's
-- field (read_state), as begin and load would.
local function fast_start(S, ticket)
  local clock = redis.call('TIME')
  set_now(clock)
  return clock, read_state(S, ticket)
end

-- fast_defer leaves what a fast path read to the general path (see pre),
-- and returns nil: the fast path's answer when it cannot take the call.
local function fast_defer(clock, S, st)
  pre = { clock = clock, S = S, st = st }
  return nil
end

-- fast_acquire takes an "acquire" or "try" for one resource (KEYS K, ARGV
-- A as acquire.lua takes them) that asks for the stored capacity and is
-- not a resend, when no tombstone trim is due and either the request is
-- granted at once (nobody is queued and its permits are free) or no queue
-- can move (the resource is full, or nobody is queued, and no lease or
-- waiter is due by the bounds): then a "try" is refused and an "acquire"
-- queued.
local function fast_acquire(K, A)
  local S, ticket = K[1], A[2]
  local clock, st = fast_start(S, ticket)
  local cap, used, nh, nq, seq0 = counts(st)
  local n, lease, wait = tonumber(A[7]), tonumber(A[4]), tonumber(A[5])
  local hmin, dmin = tonumber(st[8]), tonumber(st[9])
  local grant = nq <= 0 and n and cap and used + n <= cap
  local ok = not st[11] and cap and n and lease and wait and cap == tonumber(A[8]) and not trim_due(tonumber(st[7]))
  if ok and not grant then
    -- No queue may move: nothing here is due, and a queue with waiters
    -- is full. A waiter's deadline bound must be known (for the reply).
    ok = nh > 0 and hmin and hmin > now and (used >= cap or nq <= 0)
      and (nq <= 0 or (dmin and dmin > now))
  end
  if not ok then return fast_defer(clock, S, st) end
  local exp0 = tonumber(st[6]) or 0
  if not grant and A[1] == 'try' then
    -- Refused, with nothing to write (the keys' TTL is as the last
    -- write left it).
    if keys_exp(exp0, 0, seq0, false) == exp0 then return { 0 } end
    return fast_defer(clock, S, st)
  end
  local seq = math.max(seq0 + 1, now_us)
  local ts = num(seq)
  local f, at, bound, zkey, member
  if grant then
    at = now + lease
    f = { 'used', num(used + n), 'nh', num(nh + 1), 'seq', ts, ticket, ts }
    bound, zkey, member = 'hmin', K[4], holder_member(ticket, num(n), A[3], ts)
  else
    at = now + wait
    f = { 'nq', num(nq + 1), 'seq', ts, ticket, 'q' }
    bound, zkey, member = 'dmin', K[3], waiter_member(ticket, n, A[3], lease, wait, '')
  end
  -- The bound on the zset's earliest time (see load and time_at): set when
  -- the zset was empty, lowered when known and later.
  local was, empty = hmin, nh <= 0
  if not grant then was, empty = dmin, nq <= 0 end
  if empty or (was and at < was) then
    f[#f + 1] = bound
    f[#f + 1] = num(at)
  end
  local exp = keys_exp(exp0, at, seq, false)
  local x = num(exp)
  if exp ~= exp0 then
    f[#f + 1] = 'exp'
    f[#f + 1] = x
  end
  if not grant then redis.call('ZADD', K[2], ts, member) end
  redis.call('ZADD', zkey, num(at), member)
  redis.call('HSET', S, unpack(f))
  if exp ~= exp0 then
    for _, k in ipairs(K) do redis.pcall('PEXPIREAT', k, x) end
  elseif empty then
    -- The key(s) written were empty, so they are new.
    redis.pcall('PEXPIREAT', zkey, x)
    if not grant then redis.pcall('PEXPIREAT', K[2], x) end
  end
  if grant then return { 1, now, at, ts } end
  -- The next event, as next_event reports it: both bounds have not passed.
  if empty then dmin = at end
  return { 2, now, math.min(hmin, dmin, at) - now }
end

-- fast_release releases a live lease on one resource (KEYS K, ARGV A as
-- release.lua takes them) when no tombstone trim is due and either nobody
-- is queued, or the queue's head waits for this resource alone, fits once
-- the lease is released, is the only one that may be granted (the
-- resource is full after, or nobody is left queued), and no lease or
-- waiter is due by the bounds: then the head is granted and told.
local function fast_release(K, A)
  local S, H, T, ticket = K[1], K[4], K[5], A[2]
  local clock, st = fast_start(S, ticket)
  local cap, used, nh, nq, seq = counts(st)
  local tnext, n = tonumber(st[7]) or 0, tonumber(A[8])
  local hmin, dmin = tonumber(st[8]), tonumber(st[9])
  local ok = cap and n and used - n < cap and not trim_due(tnext)
  local head, w, after = nil, nil, used
  if ok and nq > 0 then
    ok = dmin and dmin > now
    if ok then
      head = redis.call('ZRANGE', K[2], 0, 0)[1]
      w = head and parse_waiter(head)
      ok = w and not w.parts
    end
    if ok then
      after = used - n + w.n
      ok = after <= cap and ((after >= cap and hmin and hmin > now) or (after < cap and nq == 1))
    end
  end
  local m, at = nil, nil
  if ok then
    m = holder_member(ticket, A[8], A[3], A[9])
    at = tonumber(redis.call('ZSCORE', H, m))
  end
  if not (at and at > now) then return fast_defer(clock, S, st) end
  local tomb = now + TOMB_MS
  local horizon = tomb
  local f = { ticket, 'r' }
  local hat, ts
  if w then
    seq = math.max(seq + 1, now_us)
    ts = num(seq)
    hat = now + math.min(w.lease, w.wait)
    horizon = math.max(horizon, hat)
    f[#f + 1] = w.ticket
    f[#f + 1] = ts
    f[#f + 1] = 'nq'
    f[#f + 1] = num(nq - 1)
    f[#f + 1] = 'seq'
    f[#f + 1] = ts
    if hmin and hat < hmin then
      f[#f + 1] = 'hmin'
      f[#f + 1] = num(hat)
    end
  else
    f[#f + 1] = 'nh'
    f[#f + 1] = num(nh - 1)
    after = used - n
  end
  if after ~= used then
    f[#f + 1] = 'used'
    f[#f + 1] = num(after)
  end
  if tnext == 0 or tnext > tomb then
    f[#f + 1] = 'tnext'
    f[#f + 1] = num(tomb)
  end
  local idle = not w and nh <= 1 and (tonumber(st[10]) or 0) <= 0
  local exp0 = tonumber(st[6]) or 0
  local exp = keys_exp(exp0, horizon, seq, idle)
  local x = num(exp)
  if exp ~= exp0 then
    f[#f + 1] = 'exp'
    f[#f + 1] = x
  end
  redis.call('ZADD', T, num(tomb), ticket)
  local list
  if w then
    redis.call('ZADD', H, num(hat), holder_member(w.ticket, w.ns, w.client, ts))
    list = string.sub(S, 1, -3) .. ':w:' .. w.client
    -- The wake list is not declared: losing a wake-up is safe.
    redis.pcall('RPUSH', list, w.ticket .. ' ' .. num(hat) .. ' ' .. ts)
  end
  redis.call('HSET', S, unpack(f))
  redis.call('ZREM', H, m)
  if w then
    redis.call('ZREM', K[2], head)
    redis.call('ZREM', K[3], head)
    redis.pcall('PEXPIRE', list, hat - now)
  end
  if exp ~= exp0 then
    redis.pcall('PEXPIREAT', S, x)
    redis.pcall('PEXPIREAT', T, x)
    if not idle then
      for i = 2, 4 do redis.pcall('PEXPIREAT', K[i], x) end
    end
  elseif tnext == 0 then
    -- The tombstones' key was empty, so it is new.
    redis.pcall('PEXPIREAT', T, x)
  end
  return { 1, 0 }
end
