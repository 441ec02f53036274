-- acquire.lua: the entry of "acquire" and "try", a request for permits of
-- one or more resources (the waiter's side). Runs after queue.lua and its
-- includes, whose rule it obeys: every check and error reply comes before
-- finish().
--
-- KEYS: the five keys of each resource asked for, in name order.
-- ARGV: op ("acquire" or "try"), ticket, client, leaseMs, waiterMs, group
--       ("" for one resource), then permits, capacity for each resource
--       (lua/args.lua's parse_acquire).
-- Reply:
--   {1, nowMs, expiryMs, token...}  granted at once, a token per resource
--                                  (tokens are decimal strings)
--   {0}                            "try" only: not granted, nothing queued
--   {2, nowMs, nextEventMs}        queued; the grant arrives on the wake list
--   {3, nowMs, expiryMs, token...} granted already (this call is a resend of
--                                  one whose reply was lost, or the queue
--                                  moved while it ran): confirm it;
--                                  expiryMs 0: it has expired
--   {4}                            this request ended before this call ran (a
--                                  resend after its grant ended): ask again
--                                  under a new ticket
--   error "FAIRLOCK_CAPACITY <stored> <index>" when a capacity differs from
--         the one stored with a resource in use (is_idle: by live leases,
--         live queued waiters or live condition waiters; expired ones are
--         looked past)
-- The call is idempotent: go-redis resends a command whose reply it did not
-- get, and the resent call finds what the first one did.

local a = parse_acquire(ARGV, math.floor(#KEYS / 5))
-- One semaphore takes the fast path when it can; fast.acquire returns nil,
-- having written nothing, when the general path below must decide.
if FAST_PATHS and #KEYS == 5 and a[GROUP] == '' then
  local out = fast.acquire(KEYS, a)
  if out then return out end
end
begin(KEYS)
local ticket, client, lease, wait = a[TICKET], a[CLIENT], a[LEASE], a[WAIT]
local rs = declared(ticket, client)

-- granted returns the reply for a ticket granted on every resource: its
-- tokens and the earliest expiry of its parts (0 if any has expired).
local function granted(code)
  local out, exp = { code, now, 0 }, nil
  for i, r in ipairs(rs) do
    local ts, at = r.grants[ticket], nil
    if ts then
      -- Granted by this script (announced: it was queued): the lease is
      -- in the buffer.
      at = now + grant_ttl(lease, wait, true)
    else
      ts = r.grant
      at = ts and holder_at(r, holder_member(ticket, num(want_of(a, i)), client, ts))
    end
    if not alive(at) then
      exp = 0
    elseif exp == nil or at < exp then
      exp = at
    end
    out[i + 3] = ts or '0'
  end
  out[3] = exp or 0
  return out
end

-- A resent call finds what the first one did: a grant (recorded in S until
-- its lease ends), a tombstone (the grant has ended without its release),
-- or its member in the queue. A multi-request's parts may end apart (each
-- resource drops its expired lease and trims its tombstone when a script
-- comes by), so any resource's record counts: a tombstone on any says the
-- request has ended; a grant on any, that it was granted (the parts gone
-- since answer as expired), and no part is granted twice.
local g = false
for _, r in ipairs(rs) do
  if is_tomb(r.grant) then return { 4 } end
  if not g then g = r.grant end
end
if g then return granted(3) end

local want, members = {}, {}
for i in ipairs(rs) do
  want[i] = want_of(a, i)
  members[i] = waiter_member(ticket, want[i], client, lease, wait, a[GROUP])
end

-- A multi-request dropped from one of its queues (dead there) stays in
-- the others until a queue run finds it broken: a part still queued is
-- the first run's too.
local waiting = false
for i, r in ipairs(rs) do
  if not waiting and queued(r, members[i]) then waiting = true end
end
if waiting then
  -- A resend of a call that queued the ticket: it waits where the first
  -- run put it, and the first run did all there was to do then (its
  -- process's refresh keeps it alive and learns its grant). Nothing is
  -- written, so the resend leaves what one run left.
  prove_event_keys()
  return { 2, now, next_event() }
end

for i, r in ipairs(rs) do
  local capacity = cap_of(a, i)
  if r.cap and r.cap ~= capacity and not is_idle(r.nh, r.nq, r.nc) then
    -- The users of the stored capacity may all be gone: leases expired,
    -- waiters (queued or on a condition variable) dead. Look before
    -- refusing.
    purge_holders(r)
    purge_waiters(r)
  end
  if not r.cap or is_idle(r.nh, r.nq, r.nc) then
    -- Idle (whatever capacity was stored belonged to users who are all
    -- gone), or the state hash was lost and rebuilt: take the caller's.
    if r.cap ~= capacity then r.newcap = true end
    r.cap = capacity
  elseif r.cap ~= capacity then
    -- Nothing has been written: the buffer is dropped.
    return redis.error_reply('FAIRLOCK_CAPACITY ' .. num(r.cap) .. ' ' .. i)
  end
end

-- Expired leases and dead waiters may have made room for the queues.
local stuck = {}
for i, r in ipairs(rs) do
  if not may_grant_now(r.nq, r.used, want[i], r.cap) then stuck[#stuck + 1] = r end
end
if #stuck > 0 then
  run_queues(stuck)
  for i, r in ipairs(rs) do grantable_now(r, want[i]) end
end

local free = true
for i, r in ipairs(rs) do
  if not may_grant_now(r.nq, r.used, want[i], r.cap) then
    free = false
    break
  end
end
if free then
  local out = { 1, now, now + grant_ttl(lease, wait, false) }
  for i, r in ipairs(rs) do
    out[i + 3] = hold(r, ticket, want[i], num(want[i]), client, grant_ttl(lease, wait, false))
  end
  finish()
  return out
end
if a[OP] == 'try' then
  finish()
  return { 0 }
end

for i, r in ipairs(rs) do enqueue(r, ticket, members[i], client, wait) end
finish()
return { 2, now, next_event() }
