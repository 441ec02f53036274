-- queue.lua: the ticket queue that every fairlock script shares.
--
-- fairlock prepends this file to acquire.lua and release.lua, so every state
-- change runs as one script that sees the same model and the same grant rule.
--
-- A script serves one or more semaphores ("resources"); KEYS holds five
-- keys for each, in this order (one resource's keys share one hash tag, so
-- one Cluster slot; a multi-resource request needs all in one slot):
--   <b>:s  hash  cap, used (permits held), nh (holders), nq (waiters),
--                seq (last sequence number), exp (when keys expire, ms)
--   <b>:q  zset  waiters, scored by arrival sequence
--   <b>:d  zset  the same waiters, scored by liveness deadline (ms)
--   <b>:h  zset  holders "ticket permits client token", scored by lease
--                expiry (ms)
--   <b>:i  hash  ticket -> token of every live grant made at once, until
--                released, and of every grant announced on a wake list,
--                until its process confirms it: what a retried or
--                withdrawn call finds (the hash expires with the keys)
-- A waiter is "ticket permits client leaseMs waiterMs". A waiter that asks
-- for several resources at once (a multi-request) is queued in each of
-- them, its member followed by a tab and its group: "base\tpermits\tcap"
-- for every resource, tab-separated, in name order. Names and prefixes
-- contain no control characters, so the tabs are unambiguous.
--
-- Wake lists <b>:w:<client> (one per waiting process) receive "ticket
-- token..." when a grant reaches one of that process's tickets; a
-- multi-request's grant carries one token per resource, on the list of the
-- first. Wake lists, and a multi-request's other resources reached from a
-- queue, are named by the data, so they cannot be declared in KEYS; they
-- live in the same slot as the declared keys.
--
-- All times come from Redis's TIME, never from a client. A lease or a waiter
-- whose time has come (expiry <= now) is gone, whether or not anyone said so.
-- Every redis.call costs about a microsecond, so the common paths make few:
-- each state hash is read once and written once, expired leases are purged
-- only when their permits are needed, and key TTLs move in large steps.

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now = math.floor(now_us / 1000)

-- num formats an integer-valued number (or numeric string) without
-- exponent notation.
local function num(x)
  return string.format('%.0f', tonumber(x))
end

local function waiter_member(ticket, n, client, lease, wait, group)
  local m = ticket .. ' ' .. num(n) .. ' ' .. client .. ' ' .. num(lease) .. ' ' .. num(wait)
  if group and group ~= '' then m = m .. '\t' .. group end
  return m
end

local function holder_member(ticket, n, client, token)
  return ticket .. ' ' .. num(n) .. ' ' .. client .. ' ' .. num(token)
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
  local head, group = string.match(m, '^([^\t]*)\t(.*)$')
  head = head or m
  local ticket, n, client, lease, wait = string.match(head, '^(%S+) (%d+) (%S+) (%d+) (%d+)$')
  if not ticket then return nil end
  local w = { ticket = ticket, n = tonumber(n), client = client, lease = tonumber(lease), wait = tonumber(wait) }
  if group then
    w.group = group
    w.parts = parse_group(group)
  end
  return w
end

-- Resources are loaded once per script, into tables that hold their state
-- until finish writes it back.
local loaded, by_base = {}, {}

-- rebuild recounts a resource's state from its sorted sets, should its state
-- hash be missing while they are not (it is never evicted alone under
-- noeviction).
local function rebuild(r)
  if r.cap or redis.call('EXISTS', r.H, r.Q) == 0 then return end
  r.nh, r.nq, r.used = redis.call('ZCARD', r.H), redis.call('ZCARD', r.Q), 0
  for _, m in ipairs(redis.call('ZRANGE', r.H, 0, -1)) do
    r.used = r.used + (tonumber(string.match(m, '^%S+ (%d+)')) or 0)
  end
  r.nh0, r.nq0, r.used0 = 0, 0, 0
  r.wrote_h, r.wrote_q = true, r.nq > 0
end

local function load(base)
  local r = by_base[base]
  if r then return r end
  r = { base = base, S = base .. ':s', Q = base .. ':q', D = base .. ':d', H = base .. ':h', I = base .. ':i' }
  local st = redis.call('HMGET', r.S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp')
  r.cap = tonumber(st[1])
  r.used = tonumber(st[2]) or 0
  r.nh = tonumber(st[3]) or 0
  r.nq = tonumber(st[4]) or 0
  r.seq = tonumber(st[5]) or 0
  r.exp = tonumber(st[6]) or 0
  r.nh0, r.nq0, r.used0, r.seq0 = r.nh, r.nq, r.used, r.seq
  r.horizon = 0 -- latest deadline written by this script
  -- Keys this script added members to, which may have been created (or
  -- emptied and created again) here and so have no TTL yet.
  r.wrote_h, r.wrote_q, r.wrote_i = false, false, false
  rebuild(r)
  by_base[base] = r
  loaded[#loaded + 1] = r
  return r
end

-- declared returns the resources whose keys the caller passed in KEYS.
local function declared()
  local rs = {}
  for i = 1, #KEYS, 5 do
    rs[#rs + 1] = load(string.sub(KEYS[i], 1, -3))
  end
  return rs
end

-- next_seq hands out the next number of a resource's one sequence, used
-- both as arrival order and as fencing token. It is at least the current
-- time in microseconds, so it keeps increasing after the state hash is gone:
-- the hash lives until a second after Redis's clock passes the last number.
local function next_seq(r)
  r.seq = math.max(r.seq + 1, now_us)
  return r.seq
end

-- drop_holder forgets a lease and frees its permits.
local function drop_holder(r, m)
  redis.call('ZREM', r.H, m)
  local ticket, n = string.match(m, '^(%S+) (%d+)')
  r.used = r.used - (tonumber(n) or 0)
  r.nh = r.nh - 1
  return ticket
end

-- purge_holders drops leases whose expiry has passed. Time stands still
-- while a script runs, so once per script is enough.
local function purge_holders(r)
  if r.nh <= 0 or r.hpurged then return end
  r.hpurged = true
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', r.H, '-inf', now)) do
    redis.call('HDEL', r.I, drop_holder(r, m))
  end
end

-- unqueue takes a waiter out of one resource's queue.
local function unqueue(r, m)
  if redis.call('ZREM', r.Q, m) == 1 then
    r.nq = r.nq - 1
  end
  redis.call('ZREM', r.D, m)
end

-- drop_waiter takes waiter w out of every queue it is in.
local function drop_waiter(w)
  for _, p in ipairs(w.parts) do
    unqueue(load(p.base), waiter_member(w.ticket, p.n, w.client, w.lease, w.wait, w.group))
  end
end

-- purge_waiters drops waiters whose process stopped refreshing. Each
-- deadline is absolute and its own: a dead waiter never pushes anybody
-- else's deadline later, so any number of dead waiters cost one TTL.
local function purge_waiters(r)
  if r.nq <= 0 or r.wpurged then return end
  r.wpurged = true
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', r.D, '-inf', now)) do
    local w = parse_waiter(m)
    if w and w.parts then
      drop_waiter(w)
    else
      unqueue(r, m)
    end
  end
end

-- hold records a lease of n permits of r for ticket, lasting ttl ms, and
-- returns its token.
local function hold(r, ticket, n, client, ttl)
  local token = next_seq(r)
  redis.call('ZADD', r.H, now + ttl, holder_member(ticket, n, client, token))
  r.wrote_h = true
  r.used = r.used + n
  r.nh = r.nh + 1
  r.horizon = math.max(r.horizon, now + ttl)
  return token
end

-- fits reports whether n more permits of r fit now, purging expired leases
-- if that is what it takes.
local function fits(r, n)
  if not r.cap then return false end
  if r.used + n > r.cap then purge_holders(r) end
  return r.used + n <= r.cap
end

-- head returns the first live waiter of r's queue and its member.
local function head(r)
  purge_waiters(r)
  if r.nq <= 0 then return nil end
  local m = redis.call('ZRANGE', r.Q, 0, 0)[1]
  if not m then
    r.nq = 0
    return nil
  end
  return m, parse_waiter(m)
end

-- ready reports whether multi-request w, at the head of one of its
-- queues, is at the head of all of them and fits in all of them.
local function ready(w)
  for _, p in ipairs(w.parts) do
    local r = load(p.base)
    -- A resource whose state was lost takes the capacity the group
    -- records.
    if not r.cap and r.nq > 0 then r.cap, r.newcap = p.cap, true end
    local m = head(r)
    if m ~= waiter_member(w.ticket, p.n, w.client, w.lease, w.wait, w.group) or not fits(r, p.n) then
      return false
    end
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
    local r = load(p.base)
    local token = num(hold(r, w.ticket, p.n, w.client, ttl))
    redis.call('HSET', r.I, w.ticket, token)
    r.wrote_i = true
    tokens[i] = token
  end
  local list = parts[1].base .. ':w:' .. w.client
  redis.call('RPUSH', list, w.ticket .. ' ' .. table.concat(tokens, ' '))
  redis.call('PEXPIRE', list, ttl)
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
  if not r.cap then return touched end
  while true do
    local m, w = head(r)
    if not m then break end
    if not w then
      unqueue(r, m) -- not a waiter fairlock wrote
    elseif w.parts then
      if not ready(w) then break end
      drop_waiter(w)
      announce(w, w.parts)
      for _, p in ipairs(w.parts) do
        if p.base ~= r.base then touched[#touched + 1] = load(p.base) end
      end
    else
      if not fits(r, w.n) then break end
      unqueue(r, m)
      announce(w, { { base = r.base, n = w.n } })
    end
  end
  return touched
end

-- run_queues pumps the given resources, and every resource a grant on them
-- changed, until no queue can move.
local function run_queues(rs)
  local todo = {}
  for i, r in ipairs(rs) do todo[i] = r end
  local i = 1
  while i <= #todo do
    for _, r in ipairs(pump(todo[i])) do todo[#todo + 1] = r end
    i = i + 1
  end
end

-- finish_one writes a resource's state back and keeps its keys alive until
-- the last deadline they hold. A semaphore with no holders and no waiters
-- keeps only its state hash, for the sequence, and only for a second past
-- it.
local function finish_one(r)
  local changed = r.used ~= r.used0 or r.nh ~= r.nh0 or r.nq ~= r.nq0 or r.seq ~= r.seq0
  if not (changed or r.wrote_h or r.wrote_q or r.wrote_i or r.horizon > r.exp or r.newcap) then
    return
  end
  local keep = math.floor(r.seq / 1000) + 1000
  if r.nh <= 0 and r.nq <= 0 then
    -- The sorted sets are empty, so Redis has deleted them already.
    redis.call('HSET', r.S, 'cap', r.cap or 0, 'used', 0, 'nh', 0, 'nq', 0, 'seq', num(r.seq), 'exp', keep)
    redis.call('PEXPIREAT', r.S, keep)
    return
  end
  local need = math.max(r.horizon, keep)
  if need > r.exp or r.newcap then
    -- Move the horizon well past what is needed, so that renewals seldom
    -- have to move it again.
    local exp = math.max(r.exp, need + math.max(need - now, 1000))
    r.exp = exp
    redis.call('HSET', r.S, 'cap', r.cap, 'used', r.used, 'nh', r.nh, 'nq', r.nq, 'seq', num(r.seq), 'exp', exp)
    redis.call('PEXPIREAT', r.S, exp)
    redis.call('PEXPIREAT', r.H, exp)
    if r.wrote_i then redis.call('PEXPIREAT', r.I, exp) end
    if r.nq > 0 then
      redis.call('PEXPIREAT', r.Q, exp)
      redis.call('PEXPIREAT', r.D, exp)
    end
    return
  end
  if changed then
    redis.call('HSET', r.S, 'used', r.used, 'nh', r.nh, 'nq', r.nq, 'seq', num(r.seq))
  end
  if r.wrote_h then redis.call('PEXPIREAT', r.H, r.exp) end
  if r.wrote_q then
    redis.call('PEXPIREAT', r.Q, r.exp)
    redis.call('PEXPIREAT', r.D, r.exp)
  end
  if r.wrote_i then redis.call('PEXPIREAT', r.I, r.exp) end
end

local function finish()
  for _, r in ipairs(loaded) do finish_one(r) end
end

-- next_event returns the milliseconds until the earliest lease expiry or
-- waiter deadline of the resources this script loaded, when a queue may
-- move without anybody releasing, or -1.
local function next_event()
  local at = nil
  for _, r in ipairs(loaded) do
    local h = redis.call('ZRANGE', r.H, 0, 0, 'WITHSCORES')
    if h[2] and (at == nil or tonumber(h[2]) < at) then at = tonumber(h[2]) end
    local d = redis.call('ZRANGE', r.D, 0, 0, 'WITHSCORES')
    if d[2] and (at == nil or tonumber(d[2]) < at) then at = tonumber(d[2]) end
  end
  if at == nil then return -1 end
  return at - now
end
