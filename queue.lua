-- queue.lua: the ticket queue that every fairlock script shares.
--
-- fairlock prepends this file to acquire.lua and release.lua, so every state
-- change runs as one script that sees the same model and the same grant rule.
--
-- KEYS (all of one semaphore; they share one hash tag, so one Cluster slot):
--   KEYS[1] <b>:s  hash  cap, used (permits held), nh (holders), nq (waiters),
--                        seq (last sequence number), exp (when keys expire, ms)
--   KEYS[2] <b>:q  zset  waiters "ticket permits client leaseMs waiterMs",
--                        scored by arrival sequence
--   KEYS[3] <b>:d  zset  the same waiters, scored by liveness deadline (ms)
--   KEYS[4] <b>:h  zset  holders "ticket permits client token", scored by
--                        lease expiry (ms)
--   KEYS[5] <b>:i  hash  ticket -> token, for grants announced on a wake list
--                        and not yet confirmed by their process (each
--                        record is needed only until its grant's first,
--                        short deadline; the hash expires with the keys)
-- Wake lists <b>:w:<client> (one per waiting process) receive "ticket token"
-- when a grant reaches one of that process's tickets. Their names come from
-- the queue's data, so they cannot be declared in KEYS; they carry the same
-- hash tag as the keys above and therefore live in the same slot.
--
-- All times come from Redis's TIME, never from a client. A lease or a waiter
-- whose time has come (expiry <= now) is gone, whether or not anyone said so.
-- Every redis.call costs about a microsecond, so the common paths make few:
-- the state hash is read once and written once, expired leases are purged
-- only when their permits are needed, and key TTLs move in large steps.

local S, Q, D, H, I = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local base = string.sub(S, 1, -3)

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now = math.floor(now_us / 1000)

local st = redis.call('HMGET', S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp')
local cap = tonumber(st[1])
local used = tonumber(st[2]) or 0
local nh = tonumber(st[3]) or 0
local nq = tonumber(st[4]) or 0
local seq = tonumber(st[5]) or 0
local exp = tonumber(st[6]) or 0
local nh0, nq0, used0, seq0 = nh, nq, used, seq
local horizon = 0        -- latest deadline written by this script
-- Keys this script added members to, which may have been created (or
-- emptied and created again) here and so have no TTL yet.
local wrote_h, wrote_q, wrote_i = false, false, false

-- num formats an integer-valued Lua number without exponent notation.
local function num(x)
  return string.format('%.0f', x)
end

local function waiter_member(ticket, n, client, lease, wait)
  return ticket .. ' ' .. n .. ' ' .. client .. ' ' .. lease .. ' ' .. wait
end

local function holder_member(ticket, n, client, token)
  return ticket .. ' ' .. n .. ' ' .. client .. ' ' .. num(token)
end

local function parse_waiter(m)
  local ticket, n, client, lease, wait = string.match(m, '^(%S+) (%d+) (%S+) (%d+) (%d+)$')
  if not ticket then return nil end
  return { ticket = ticket, n = tonumber(n), client = client, lease = tonumber(lease), wait = tonumber(wait) }
end

-- next_seq hands out the next number of the semaphore's one sequence, used
-- both as arrival order and as fencing token. It is at least the current
-- time in microseconds, so it keeps increasing after the state hash is gone:
-- the hash lives until a second after Redis's clock passes the last number.
local function next_seq()
  seq = math.max(seq + 1, now_us)
  return seq
end

-- drop_holder forgets a lease and frees its permits.
local function drop_holder(m)
  redis.call('ZREM', H, m)
  local ticket, n = string.match(m, '^(%S+) (%d+)')
  used = used - (tonumber(n) or 0)
  nh = nh - 1
  return ticket
end

-- purge_holders drops leases whose expiry has passed.
local function purge_holders()
  if nh <= 0 then return end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', H, '-inf', now)) do
    redis.call('HDEL', I, drop_holder(m))
  end
end

-- purge_waiters drops waiters whose process stopped refreshing. Each
-- deadline is absolute and its own: a dead waiter never pushes anybody
-- else's deadline later, so any number of dead waiters cost one TTL.
local function purge_waiters()
  if nq <= 0 then return end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', D, '-inf', now)) do
    redis.call('ZREM', Q, m)
    redis.call('ZREM', D, m)
    nq = nq - 1
  end
end

-- hold records a lease of n permits for ticket, lasting ttl ms, and returns
-- its token.
local function hold(ticket, n, client, ttl)
  local token = next_seq()
  redis.call('ZADD', H, now + ttl, holder_member(ticket, n, client, token))
  wrote_h = true
  used = used + n
  nh = nh + 1
  horizon = math.max(horizon, now + ttl)
  return token
end

-- pump grants waiting tickets strictly in arrival order while the head fits.
-- A head that does not fit stops the loop even when a later, smaller ticket
-- would fit: letting that one pass is barging, and a stream of small requests
-- could then starve a large one forever. Each grant is announced on the
-- wake list of the ticket's process, except to the ticket `self`, whose
-- caller runs this script and gets the answer directly. An announced grant
-- lasts only the waiter TTL until its process confirms it by renewing, so a
-- grant that reaches a process that has just died delays the queue by one
-- waiter TTL, not one lease TTL. Returns self's token if self was granted.
local function pump(self)
  if nq <= 0 or not cap then return nil end
  purge_waiters()
  local mine, purged = nil, false
  while nq > 0 do
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    if not head then
      nq = 0
      break
    end
    local w = parse_waiter(head)
    if w and used + w.n > cap and not purged then
      purge_holders()
      purged = true
    end
    if w and used + w.n > cap then break end
    redis.call('ZREM', Q, head)
    redis.call('ZREM', D, head)
    nq = nq - 1
    if w then
      if w.ticket == self then
        mine = hold(w.ticket, w.n, w.client, w.lease)
      else
        local ttl = math.min(w.lease, w.wait)
        local token = hold(w.ticket, w.n, w.client, ttl)
        redis.call('HSET', I, w.ticket, num(token))
        wrote_i = true
        local list = base .. ':w:' .. w.client
        redis.call('RPUSH', list, w.ticket .. ' ' .. num(token))
        redis.call('PEXPIRE', list, ttl)
      end
    end
  end
  return mine
end

-- finish writes the state back and keeps every key alive until the last
-- deadline it holds. A semaphore with no holders and no waiters keeps only
-- its state hash, for the sequence, and only for a second past it.
local function finish()
  local keep = math.floor(seq / 1000) + 1000
  if nh <= 0 and nq <= 0 then
    -- The sorted sets are empty, so Redis has deleted them already.
    redis.call('HSET', S, 'cap', cap or 0, 'used', 0, 'nh', 0, 'nq', 0, 'seq', num(seq), 'exp', keep)
    redis.call('PEXPIREAT', S, keep)
    return
  end
  local need = math.max(horizon, keep)
  if need > exp then
    -- Move the horizon well past what is needed, so that renewals seldom
    -- have to move it again.
    exp = need + math.max(need - now, 1000)
    redis.call('HSET', S, 'cap', cap, 'used', used, 'nh', nh, 'nq', nq, 'seq', num(seq), 'exp', exp)
    redis.call('PEXPIREAT', S, exp)
    redis.call('PEXPIREAT', H, exp)
    if wrote_i then redis.call('PEXPIREAT', I, exp) end
    if nq > 0 then
      redis.call('PEXPIREAT', Q, exp)
      redis.call('PEXPIREAT', D, exp)
    end
    return
  end
  if used ~= used0 or nh ~= nh0 or nq ~= nq0 or seq ~= seq0 then
    redis.call('HSET', S, 'used', used, 'nh', nh, 'nq', nq, 'seq', num(seq))
  end
  if wrote_h then redis.call('PEXPIREAT', H, exp) end
  if wrote_q then
    redis.call('PEXPIREAT', Q, exp)
    redis.call('PEXPIREAT', D, exp)
  end
  if wrote_i then redis.call('PEXPIREAT', I, exp) end
end

-- next_event returns the milliseconds until the earliest lease expiry or
-- waiter deadline, when the queue may move without anybody releasing, or -1.
local function next_event()
  local at = nil
  local h = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
  if h[2] then at = tonumber(h[2]) end
  local d = redis.call('ZRANGE', D, 0, 0, 'WITHSCORES')
  if d[2] and (at == nil or tonumber(d[2]) < at) then at = tonumber(d[2]) end
  if at == nil then return -1 end
  return at - now
end

-- rebuild recounts the state from the sorted sets, should the state hash be
-- missing while they are not (it is never evicted alone under noeviction).
local function rebuild()
  if cap or redis.call('EXISTS', H, Q) == 0 then return end
  nh, nq, used = redis.call('ZCARD', H), redis.call('ZCARD', Q), 0
  for _, m in ipairs(redis.call('ZRANGE', H, 0, -1)) do
    used = used + (tonumber(string.match(m, '^%S+ (%d+)')) or 0)
  end
  nh0, nq0, used0 = 0, 0, 0
  wrote_h, wrote_q = true, nq > 0
end
