-- release.lua: the holder's side. Runs after queue.lua, whose rule it
-- obeys: every check comes before finish().
--
-- KEYS: the keys of each resource of one request, in name order.
-- ARGV: op, ticket, client, leaseMs, waiterMs, group ("" for one
-- resource), as acquire.lua takes them; then announced ("1" if the grant
-- was announced on a wake list and not yet confirmed by a renewal), then
-- permits, token for each resource. Every op returns {result, more}:
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
--              context ended (tokens are ignored): 1 it was waiting (in a
--              queue or on a condition variable), 2 it had just been
--              granted (the grant, announced to it, is handed on), 0 it was
--              already gone. A condition's keys may follow the resource's.
--   "wait"     KEYS: one resource's, then a condition's :c and :e keys.
--              ARGV as for "release", then the new ticket and the
--              condition's name. Releases the lease as "release" does and,
--              in the same step, makes the new ticket a waiter of the
--              condition (so no signal between the two is lost); result 1,
--              or 0 (nothing waits) when the lease was no longer held. A
--              resent call (the new ticket is known) answers 1 and does
--              nothing. Returns {result, more, nowMs, nextEventMs}.

-- A release on one semaphore takes the fast path (queue.lua) when it
-- can; fast_release returns nil, having written nothing, when the general
-- path below must decide.
if FAST_PATHS and ARGV[1] == 'release' and #KEYS == 5 and ARGV[6] == '' then
  local out = fast_release(KEYS, ARGV)
  if out then return out end
end
-- A call about a condition variable declares its two keys after the
-- resource's five: begin returns them.
local ckeys = begin(KEYS)

local op, ticket, client = ARGV[1], ARGV[2], ARGV[3]
local lease, wait, group, announced = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]
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
  return g and g ~= 'r' and g ~= 'x' and g ~= 'q' and string.sub(g, 1, 1) ~= 'c'
end

local cv, fresh
if op == 'wait' then
  fresh = ARGV[10]
  cv = cond_load(rs[1], ARGV[11], ckeys[1], ckeys[2])
  -- A resend: the first run made the new ticket wait (or more since).
  if redis.call('HEXISTS', rs[1].S, fresh) == 1 then return { 1, 0, now, -1 } end
  if cv.off then return redis.error_reply('FAIRLOCK_COND_UNREACHABLE') end
end

if op == 'leave' then
  -- A grant this waiter has not heard of was announced, so S has its
  -- tokens.
  announced = '1'
  for _, p in ipairs(parts) do
    p.ts = is_token(p.r.grant) and p.r.grant or '0'
    if p.r.grant == 'q' then
      unqueue(p.r, waiter_member(ticket, p.n, client, lease, wait, group), true)
      result = 1
    elseif p.r.grant and string.sub(p.r.grant, 1, 1) == 'c' then
      -- Waiting on a condition variable.
      local c = cond_load(p.r, string.sub(p.r.grant, 2), ckeys[1], ckeys[2])
      local m = waiter_member(ticket, p.n, client, lease, wait, '')
      if not c.off then
        if redis.call('ZSCORE', c.E, m) then
          cond_drop(p.r, c, m)
          result = 1
        else
          record(p.r, ticket, false)
        end
      end
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
        if announced == '1' then record(p.r, ticket, false) end
      elseif (op == 'release' or op == 'wait') and live then
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
    if op == 'wait' then
      local p = parts[1]
      cond_add(p.r, cv, fresh, p.ns, client, lease, wait)
    end
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
if op == 'wait' then return { result, more_flag(), now, next_event() } end
return { result, more_flag() }
