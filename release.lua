-- release.lua: the holder's side. Runs after queue.lua.
--
-- KEYS: the keys of each resource of one request, in name order.
-- ARGV: op, ticket, client, unconfirmed ("1" if the grant was announced
-- and not yet confirmed), leaseMs, waiterMs, group ("" for one resource),
-- then permits, token for each resource. Per op:
--   "release"  frees the lease's permits on every resource and grants them
--              on; returns 1, or 0 when the lease had already expired or
--              been dropped on some resource (its permits were not held).
--   "renew"    extends a live lease to now + leaseMs on every resource;
--              returns 1, or 0 when it has expired or is gone on any of
--              them, and then frees what is left of it. An expired lease
--              is never brought back.
--   "leave"    withdraws a ticket whatever its state, for a waiter whose
--              context ended (tokens are ignored): 1 it was waiting, 2 it
--              had just been granted (the grant, announced to it, is handed
--              on), 0 it was already gone.

local op, ticket, client, unconfirmed = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lease, wait, group = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local rs = declared(op == 'leave' and ticket or nil)
local parts = {}
for i, r in ipairs(rs) do
  -- The client formats numbers as the scripts do, so its strings serve
  -- in members as they are.
  parts[i] = { r = r, n = tonumber(ARGV[6 + 2 * i]), ns = ARGV[6 + 2 * i], ts = ARGV[7 + 2 * i] }
end
local result = 0

if op == 'leave' then
  -- A grant this waiter has not heard of was announced, so S has its
  -- tokens.
  unconfirmed = '1'
  for _, p in ipairs(parts) do
    p.ts = p.r.grant or '0'
    local m = waiter_member(ticket, p.n, client, lease, wait, group)
    if redis.call('ZREM', p.r.Q, m) == 1 then
      redis.call('ZREM', p.r.D, m)
      p.r.nq = p.r.nq - 1
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
        redis.call('ZADD', p.r.H, num(now + lease), p.hm)
        p.r.horizon = now + lease
      else
        drop_holder(p.r, p.hm, p.n)
      end
    end
    -- A grant announced to this ticket is confirmed, or the grant is over.
    if unconfirmed == '1' or op ~= 'renew' then record(p.r, ticket, false) end
  end
  if live then
    result = 1
    if op == 'leave' then result = 2 end
  end
end
run_queues(rs)
finish()
return result
