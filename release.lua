-- release.lua: the holder's side. Runs after queue.lua (same KEYS).
--
-- ARGV: op, ticket, permits, client, then per op:
--   "release"  ARGV[5] token, ARGV[6] "1" if the grant was announced and not
--              confirmed: frees the lease's permits and grants them on;
--              returns 1, or 0 when the lease had already expired or been
--              dropped (its permits were not held any more).
--   "renew"    ARGV[5], ARGV[6] as for release, ARGV[7] leaseMs: extends a
--              live lease to now + leaseMs; returns 1, or 0 when it has
--              expired or is gone. An expired lease is never brought back.
--   "leave"    ARGV[5..6] leaseMs, waiterMs: withdraws a ticket whatever its
--              state, for a waiter whose context ended: 1 it was waiting, 2
--              it had just been granted (the grant, announced to it, is
--              handed on), 0 it was already gone.

local op, ticket, n, client = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local result = 0
local token, unconfirmed = tonumber(ARGV[5]), ARGV[6]

rebuild()
if op == 'leave' then
  -- A grant this waiter has not heard of was announced, so I has its token.
  token = tonumber(redis.call('HGET', I, ticket) or 0)
  unconfirmed = '1'
  local m = waiter_member(ticket, n, client, ARGV[5], ARGV[6])
  if redis.call('ZREM', Q, m) == 1 then
    redis.call('ZREM', D, m)
    nq = nq - 1
    result = 1
  end
end
if result == 0 and token > 0 then
  local hm = holder_member(ticket, n, client, token)
  local at = redis.call('ZSCORE', H, hm)
  if at then
    if op == 'renew' and tonumber(at) > now then
      local lease = tonumber(ARGV[7])
      redis.call('ZADD', H, now + lease, hm)
      horizon = now + lease
      result = 1
    elseif op ~= 'renew' then
      drop_holder(hm)
      if tonumber(at) > now then
        result = 1
        if op == 'leave' then result = 2 end
      end
    else
      drop_holder(hm) -- expired: renew finds it gone and frees its permits
    end
  end
  -- A grant announced to this ticket is confirmed or over.
  if unconfirmed == '1' then redis.call('HDEL', I, ticket) end
end
pump('')
finish()
return result
