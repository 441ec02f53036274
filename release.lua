-- release.lua: the holder's side. Runs after queue.lua (same KEYS).
--
-- ARGV[1] op:
--   "release"  ARGV: op, ticket
--     frees the ticket's permits and grants them on; returns 1, or 0 when the
--     lease had already expired or been dropped (the permits were not held).
--   "leave"    ARGV: op, ticket
--     withdraws a ticket whatever its state, for a waiter whose context
--     ended: 1 it was waiting, 2 it had just been granted (the grant is
--     handed on), 0 it was already gone.
--   "renew"    ARGV: op, ticket, leaseMs
--     extends a live lease to now + leaseMs; returns 1, or 0 when the lease
--     has expired or is gone. An expired lease is never brought back.

local op, id = ARGV[1], ARGV[2]
local result = 0

purge()
if op == 'renew' then
  if redis.call('ZSCORE', H, id) then
    redis.call('ZADD', H, 'XX', now + tonumber(ARGV[3]), id)
    result = 1
  end
elseif redis.call('ZSCORE', H, id) then
  local t = ticket(id)
  redis.call('ZREM', H, id)
  redis.call('HDEL', I, id)
  if t then redis.call('HINCRBY', S, 'used', -t.n) end
  result = 1
  if op == 'leave' then result = 2 end
elseif op == 'leave' and redis.call('ZSCORE', Q, id) then
  redis.call('ZREM', Q, id)
  redis.call('ZREM', D, id)
  redis.call('HDEL', I, id)
  result = 1
end
pump('')
finish()
return result
