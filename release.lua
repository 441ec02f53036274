-- release.lua: the holder's side. Runs after queue.lua (same KEYS).
--
-- ARGV: op, ticket, permits, then per op:
--   "release"  ARGV[4] "1" if the grant was announced and not confirmed:
--              frees the lease's permits and grants them on; returns 1, or 0
--              when the lease had already expired or been dropped (its
--              permits were not held any more).
--   "renew"    ARGV[4] leaseMs, ARGV[5] as release's ARGV[4]: extends a
--              live lease to now + leaseMs; returns 1, or 0 when it has
--              expired or is gone. An expired lease is never brought back.
--   "leave"    ARGV[4..6] client, leaseMs, waiterMs: withdraws a ticket
--              whatever its state, for a waiter whose context ended: 1 it
--              was waiting, 2 it had just been granted (the grant is handed
--              on), 0 it was already gone.

local op, ticket, n = ARGV[1], ARGV[2], ARGV[3]
local result = 0

rebuild()
if op == 'leave' then
  local m = waiter_member(ticket, n, ARGV[4], ARGV[5], ARGV[6])
  if redis.call('ZREM', Q, m) == 1 then
    redis.call('ZREM', D, m)
    nq = nq - 1
    result = 1
  end
end
if result == 0 then
  local hm = holder_member(ticket, n)
  local at = redis.call('ZSCORE', H, hm)
  if at then
    if op == 'renew' and tonumber(at) > now then
      local lease = tonumber(ARGV[4])
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
  local unconfirmed = ARGV[4]
  if op == 'renew' then unconfirmed = ARGV[5] end
  if op == 'leave' or unconfirmed == '1' then redis.call('HDEL', I, ticket) end
end
pump('')
finish()
return result
