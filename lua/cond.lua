-- cond.lua: condition variables bound to a resource (a mutex); see the
-- key layout in queue.lua. A condition's waiter leaves it atomically in
-- one of four ways: woken by a signal (cond_wake: granted at once or
-- queued), dropped as dead (its process's liveness, waiter_alive, found
-- gone by a signal, a latch's opening, a barrier or a refresh that reach
-- it), withdrawn by its process (leave), or found inconsistent by a
-- refresh. Each takes its member out of the condition's key and its
-- marker out of S.

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
    if unreachable(C) then cv.off = true end
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
  local seq = next_seq(r)
  write('ZADD', cv.C, num(seq), m)
  keep_alive(r, client, wait, seq)
  record(r, ticket, CONDITION .. cv.name)
  r.nc = r.nc + 1
  cv.wrote = true
end

-- cond_drop takes waiter m (read from cv, or found there by its mark)
-- off condition cv of r, and out of its count and S.
local function cond_drop(r, cv, m)
  if cv.gone[m] then return false end
  cv.gone[m] = true
  write('ZREM', cv.C, m)
  r.nc = math.max(r.nc - 1, 0)
  record(r, ticket_of(m), false)
  cv.wrote = true
  return true
end

-- cond_waiters returns condition cv's waiters that this script has not
-- taken off, at most limit of them (nil: all), in order, with bound the
-- highest sequence to read (nil: all): their members, and their
-- sequences (scores).
local function cond_waiters(r, cv, limit, bound)
  local skip = 0
  for _ in pairs(cv.gone) do skip = skip + 1 end
  local max = '+inf'
  if bound and bound < math.huge then max = num(bound) end
  local got
  if limit then
    got = redis.call('ZRANGEBYSCORE', cv.C, '-inf', max, 'WITHSCORES', 'LIMIT', 0, limit + skip)
  else
    got = redis.call('ZRANGEBYSCORE', cv.C, '-inf', max, 'WITHSCORES')
  end
  seen(cv.C)
  local ms, seqs = {}, {}
  for i = 1, #got, 2 do
    if not cv.gone[got[i]] then
      ms[#ms + 1], seqs[#seqs + 1] = got[i], tonumber(got[i + 1])
    end
  end
  return ms, seqs, #got < (limit or 0) + skip
end

-- cond_purge drops condition cv's dead waiters (waiter_alive), at most
-- the budget left, reading at most limit of them (nil: all; a barrier's
-- round, at most its parties). It returns how many live ones it read.
local function cond_purge(r, cv, limit)
  if cv.off or r.nc <= 0 then return 0 end
  local ms, seqs = cond_waiters(r, cv, limit)
  local live = 0
  for i, m in ipairs(ms) do
    local w = parse_waiter(m)
    if w and waiter_alive(seqs[i], live_of(r, w.client, false, seqs[i])) then
      live = live + 1
    elseif budget > 0 then
      budget = budget - 1
      cond_drop(r, cv, m)
    else
      more = true
    end
  end
  return live
end

-- purge_waiters drops r's dead waiters that the capacity check must look
-- past (acquire.lua): the queue's dead heads (head stops at the first
-- live one, which keeps the resource in use), and the dead waiters of its
-- condition variables, found by their marks in S, read whole: a rare
-- path (a capacity that differs while the resource is in use). At most
-- the budget.
local function purge_waiters(r)
  if r.off or r.wpurged then return end
  r.wpurged = true
  head(r)
  if r.nc <= 0 then return end
  local names, marked = cond_marks(redis.call('HGETALL', r.S))
  for _, name in ipairs(names) do
    local cv = cond_load(r, name)
    if not cv.off then
      -- A marked waiter in no key lost it with the key (which outlives
      -- its waiters' deadlines): dead, it goes by its mark.
      local present = {}
      for _, m in ipairs((cond_waiters(r, cv, nil))) do present[ticket_of(m)] = true end
      for _, t in ipairs(marked[name]) do
        if not present[t] and budget > 0 and r.grants[t] == nil then
          budget = budget - 1
          record(r, t, false)
          r.nc = math.max(r.nc - 1, 0)
        end
      end
      cond_purge(r, cv, nil)
    end
  end
end

-- cond_wake moves waiter m (parsed: w) from condition cv into r's queue,
-- under a new sequence number: behind every ticket already queued, and
-- behind the waiters woken before it. When nobody is
-- queued (r's queue has been run by the caller) and it fits, it is granted
-- at once instead: the queue reads what Redis holds, not what this script
-- has buffered, so a waiter queued here could not be granted before the
-- next script.
local function cond_wake(r, cv, m, w)
  cond_drop(r, cv, m)
  if grantable_now(r, w.n) then
    announce(w, { { base = r.base, n = w.n, ns = w.ns } })
    return
  end
  enqueue(r, w.ticket, m, w.client, w.wait)
end
