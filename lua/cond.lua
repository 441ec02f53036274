-- cond.lua: condition variables bound to a resource (a mutex); see the
-- key layout in queue.lua. A condition's waiter leaves it atomically in
-- one of four ways: woken by a signal (cond_wake: granted at once or
-- queued), dropped as dead (its deadline passed: purge_waiters, as any
-- waiter of the resource), withdrawn by its process (leave), or found
-- inconsistent by a refresh. Each takes its member out of the condition's
-- key, and out of :d unless it moves to the queue, and its marker out of S.

-- cond_key names the key of the condition name of the resource at base.
local function cond_key(base, name)
  return derived_key(base, 'c', name)
end

-- cond_load returns the condition name of resource r. declared is the
-- condition key the caller passed in KEYS (possibly none); a key not
-- declared is probed first, and a condition whose key cannot be reached
-- now (its slot is migrating) comes back with off set: nothing may be
-- written to it in this script.
local function cond_load(r, name, declared)
  local cv = r.conds_by[name]
  if cv then return cv end
  local C = cond_key(r.base, name)
  cv = { name = name, C = C, wrote = false, gone = {} }
  if C ~= declared then
    local probe = redis.pcall('EXISTS', C)
    if type(probe) == 'table' and probe.err then cv.off = true end
    reach(C, 'zset')
  end
  r.conds_by[name] = cv
  r.conds[#r.conds + 1] = cv
  return cv
end

-- cond_add makes ticket a waiter of condition cv of r: it waits there in
-- arrival order, alive until now + wait unless refreshed.
local function cond_add(r, cv, ticket, ns, client, lease, wait)
  local m = waiter_member(ticket, ns, client, lease, wait, '')
  write('ZADD', cv.C, num(next_seq(r)), m)
  wait_at(r, now + wait, m)
  keep_alive(r, client, wait)
  record(r, ticket, CONDITION .. cv.name)
  if r.nq0 + r.nc0 <= 0 then r.wrote_d = true end
  r.nc = r.nc + 1
  cv.wrote = true
end

-- cond_unlink takes waiter m (read from cv) off condition cv of r, and
-- out of its count and S; its deadline in :d stays (see cond_drop,
-- cond_wake).
local function cond_unlink(r, cv, m)
  if cv.gone[m] then return false end
  cv.gone[m] = true
  write('ZREM', cv.C, m)
  r.nc = math.max(r.nc - 1, 0)
  record(r, ticket_of(m), false)
  cv.wrote = true
  return true
end

-- cond_drop takes waiter m (read from cv) out of condition cv of r, and
-- its deadline out of :d.
local function cond_drop(r, cv, m)
  if cond_unlink(r, cv, m) then
    r.dgone[m] = true
    write('ZREM', r.D, m)
  end
end

-- cond_forget ends waiter m (ticket) of condition cv of r, found dead or
-- gone from cv, given its deadline at in :d (nil: none there): one with a
-- deadline still counts, and goes with it (cond_drop); one without has
-- only its mark in S left. The leave and the refresh both end such a
-- waiter this way.
local function cond_forget(r, cv, m, ticket, at)
  if at then
    cond_drop(r, cv, m)
  else
    record(r, ticket, false)
  end
end

-- drop_cond_waiter takes dead waiter m of r's condition name out of it
-- (see grant.lua's forward declaration). A condition that cannot be
-- reached now keeps it: it stays due, and a later script drops it.
drop_cond_waiter = function(r, name, m)
  local cv = cond_load(r, name)
  if not cv.off then cond_drop(r, cv, m) end
end

-- cond_wake moves waiter m (parsed: w) from condition cv into r's queue,
-- under a new sequence number: behind every ticket already queued, and
-- behind the waiters woken before it, with a new deadline. When nobody is
-- queued (r's queue has been run by the caller) and it fits, it is granted
-- at once instead: the queue reads what Redis holds, not what this script
-- has buffered, so a waiter queued here could not be granted before the
-- next script.
local function cond_wake(r, cv, m, w)
  if grantable_now(r, w.n) then
    cond_drop(r, cv, m)
    announce(w, { { base = r.base, n = w.n, ns = w.ns } })
    return
  end
  -- The member stays in :d (a removal there would undo the new deadline:
  -- apply adds before it removes).
  cond_unlink(r, cv, m)
  enqueue(r, w.ticket, m, w.client, w.wait)
end
