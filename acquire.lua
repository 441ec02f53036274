-- acquire.lua: the waiter's side. Runs after queue.lua.
--
-- ARGV[1] op:
--   "acquire" | "try"  KEYS: the keys of each resource asked for, in name
--                      order. ARGV: op, ticket, client, leaseMs, waiterMs,
--                      group ("" for one resource), then permits, capacity
--                      for each resource.
--     returns {1, token...}       granted at once, a token per resource
--                                 (tokens are decimal strings)
--             {0}                 "try" only: not granted, nothing queued
--             {2, nextEventMs}    queued; the grant arrives on the wake list
--             {3, token...}       granted already (this call is a retry of
--                                 one whose reply was lost): confirm it
--     The call is idempotent: go-redis resends a command whose reply it did
--     not get, and the resent call finds what the first one did.
--     error   "FAIRLOCK_CAPACITY <stored> <index>" when a capacity differs
--             from the one stored with a resource in use
--   "refresh"          KEYS: one resource's. ARGV: op, client, leaseMs,
--                      waiterMs, then ticket, permits, group for each of
--                      one process's waiters whose first resource it is:
--     keeps them alive and reports those that no longer wait:
--     {nextEventMs, {ticket, tokens-or-0, ...}}; tokens ("t1 t2 ...", one
--     per resource) mean granted (in case the wake-up was lost), 0 means
--     dropped.
--   "status"           KEYS: one resource's. ARGV: op; changes nothing.
--     Returns {nowMs, capacity, {holder, expiryMs, ...}, {waiter,
--     sequence, ...}} for live entries.

local op = ARGV[1]

if op == 'status' then
  local r = declared()[1]
  local holders, waiters = {}, {}
  local h = redis.call('ZRANGEBYSCORE', r.H, '(' .. num(now), '+inf', 'WITHSCORES')
  for i = 1, #h, 2 do
    holders[#holders + 1] = h[i]
    holders[#holders + 1] = h[i + 1]
  end
  local q = redis.call('ZRANGE', r.Q, 0, -1, 'WITHSCORES')
  for i = 1, #q, 2 do
    local at = redis.call('ZSCORE', r.D, q[i])
    if at and tonumber(at) > now then
      waiters[#waiters + 1] = q[i]
      waiters[#waiters + 1] = q[i + 1]
    end
  end
  return { now, r.cap or 0, holders, waiters }
end

if op == 'refresh' then
  local first = declared()[1]
  local client, lease, wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
  purge_holders(first)
  local out = {}
  for i = 5, #ARGV, 3 do
    local ticket, n, group = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local parts = { { base = first.base, n = n } }
    if group ~= '' then parts = parse_group(group) end
    if redis.call('ZSCORE', first.Q, waiter_member(ticket, n, client, lease, wait, group)) then
      for _, p in ipairs(parts) do
        local r = load(p.base)
        redis.call('ZADD', r.D, now + wait, waiter_member(ticket, p.n, client, lease, wait, group))
        r.horizon = math.max(r.horizon, now + wait)
      end
    else
      -- Granted, if every part holds a live lease under the token its
      -- announcement recorded.
      local tokens = {}
      for j, p in ipairs(parts) do
        local r = load(p.base)
        local token = r.grants[ticket]
        if token == nil then token = redis.call('HGET', r.S, ticket) end
        local at = token and redis.call('ZSCORE', r.H, holder_member(ticket, num(p.n), client, token))
        if not (at and tonumber(at) > now) then
          tokens = nil
          break
        end
        tokens[j] = token
      end
      out[#out + 1] = ticket
      out[#out + 1] = tokens and table.concat(tokens, ' ') or '0'
    end
  end
  run_queues(loaded)
  finish()
  return { next_event(), out }
end

local ticket, client = ARGV[2], ARGV[3]
local lease, wait, group = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local rs = declared(ticket)

-- Every grant is recorded in S until released, so a retried call learns
-- of one (whether this call's first run made it or a release announced
-- it since) and a waiter that withdraws after a lost reply can find it.
if rs[1].grant then
  local out = { 3 }
  for i, r in ipairs(rs) do
    out[i + 1] = r.grant or '0'
  end
  return out
end

local want = {}
for i, r in ipairs(rs) do
  local n, capacity = tonumber(ARGV[5 + 2 * i]), tonumber(ARGV[6 + 2 * i])
  want[i] = n
  if not r.cap or (r.nh <= 0 and r.nq <= 0) then
    -- Idle (whatever capacity was stored belonged to users who are all
    -- gone), or the state hash was lost and rebuilt: take the caller's.
    if r.cap ~= capacity then r.newcap = true end
    r.cap = capacity
  elseif r.cap ~= capacity then
    return redis.error_reply('FAIRLOCK_CAPACITY ' .. num(r.cap) .. ' ' .. i)
  end
end

-- Expired leases and dead waiters may have made room for the queues.
local stuck = {}
for i, r in ipairs(rs) do
  if r.nq > 0 or r.used + want[i] > r.cap then stuck[#stuck + 1] = r end
end
if #stuck > 0 then
  run_queues(stuck)
  for i, r in ipairs(rs) do
    if r.nq <= 0 then fits(r, want[i]) end
  end
end

local free = true
for i, r in ipairs(rs) do
  if r.nq > 0 or r.used + want[i] > r.cap then
    free = false
    break
  end
end
if free then
  local out = { 1 }
  for i, r in ipairs(rs) do
    out[i + 1] = hold(r, ticket, want[i], num(want[i]), client, lease)
  end
  finish()
  return out
end
if op == 'try' then
  finish()
  return { 0 }
end

for i, r in ipairs(rs) do
  local m = waiter_member(ticket, want[i], client, lease, wait, group)
  -- NX: a retried call leaves the ticket where the first one put it.
  if redis.call('ZADD', r.Q, 'NX', next_seq(r), m) == 1 then
    r.nq = r.nq + 1
  end
  redis.call('ZADD', r.D, now + wait, m)
  r.wrote_q = true
  r.horizon = math.max(r.horizon, now + wait)
end
finish()
return { 2, next_event() }
