-- release.lua: the entry of "release", "renew", "leave" and "wait", the
-- calls about one request's lease or place (the holder's side). Runs after
-- queue.lua and its includes, whose rule it obeys: every check comes
-- before finish().
--
-- KEYS: the five keys of each resource of the request, in name order; for
--       "leave" and "wait", a condition's :c key may follow.
-- ARGV: op, ticket, client, leaseMs, waiterMs, group ("" for one
--       resource), announced ("1" if the grant was announced on a wake list
--       and not yet confirmed by a renewal; the rules treat both alike, the
--       record of either grant lasting as long as its lease), then permits,
--       token for each
--       resource; "wait" adds the new ticket and the condition's name
--       (lua/args.lua's parse_release).
-- Reply: {result, more}, more 1 when the queues have work left for later
-- scripts ("pump"); "wait": {result, more, nowMs, nextEventMs}.
--   "release"  frees the lease's permits on every resource and grants them
--              on; result 1, or 0 when the lease had already expired or
--              been dropped on some resource (its permits were not held),
--              or 3 when it finds neither the lease nor any record of its
--              ticket: a release leaves none, so an earlier run of this
--              call (whose reply was lost) released it, if it was sent
--              while the lease lived (a lease that ends otherwise leaves a
--              tombstone, and the keys outlive every lease and tombstone);
--              sent later, the lease may have ended long ago. The caller,
--              which knows when it sent the call, decides.
--   "renew"    extends a live lease to now + leaseMs on every resource;
--              result 1, or 0 when it has expired or is gone on any of
--              them, and then frees what is left of it. An expired lease
--              is never brought back.
--   "leave"    withdraws a ticket whatever its state, for a waiter whose
--              context ended (tokens are ignored): 1 it was waiting (in a
--              queue or on a condition variable), 2 it had just been
--              granted (the grant, announced to it, is handed on), 0 it was
--              already gone. It leaves the ticket's tombstone whatever it
--              found, so a copy of the ticket's acquire or wait that comes
--              after it does nothing.
--   "wait"     KEYS: one resource's, then the condition's. Releases the
--              lease as "release" does and, in the same step, makes the new
--              ticket a waiter of the condition (so no signal between the
--              two is lost); result 1, or 0 (nothing waits) when the lease
--              was no longer held. A resent call (the new ticket is known,
--              or, signalled since, queued or holding the lease the state
--              hash keeps) answers 1 and does nothing; 3, as "release",
--              when neither the lease nor the new ticket left a trace
--              (the caller, which knows when it sent the call, decides).

local nres = math.floor(#KEYS / 5)
-- A release on one semaphore takes the fast path when it can;
-- fast.release returns nil, having written nothing, when the general path
-- below must decide. It reads none of the numbers parse_release converts.
if FAST_PATHS and ARGV[OP] == 'release' and #KEYS == 5 and ARGV[GROUP] == '' then
  local out = fast.release(KEYS, ARGV)
  if out then return out end
end
local a = parse_release(ARGV, nres)
-- A call about a condition variable declares its two keys after the
-- resources': begin returns them.
local ckeys = begin(KEYS)

local op, ticket, client, lease, wait, group = a[OP], a[TICKET], a[CLIENT], a[LEASE], a[WAIT], a[GROUP]
local fresh, cond = wait_args(a, nres)
local rs = declared(ticket, client)
local parts = {}
for i, r in ipairs(rs) do
  local n, ns, ts = part_of(a, i)
  parts[i] = { r = r, n = n, ns = ns, ts = ts }
end
local result = 0

local cv
if op == 'wait' then
  cv = cond_load(rs[1], cond, ckeys[1])
  -- A resend: the first run made the new ticket wait (or more since): it
  -- waits on the condition, holds a lease in :h, or has ended (S records
  -- each), or, signalled since, holds the lease kept in the state hash or
  -- waits in the queue (neither recorded: this run's queues would end it
  -- there if it is dead, and leave the tombstone a second copy finds).
  if redis.call('HEXISTS', rs[1].S, fresh) == 1 or (rs[1].o and ticket_of(rs[1].o) == fresh)
      or queued(rs[1], waiter_member(fresh, parts[1].n, client, lease, wait, '')) then
    return { 1, 0, now, -1 }
  end
  if cv.off then return redis.error_reply('FAIRLOCK_COND_UNREACHABLE') end
end

if op == 'leave' then
  -- A grant this waiter has not heard of was announced, so S has its
  -- tokens.
  for _, p in ipairs(parts) do
    local g = p.r.grant
    p.ts = is_token(g) and g or '0'
    if not g then
      -- Queued, if its member is in the queue (a queued ticket has no
      -- record).
      if unqueue(p.r, waiter_member(ticket, p.n, client, lease, wait, group), false) then result = 1 end
    elseif string.sub(g, 1, 1) == CONDITION then
      -- Waiting on a condition variable.
      local c = cond_load(p.r, string.sub(g, 2), ckeys[1])
      local m = waiter_member(ticket, p.n, client, lease, wait, '')
      if not c.off then
        local at = redis.call('ZSCORE', c.C, m)
        seen(c.C)
        -- Its mark counts it: it goes. It was waiting unless its
        -- condition's key expired with it (the key outlives its waiters'
        -- deadlines, not the keys' later moves).
        cond_drop(p.r, c, m)
        if at then result = 1 end
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
      p.at = holder_at(p.r, p.hm)
    end
    if not alive(p.at) then live = false end
  end
  for _, p in ipairs(parts) do
    if p.at then
      if op == 'renew' and live then
        renew(p.r, p.hm, lease)
      elseif (op == 'release' or op == 'wait') and live then
        drop_holder(p.r, p.hm, p.n, true)
      else
        drop_holder(p.r, p.hm, p.n, false)
      end
    elseif op ~= 'renew' and is_token(p.r.grant) and p.r.grant == p.ts then
      -- A record whose lease is gone: the grant is over. (A record of
      -- another token is a later grant of the ticket, made by a late
      -- copy of its acquire after this lease was released: not this
      -- call's to end.)
      record(p.r, ticket, ENDED)
    end
  end
  if live then
    result = 1
    if op == 'leave' then result = 2 end
    if op == 'wait' then
      local p = parts[1]
      cond_add(p.r, cv, fresh, p.ns, client, lease, wait)
    end
  end
end
if op == 'leave' then
  -- A withdrawal ends its ticket for good, whatever it found: a copy of
  -- the ticket's acquire or wait that reaches Redis after it (sent before
  -- its caller left, and held up on another connection or in a socket's
  -- buffer) finds the tombstone and does nothing, rather than queue a
  -- ticket nobody waits for or grant it a lease nobody holds. (A grant it
  -- ended left one already; a signalled ticket's record stands. A cyclic
  -- barrier's party is withdrawn by its break.)
  for _, p in ipairs(parts) do
    if not p.r.off and not is_tomb(p.r.grants[ticket] or p.r.grant) and string.sub(p.r.base, -2) ~= KEY_SEP .. 'B' then
      record(p.r, ticket, ENDED)
    end
  end
end
-- A renewal frees nothing, unless it found its lease gone.
if op ~= 'renew' or result ~= 1 then run_queues(rs) end
if (op == 'release' or op == 'wait') and result == 0 then
  -- A resent release: its first run released every part, which left
  -- neither lease nor record (a lease that ended otherwise leaves a
  -- tombstone, this run's included: the queues' run above may have
  -- dropped another lease of the ticket). A resent wait whose new ticket
  -- has ended since with no trace (dead, and dropped by a signal or a
  -- queue's run) finds the same.
  local again = true
  for _, p in ipairs(parts) do
    if p.at or is_lease_trace(p.r.grant) or is_lease_trace(p.r.grants[ticket]) then again = false end
  end
  if again then result = 3 end
end
finish()
if op == 'wait' then return { result, more_flag(), now, next_event() } end
return { result, more_flag() }
