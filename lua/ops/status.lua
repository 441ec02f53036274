-- status.lua: the entry of "status": what a resource holds now, by
-- Redis's clock, for monitoring. Reads only, in bounded time at any size.
--
-- KEYS: one resource's five keys.
-- ARGV: op ("status").
-- Reply: {nowMs, capacity, {holder, expiryMs, ...}, {waiter, sequence,
--   ...}, holders, waiters, inUse}: live entries, at most STATUS_MAX of
--   each; then the live leases and live waiters counted (those recorded
--   less those due, see due; the dead waiters are counted among the first
--   STATUS_MAX queued, those past them counted as live), and the permits
--   the live leases hold (those
--   recorded less those of the leases due: exact while at most
--   EXPIRED_MAX leases are due and not yet dropped, and otherwise an upper
--   bound, each lease past that counted as one permit).

local STATUS_MAX = 1000
local EXPIRED_MAX = 10000

begin(KEYS)
local r = declared()[1]
local holders, waiters = {}, {}
-- Live holders (see alive): expiry after now.
-- The holder kept in the state hash first, then those in :h.
if r.o and alive(r.oe) then
  holders[1], holders[2] = r.o, num(r.oe)
end
local h = redis.call('ZRANGEBYSCORE', r.H, live_min(), '+inf', 'WITHSCORES', 'LIMIT', 0, STATUS_MAX)
for i = 1, #h, 2 do
  holders[#holders + 1] = h[i]
  holders[#holders + 1] = h[i + 1]
end
-- A queued waiter lives while its process's liveness field says so
-- (waiter_alive).
local ddue = 0
local q = {}
if r.nq > 0 then q = redis.call('ZRANGE', r.Q, 0, STATUS_MAX - 1, 'WITHSCORES') end
for i = 1, #q, 2 do
  local w = parse_waiter(q[i])
  if w and waiter_alive(tonumber(q[i + 1]), live_of(r, w.client, false, tonumber(q[i + 1]))) then
    waiters[#waiters + 1] = q[i]
    waiters[#waiters + 1] = q[i + 1]
  else
    ddue = ddue + 1
  end
end
-- The leases due (score at most now) are counted, not read; the permits
-- of the leases due are read, at most EXPIRED_MAX of them.
local hdue = 0
if in_h(r) > 0 then hdue = redis.call('ZCOUNT', r.H, '-inf', due_max()) end
local inuse = r.used
if hdue > 0 then
  local gone = redis.call('ZRANGEBYSCORE', r.H, '-inf', due_max(), 'LIMIT', 0, EXPIRED_MAX)
  for _, m in ipairs(gone) do
    local _, n = parse_holder(m)
    inuse = inuse - n
  end
  inuse = inuse - (hdue - #gone)
end
if r.o and due(r.oe) then
  local _, n = parse_holder(r.o)
  inuse = inuse - n
  hdue = hdue + 1
end
return { now, r.cap or 0, holders, waiters, math.max(r.nh - hdue, 0), math.max(r.nq - ddue, 0), math.max(inuse, 0) }
