-- acquire.lua: the waiter's side. Runs after queue.lua (same KEYS).
--
-- ARGV[1] op:
--   "acquire" | "try"  ARGV: op, ticket, permits, client, leaseMs, waiterMs,
--                      capacity
--     returns {1, token}          granted at once
--             {0, 0}              "try" only: not granted, nothing queued
--             {2, nextEventMs}    queued; the grant arrives on the wake list
--     error   "FAIRLOCK_CAPACITY <stored>" when capacity differs from the
--             capacity stored with a semaphore in use
--   "refresh"          ARGV: op, client, leaseMs, waiterMs, ticket, permits,
--                      ticket, permits, ...
--     keeps one process's listed waiters alive and reports those that no
--     longer wait: {nextEventMs, {ticket, token-or-0, ...}}; a token means
--     granted (in case its wake-up was lost), 0 means dropped.
--   "status"           ARGV: op; changes nothing. Returns {nowMs, capacity,
--     {holder, expiryMs, ...}, {waiter, sequence, ...}} for live entries.

local op = ARGV[1]

if op == 'status' then
  local holders, waiters = {}, {}
  local h = redis.call('ZRANGEBYSCORE', H, '(' .. num(now), '+inf', 'WITHSCORES')
  for i = 1, #h, 2 do
    holders[#holders + 1] = h[i]
    holders[#holders + 1] = h[i + 1]
  end
  local q = redis.call('ZRANGE', Q, 0, -1, 'WITHSCORES')
  for i = 1, #q, 2 do
    local at = redis.call('ZSCORE', D, q[i])
    if at and tonumber(at) > now then
      waiters[#waiters + 1] = q[i]
      waiters[#waiters + 1] = q[i + 1]
    end
  end
  return { now, cap or 0, holders, waiters }
end

if op == 'refresh' then
  local client, lease, wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
  rebuild()
  purge_holders()
  local out = {}
  for i = 5, #ARGV, 2 do
    local ticket, n = ARGV[i], ARGV[i + 1]
    local m = waiter_member(ticket, n, client, lease, wait)
    if redis.call('ZSCORE', Q, m) then
      redis.call('ZADD', D, now + wait, m)
      horizon = math.max(horizon, now + wait)
    else
      out[#out + 1] = ticket
      local token = redis.call('HGET', I, ticket)
      local at = token and redis.call('ZSCORE', H, holder_member(ticket, n, client, tonumber(token)))
      if at and tonumber(at) > now then
        out[#out + 1] = token
      else
        out[#out + 1] = '0'
      end
    end
  end
  pump('')
  finish()
  return { next_event(), out }
end

local ticket, n, client = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local lease, wait, want = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])

rebuild()
if not cap or (nh <= 0 and nq <= 0) then
  -- Idle (whatever capacity was stored belonged to users who are all
  -- gone), or the state hash was lost and rebuilt: take the caller's.
  cap = want
elseif cap ~= want then
  return redis.error_reply('FAIRLOCK_CAPACITY ' .. tostring(cap))
end
if nq > 0 or used + n > cap then
  -- Expired leases and dead waiters may have made room for the queue.
  pump('')
  if nq <= 0 and used + n > cap then purge_holders() end
end

if nq <= 0 and used + n <= cap then
  local token = hold(ticket, n, client, lease)
  finish()
  return { 1, token }
end
if op == 'try' then
  finish()
  return { 0, 0 }
end

local m = waiter_member(ticket, n, client, lease, wait)
redis.call('ZADD', Q, next_seq(), m)
redis.call('ZADD', D, now + wait, m)
wrote_q = true
nq = nq + 1
horizon = math.max(horizon, now + wait)
finish()
return { 2, next_event() }
