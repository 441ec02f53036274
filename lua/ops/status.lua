-- status.lua: the entry of "status": what a resource holds now, for
-- monitoring. Reads only.
--
-- KEYS: one resource's five keys.
-- ARGV: op ("status").
-- Reply: {nowMs, capacity, {holder, expiryMs, ...}, {waiter, sequence,
--   ...}, holders, waiters}: live entries, at most STATUS_MAX of each,
--   and the counts (which include entries that have expired but were not
--   yet dropped).

local STATUS_MAX = 1000

begin(KEYS)
local r = declared()[1]
local holders, waiters = {}, {}
-- Live holders (see alive): expiry after now.
local h = redis.call('ZRANGEBYSCORE', r.H, '(' .. num(now), '+inf', 'WITHSCORES', 'LIMIT', 0, STATUS_MAX)
for i = 1, #h, 2 do
  holders[#holders + 1] = h[i]
  holders[#holders + 1] = h[i + 1]
end
local q = redis.call('ZRANGE', r.Q, 0, STATUS_MAX - 1, 'WITHSCORES')
for i = 1, #q, 2 do
  if alive(tonumber(redis.call('ZSCORE', r.D, q[i]))) then
    waiters[#waiters + 1] = q[i]
    waiters[#waiters + 1] = q[i + 1]
  end
end
return { now, r.cap or 0, holders, waiters, r.nh, r.nq }
