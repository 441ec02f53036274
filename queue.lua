-- queue.lua: the ticket queue that every fairlock script shares.
--
-- fairlock prepends this file to acquire.lua and release.lua, so every state
-- change runs as one script that sees the same model and the same grant rule.
--
-- A script serves one or more semaphores ("resources"); KEYS holds four
-- keys for each, in this order (one resource's keys share one hash tag, so
-- one Cluster slot; a multi-resource request needs all in one slot):
--   <b>:s  hash  cap, used (permits held), nh (holders), nq (waiters),
--                seq (last sequence number), exp (when keys expire, ms);
--                and ticket -> token of every live grant made at once,
--                until released, and of every grant announced on a wake
--                list, until its process confirms it: what a retried or
--                withdrawn call finds. Tickets are upper-case base32 text,
--                so they never clash with the lower-case state fields.
--   <b>:q  zset  waiters, scored by arrival sequence
--   <b>:d  zset  the same waiters, scored by liveness deadline (ms)
--   <b>:h  zset  holders "ticket permits client token", scored by lease
--                expiry (ms)
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
-- A script's cost is mostly redis.call and conversions between numbers and
-- strings, so the common paths make few of either: each state hash is read
-- once and written once (only the fields that changed), numbers are
-- formatted once, expired leases are purged only when their permits are
-- needed, and key TTLs move in large steps.

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now = math.floor(now_us / 1000)

-- num formats an integer-valued number (or numeric string) without
-- exponent notation.
local function num(x)
  return string.format('%d', x)
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

-- load returns the resource with key base base, reading its state on first
-- use. k is the index in KEYS of its first key, if it was declared; ticket,
-- if given, is looked up in its grants (r.grant).
local function load(base, k, ticket)
  local r = by_base[base]
  if r then return r end
  local S, Q, D, H
  if k then
    S, Q, D, H = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  else
    S, Q, D, H = base .. ':s', base .. ':q', base .. ':d', base .. ':h'
  end
  local st, grant
  if ticket then
    st = redis.call('HMGET', S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp', ticket)
    grant = st[7]
  else
    st = redis.call('HMGET', S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp')
  end
  local used, nh, nq, seq = tonumber(st[2]) or 0, tonumber(st[3]) or 0, tonumber(st[4]) or 0, tonumber(st[5]) or 0
  -- One constructor with every field: growing a table field by field
  -- costs more than the rest of this function.
  r = {
    base = base, S = S, Q = Q, D = D, H = H, grant = grant,
    cap = tonumber(st[1]), used = used, nh = nh, nq = nq, seq = seq, exp = tonumber(st[6]) or 0,
    -- as read, to write back only what changed
    used0 = used, nh0 = nh, nq0 = nq, seq0 = seq,
    horizon = 0, -- latest deadline written by this script
    -- Keys this script added members to, which may have been created (or
    -- emptied and created again) here and so have no TTL yet.
    wrote_h = false, wrote_q = false,
    hpurged = false, wpurged = false, newcap = false,
    -- Grants to record (ticket -> token) or forget (ticket -> false) in S,
    -- and their order.
    grants = {}, gorder = {},
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
  for i = 1, #KEYS, 4 do
    rs[#rs + 1] = load(string.sub(KEYS[i], 1, -3), i, ticket)
  end
  return rs
end

-- record notes a grant's token (a string) under its ticket, or forgets
-- the ticket (ts false); finish writes it.
local function record(r, ticket, ts)
  if r.grants[ticket] == nil then r.gorder[#r.gorder + 1] = ticket end
  r.grants[ticket] = ts
end

-- next_seq hands out the next number of a resource's one sequence, used
-- both as arrival order and as fencing token. It is at least the current
-- time in microseconds, so it keeps increasing after the state hash is gone:
-- the hash lives until a second after Redis's clock passes the last number.
local function next_seq(r)
  r.seq = math.max(r.seq + 1, now_us)
  return r.seq
end

-- drop_holder forgets a lease of n permits (n is read from the member
-- when not given) and frees its permits.
local function drop_holder(r, m, n)
  redis.call('ZREM', r.H, m)
  local ticket = string.match(m, '^%S+')
  if not n then n = tonumber(string.match(m, '^%S+ (%d+)')) or 0 end
  r.used = r.used - n
  r.nh = r.nh - 1
  record(r, ticket, false)
end

-- purge_holders drops leases whose expiry has passed. Time stands still
-- while a script runs, so once per script is enough.
local function purge_holders(r)
  if r.nh <= 0 or r.hpurged then return end
  r.hpurged = true
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', r.H, '-inf', now)) do
    drop_holder(r, m)
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

-- hold records a lease of n permits (ns, formatted) of r for ticket,
-- lasting ttl ms, and returns its token, formatted.
local function hold(r, ticket, n, ns, client, ttl)
  local ts = num(next_seq(r))
  redis.call('ZADD', r.H, num(now + ttl), holder_member(ticket, ns, client, ts))
  record(r, ticket, ts)
  r.wrote_h = true
  r.used = r.used + n
  r.nh = r.nh + 1
  r.horizon = math.max(r.horizon, now + ttl)
  return ts
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
    tokens[i] = hold(load(p.base), w.ticket, p.n, p.ns or num(p.n), w.client, ttl)
  end
  local list = parts[1].base .. ':w:' .. w.client
  redis.call('RPUSH', list, w.ticket .. ' ' .. table.concat(tokens, ' '))
  redis.call('PEXPIRE', list, num(ttl))
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
      announce(w, { { base = r.base, n = w.n, ns = w.ns } })
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

-- put adds field = v to the field list f when v differs from v0.
local function put(f, field, v, v0)
  if v ~= v0 then
    f[#f + 1] = field
    f[#f + 1] = num(v)
  end
end

-- finish_one writes what changed of a resource's state back, and keeps its
-- keys alive until the last deadline they hold. A semaphore with no holders
-- and no waiters keeps only its state hash, for the sequence, and only for
-- a second past it.
local function finish_one(r)
  local f, del = {}, {}
  for _, t in ipairs(r.gorder) do
    local ts = r.grants[t]
    if ts then
      f[#f + 1] = t
      f[#f + 1] = ts
    else
      del[#del + 1] = t
    end
  end
  if r.newcap then put(f, 'cap', r.cap or 0, nil) end
  put(f, 'used', r.used, r.used0)
  put(f, 'nh', r.nh, r.nh0)
  put(f, 'nq', r.nq, r.nq0)
  put(f, 'seq', r.seq, r.seq0)
  local keep = math.floor(r.seq / 1000) + 1000
  local idle = r.nh <= 0 and r.nq <= 0
  local exp = r.exp
  if idle then
    -- The sorted sets are empty, so Redis has deleted them already.
    if #f > 0 then exp = keep end
  else
    local need = math.max(r.horizon, keep)
    if need > r.exp then
      -- Move the horizon well past what is needed, so that renewals seldom
      -- have to move it again.
      exp = math.max(r.exp, need + math.max(need - now, 1000))
    end
  end
  local moved = exp ~= r.exp
  if #f == 0 and #del == 0 and not (moved or r.wrote_h or r.wrote_q) then return end
  if #del > 0 then redis.call('HDEL', r.S, unpack(del)) end
  local at = num(exp)
  if moved then
    f[#f + 1] = 'exp'
    f[#f + 1] = at
  end
  if #f > 0 then redis.call('HSET', r.S, unpack(f)) end
  if idle then
    if moved then redis.call('PEXPIREAT', r.S, at) end
    return
  end
  if moved then
    r.exp = exp
    redis.call('PEXPIREAT', r.S, at)
    if r.nh > 0 then redis.call('PEXPIREAT', r.H, at) end
    if r.nq > 0 then
      redis.call('PEXPIREAT', r.Q, at)
      redis.call('PEXPIREAT', r.D, at)
    end
    return
  end
  if r.wrote_h then redis.call('PEXPIREAT', r.H, at) end
  if r.wrote_q then
    redis.call('PEXPIREAT', r.Q, at)
    redis.call('PEXPIREAT', r.D, at)
  end
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
