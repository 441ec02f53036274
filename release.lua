-- release.lua: the holder's side. Runs after queue.lua, whose rule it
-- obeys: every check comes before finish().
--
-- KEYS: the keys of each resource of one request, in name order.
-- ARGV: op, ticket, client, unconfirmed ("1" if the grant was announced
-- and not yet confirmed), leaseMs, waiterMs, group ("" for one resource),
-- then permits, token for each resource. Every op returns {result, more}:
-- more is 1 when the queues have work left for later scripts ("pump").
--   "release"  frees the lease's permits on every resource and grants them
--              on; result 1, or 0 when the lease had already expired or
--              been dropped on some resource (its permits were not held).
--              A resent release (its first run's reply was lost) finds the
--              tombstone the first run left and answers 1 again.
--   "renew"    extends a live lease to now + leaseMs on every resource;
--              result 1, or 0 when it has expired or is gone on any of
--              them, and then frees what is left of it. An expired lease
--              is never brought back.
--   "leave"    withdraws a ticket whatever its state, for a waiter whose
--              context ended (tokens are ignored): 1 it was waiting, 2 it
--              had just been granted (the grant, announced to it, is handed
--              on), 0 it was already gone.

begin(KEYS)

local op, ticket, client, unconfirmed = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lease, wait, group = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local rs = declared(ticket)
local parts = {}
for i, r in ipairs(rs) do
  -- The client formats numbers as the scripts do, so its strings serve
  -- in members as they are.
  parts[i] = { r = r, n = tonumber(ARGV[6 + 2 * i]), ns = ARGV[6 + 2 * i], ts = ARGV[7 + 2 * i] }
end
local result = 0

-- is_token tells a grant record from a tombstone or nothing.
local function is_token(g)
  return g and g ~= 'r' and g ~= 'x' and g ~= 'q'
end

if op == 'leave' then
  -- A grant this waiter has not heard of was announced, so S has its
  -- tokens.
  unconfirmed = '1'
  for _, p in ipairs(parts) do
    p.ts = is_token(p.r.grant) and p.r.grant or '0'
    if p.r.grant == 'q' then
      unqueue(p.r, waiter_member(ticket, p.n, client, lease, wait, group), true)
      result = 1
    end
  end
end

if result == 0 then
  -- Find the lease on every resource; it is live only if live on all.
  local live = true
  for _, p in ipairs(parts) do
    if p.ts ~= '0' then
      p.hm = holder_member(ticket, p.ns, client, p.ts)
      p.at = tonumber(redis.call('ZSCORE', p.r.H, p.hm))
    end
    if not (p.at and p.at > now) then live = false end
  end
  for _, p in ipairs(parts) do
    if p.at then
      if op == 'renew' and live then
        hold_at(p.r, now + lease, p.hm)
        -- A grant announced to this ticket is confirmed.
        if unconfirmed == '1' then record(p.r, ticket, false) end
      elseif op == 'release' and live then
        drop_holder(p.r, p.hm, p.n, 'r')
      else
        drop_holder(p.r, p.hm, p.n, 'x')
      end
    elseif op ~= 'renew' and is_token(p.r.grant) then
      -- A record whose lease is gone: the grant is over.
      record(p.r, ticket, 'x')
    end
  end
  if live then
    result = 1
    if op == 'leave' then result = 2 end
  elseif op == 'release' then
    -- A resent release: its first run released every part.
    local again = true
    for _, p in ipairs(parts) do
      if p.at or p.r.grant ~= 'r' then again = false end
    end
    if again then result = 1 end
  end
end
-- A renewal frees nothing, unless it found its lease gone.
if op ~= 'renew' or result ~= 1 then run_queues(rs) end
finish()
return { result, more_flag() }
