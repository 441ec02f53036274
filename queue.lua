-- queue.lua: the ticket queue that every fairlock script shares.
--
-- fairlock prepends this file to acquire.lua and release.lua, so every state
-- change runs as one script that sees the same model and the same grant rule.
--
-- KEYS (all of one semaphore; they share one hash tag, so one Cluster slot):
--   KEYS[1] <b>:s  hash    cap, used (permits held by live leases)
--   KEYS[2] <b>:q  zset    waiting tickets, scored by arrival sequence
--   KEYS[3] <b>:d  zset    waiting tickets, scored by liveness deadline (ms)
--   KEYS[4] <b>:h  zset    holders, scored by lease expiry (ms)
--   KEYS[5] <b>:i  hash    ticket -> "permits client leaseMs waiterMs [token]"
--   KEYS[6] <b>:t  string  last sequence number handed out (µs-based)
-- Wake lists <b>:w:<client> (one per waiting process) receive "ticket token"
-- when a grant reaches one of that process's tickets. Their names come from
-- the queue's data, so they cannot be declared in KEYS; they carry the same
-- hash tag as the keys above and therefore live in the same slot.
--
-- All times come from Redis's TIME, never from a client. A lease or a waiter
-- whose time has come (expiry <= now) is gone, whether or not anyone said so.

if redis.replicate_commands then redis.replicate_commands() end

local S, Q, D, H, I, T = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local base = string.sub(S, 1, -3)

local clock = redis.call('TIME')
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local now = math.floor(now_us / 1000)

-- num formats an integer-valued Lua number without exponent notation.
local function num(x)
  return string.format('%.0f', x)
end

-- ticket reads a ticket's record: permits, client, lease and waiter TTLs
-- (ms) and, once granted, its fencing token.
local function ticket(id)
  local v = redis.call('HGET', I, id)
  if not v then return nil end
  local n, client, lease, wait, token = string.match(v, '^(%d+) (%S+) (%d+) (%d+) ?(%d*)$')
  if not n then return nil end
  return { n = tonumber(n), client = client, lease = tonumber(lease), wait = tonumber(wait),
    token = tonumber(token) }
end

-- next_seq hands out the next number of the semaphore's one sequence, used
-- both as arrival order and as fencing token. It is at least the current
-- time in microseconds, so it keeps increasing after the key is gone: the key
-- lives until a second after Redis's clock has passed the number it stores.
-- The number is also kept in a local, for servers whose key expiry moves on
-- while a script runs.
local last_seq = 0
local function next_seq()
  local stored = tonumber(redis.call('GET', T) or 0)
  local seq = math.max(stored + 1, last_seq + 1, now_us)
  last_seq = seq
  redis.call('SET', T, num(seq))
  redis.call('PEXPIREAT', T, num(math.floor(seq / 1000) + 1000))
  return seq
end

-- purge drops holders whose lease has expired and waiters whose process
-- stopped refreshing. Each deadline is absolute and its own: a dead waiter
-- never pushes anybody else's deadline later.
local function purge()
  local expired = redis.call('ZRANGEBYSCORE', H, '-inf', now)
  for _, id in ipairs(expired) do
    local t = ticket(id)
    redis.call('ZREM', H, id)
    redis.call('HDEL', I, id)
    if t then redis.call('HINCRBY', S, 'used', -t.n) end
  end
  local dead = redis.call('ZRANGEBYSCORE', D, '-inf', now)
  for _, id in ipairs(dead) do
    redis.call('ZREM', Q, id)
    redis.call('ZREM', D, id)
    redis.call('HDEL', I, id)
  end
end

-- record formats a ticket's record.
local function record(n, client, lease, wait, token)
  local r = n .. ' ' .. client .. ' ' .. lease .. ' ' .. wait
  if token then r = r .. ' ' .. num(token) end
  return r
end

-- hold records a grant of n permits to ticket id, lasting ttl ms, and
-- returns its token.
local function hold(id, n, client, lease, wait, ttl)
  local token = next_seq()
  redis.call('ZADD', H, now + ttl, id)
  redis.call('HSET', I, id, record(n, client, lease, wait, token))
  redis.call('HINCRBY', S, 'used', n)
  return token
end

-- pump grants waiting tickets strictly in arrival order while the head fits.
-- A head that does not fit stops the loop even when a later, smaller ticket
-- would fit: letting that one pass is barging, and a stream of small requests
-- could then starve a large one forever. Each grant is announced on the
-- wake list of the ticket's process; the ticket `self`, whose caller is
-- running this script and gets the answer directly, is not announced.
-- An announced grant lasts only the waiter TTL until its process confirms
-- it by renewing, so a grant that reaches a process that has just died
-- delays the queue by one waiter TTL, not one lease TTL.
-- Returns self's token if self was granted.
local function pump(self)
  local cap = tonumber(redis.call('HGET', S, 'cap'))
  if not cap then return nil end
  local used = tonumber(redis.call('HGET', S, 'used') or 0)
  local mine = nil
  while true do
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    if not head then break end
    local t = ticket(head)
    if not t then
      -- A ticket without its record cannot be granted; drop it rather than
      -- let it block the queue.
      redis.call('ZREM', Q, head)
      redis.call('ZREM', D, head)
    else
      if used + t.n > cap then break end
      redis.call('ZREM', Q, head)
      redis.call('ZREM', D, head)
      local ttl = t.lease
      if head ~= self then ttl = math.min(t.lease, t.wait) end
      local token = hold(head, t.n, t.client, t.lease, t.wait, ttl)
      used = used + t.n
      if head == self then
        mine = token
      else
        local list = base .. ':w:' .. t.client
        redis.call('RPUSH', list, head .. ' ' .. num(token))
        redis.call('PEXPIRE', list, t.lease)
      end
    end
  end
  return mine
end

-- finish sets every key to expire when the last lease or waiter deadline
-- passes, so a semaphore whose users all vanished leaves nothing behind; a
-- semaphore with no holders and no waiters is deleted at once.
local function finish()
  local last = 0
  local h = redis.call('ZRANGE', H, -1, -1, 'WITHSCORES')
  if h[2] then last = tonumber(h[2]) end
  local d = redis.call('ZRANGE', D, -1, -1, 'WITHSCORES')
  if d[2] and tonumber(d[2]) > last then last = tonumber(d[2]) end
  if last == 0 then
    redis.call('DEL', S, Q, D, H, I)
    return
  end
  for _, k in ipairs({ S, Q, D, H, I }) do
    redis.call('PEXPIREAT', k, num(last + 1))
  end
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
