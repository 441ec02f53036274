-- cond.lua: condition variables bound to a resource (a mutex); see the
-- key layout in queue.lua. A condition's waiter leaves it atomically in
-- one of four ways: woken by a signal (cond_wake:
-- granted at once or queued), dropped as dead by a signal (its deadline
-- passed), withdrawn by its process (leave), or found inconsistent by a
-- refresh. Each takes its member out of both keys and its marker out of S.

-- cond_keys names the keys of the condition name of the resource at base.
local function cond_keys(base, name)
  if name == '' then return base .. ':c', base .. ':e' end
  return base .. ':c:' .. name, base .. ':e:' .. name
end

-- cond_load returns the condition name of resource r. declared holds the
-- condition keys the caller passed in KEYS (possibly none); keys not
-- declared are probed first, and a condition whose keys cannot be reached
-- now (its slot is migrating) comes back with off set: nothing may be
-- written to it in this script.
local function cond_load(r, name, declared_c, declared_e)
  local cv = r.conds_by[name]
  if cv then return cv end
  local C, E = cond_keys(r.base, name)
  cv = { name = name, C = C, E = E, wrote = false, gone = {} }
  if C ~= declared_c or E ~= declared_e then
    local probe = redis.pcall('EXISTS', C, E)
    if type(probe) == 'table' and probe.err then cv.off = true end
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
  write('ZADD', cv.E, num(now + wait), m)
  r.horizon = math.max(r.horizon, now + wait)
  record(r, ticket, CONDITION .. cv.name)
  r.nc = r.nc + 1
  cv.wrote = true
end

-- cond_drop takes waiter m (read from cv) out of condition cv of r.
local function cond_drop(r, cv, m)
  if cv.gone[m] then return end
  cv.gone[m] = true
  write('ZREM', cv.C, m)
  write('ZREM', cv.E, m)
  r.nc = math.max(r.nc - 1, 0)
  record(r, ticket_of(m), false)
  cv.wrote = true
end

-- cond_wake moves waiter m (parsed: w) from condition cv into r's queue,
-- under a new sequence number: behind every ticket already queued, and
-- behind the waiters woken before it. When nobody is queued (r's queue has
-- been run by the caller) and it fits, it is granted at once instead: the
-- queue reads what Redis holds, not what this script has buffered, so a
-- waiter queued here could not be granted before the next script.
local function cond_wake(r, cv, m, w)
  cond_drop(r, cv, m)
  if grantable_now(r, w.n) then
    announce(w, { { base = r.base, n = w.n, ns = w.ns } })
    return
  end
  enqueue(r, w.ticket, m, w.wait)
end

-- cond_purge drops the waiters of cv whose process stopped refreshing
-- them, at most the budget left; it reports whether it had to stop there.
local function cond_purge(r, cv)
  if budget <= 0 then return true end
  local limit = budget
  -- The waiters due (see due): deadline at most now.
  local gone = redis.call('ZRANGEBYSCORE', cv.E, '-inf', due_max(), 'LIMIT', 0, limit)
  for _, m in ipairs(gone) do
    budget = budget - 1
    cond_drop(r, cv, m)
  end
  return #gone >= limit
end
