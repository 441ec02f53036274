-- acquire.lua: the waiter's side. Runs after queue.lua (same KEYS).
--
-- ARGV[1] op:
--   "acquire" | "try"  ARGV: op, ticket, client, permits, capacity, leaseMs, waiterMs
--     returns {1, token}          granted at once
--             {0, 0}              "try" only: not granted, nothing queued
--             {2, nextEventMs}    queued; the grant arrives on the wake list
--     error   "FAIRLOCK_CAPACITY <stored>" when capacity differs from the
--             capacity stored with a semaphore in use
--   "refresh"          ARGV: op, waiterMs, ticket...
--     keeps the listed waiting tickets of one process alive and reports those
--     that no longer wait: {nextEventMs, {ticket, token-or-0, ...}}; a token
--     means granted (in case its wake-up was lost), 0 means dropped.

local op = ARGV[1]

if op == 'refresh' then
  purge()
  local waiter_ms = tonumber(ARGV[2])
  local out = {}
  for i = 3, #ARGV do
    local id = ARGV[i]
    if redis.call('ZSCORE', Q, id) then
      redis.call('ZADD', D, now + waiter_ms, id)
    else
      local t = ticket(id)
      out[#out + 1] = id
      if t and t.token and redis.call('ZSCORE', H, id) then
        out[#out + 1] = num(t.token)
      else
        out[#out + 1] = '0'
      end
    end
  end
  pump('')
  finish()
  return { next_event(), out }
end

local id, client = ARGV[2], ARGV[3]
local n, cap = tonumber(ARGV[4]), tonumber(ARGV[5])
local lease, waiter_ms = tonumber(ARGV[6]), tonumber(ARGV[7])

purge()
if redis.call('EXISTS', H) == 0 and redis.call('EXISTS', Q) == 0 then
  -- Idle: whatever capacity was stored belonged to users who are all gone.
  redis.call('HSET', S, 'cap', cap, 'used', 0)
else
  local stored = redis.call('HGET', S, 'cap')
  if stored and tonumber(stored) ~= cap then
    return redis.error_reply('FAIRLOCK_CAPACITY ' .. stored)
  end
  if not stored then
    -- The state hash alone went missing (evicted by a maxmemory policy that
    -- should not be used with fairlock): rebuild it from the holders.
    local used = 0
    for _, h in ipairs(redis.call('ZRANGE', H, 0, -1)) do
      local t = ticket(h)
      if t then used = used + t.n end
    end
    redis.call('HSET', S, 'cap', cap, 'used', used)
  end
  -- Leases that expired in purge may have made room for the queue's head.
  pump('')
end

local used = tonumber(redis.call('HGET', S, 'used'))
if redis.call('EXISTS', Q) == 0 and used + n <= cap then
  local token = hold(id, n, client, lease, waiter_ms, lease)
  finish()
  return { 1, token }
end
if op == 'try' then
  finish()
  return { 0, 0 }
end

redis.call('ZADD', Q, next_seq(), id)
redis.call('ZADD', D, now + waiter_ms, id)
redis.call('HSET', I, id, record(n, client, lease, waiter_ms))
finish()
return { 2, next_event() }
