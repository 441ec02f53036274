-- grant.lua: the grant rule. Leases whose time has come are dropped
-- (purge_holders), and dead waiters when they reach a queue's head (head,
-- drop_waiter); a queue is granted
-- strictly in arrival order while its head fits (pump, run_queues); a
-- grant is a lease (hold) told to its process on its wake list
-- (announce); a request that cannot be granted now is queued (enqueue).

-- drop_holder forgets a lease of n permits (n is read from the member
-- when not given) and frees its permits. A lease its holder released
-- (released) leaves no trace; any other leaves a tombstone (ENDED).
-- A lease's record is its token under its ticket, but for the holder
-- kept in the state hash (o), whose member is its record.
local function drop_holder(r, m, n, released)
  if r.hgone[m] then return end
  r.hgone[m] = true
  local inline = r.o == m
  if inline then
    r.o, r.oe = false, nil
  else
    write('ZREM', r.H, m)
  end
  local ticket, held = parse_holder(m)
  r.used = r.used - (n or held)
  r.nh = r.nh - 1
  if released then
    -- The holder kept in the state hash has no record, unless this
    -- script made one (granted it).
    if not inline or r.grants[ticket] ~= nil then record(r, ticket, false) end
  else
    record(r, ticket, ENDED)
  end
end

-- read_due returns the members of zset key whose time (score) has come,
-- at most the budget left, and a new bound on its earliest score, given
-- bound (no later than its earliest score; nil unknown) and buf (the
-- earliest score this script adds to it). Nothing is read while the bound
-- shows that nothing is due.
local function read_due(key, bound, buf)
  if nothing_due(bound) then return {}, bound end
  if budget <= 0 then
    more = true
    return {}, bound
  end
  -- The members due (see due): score at most now.
  local got = redis.call('ZRANGEBYSCORE', key, '-inf', due_max(), 'LIMIT', 0, budget)
  seen(key)
  if #got >= budget then
    more = true
    return got, bound
  end
  -- The first member not due bounds the rest.
  local nxt = redis.call('ZRANGE', key, #got, #got, 'WITHSCORES')
  return got, math.min(tonumber(nxt[2]) or math.huge, buf)
end

-- purge_holders drops leases whose expiry has passed, at most the budget
-- left. Time stands still while a script runs, so once per script is
-- enough, unless the budget ran out.
local function purge_holders(r)
  if r.nh <= 0 or r.hpurged or r.off then return end
  r.hpurged = true
  if r.o and due(r.oe) then
    budget = budget - 1
    drop_holder(r, r.o)
  end
  if in_h(r) <= 0 then return end
  local gone
  gone, r.hmin = read_due(r.H, r.hmin, r.hbuf)
  for _, m in ipairs(gone) do
    if not r.hgone[m] then
      budget = budget - 1
      drop_holder(r, m)
    end
  end
end

-- queued reports whether waiter m is in r's queue (and not taken out by
-- this script). A queued ticket has no record in the state hash: its
-- member is what a resent acquire, a refresh and a leave look for.
local function queued(r, m)
  if r.qgone[m] or r.off or r.nq <= 0 then return false end
  local at = redis.call('ZSCORE', r.Q, m)
  seen(r.Q)
  return at ~= false and at ~= nil
end

-- unqueue takes waiter m out of one resource's queue, and reports whether
-- it was there. known says m was read from that queue; otherwise it is
-- looked up first.
local function unqueue(r, m, known)
  if r.qgone[m] or r.off then return false end
  if not known and not queued(r, m) then return false end
  r.qgone[m] = true
  write('ZREM', r.Q, m)
  r.nq = r.nq - 1
  return true
end

-- drop_waiter takes waiter m (read from r's queue; w parsed, or nil to
-- parse it here) out of every queue it is in: r's, and for a
-- multi-request its group's others. A member fairlock did not write is
-- taken out of r's.
local function drop_waiter(r, m, w)
  unqueue(r, m, true)
  if w == nil then w = parse_waiter(m) end
  if not (w and w.parts) then return end
  for _, p in ipairs(w.parts) do
    if p.base ~= r.base then
      unqueue(load(p.base), waiter_member(w.ticket, p.n, w.client, w.lease, w.wait, w.group), false)
    end
  end
end

-- hold records a lease of n permits (ns, formatted) of r for ticket,
-- lasting ttl ms, and returns its token, formatted.
local function hold(r, ticket, n, ns, client, ttl)
  local ts = num(next_seq(r))
  local m, at = holder_member(ticket, ns, client, ts), now + ttl
  if not r.o then
    -- The state hash's place is free: the lease takes it.
    r.o, r.oe = m, at
    r.horizon = math.max(r.horizon, at)
  else
    hold_at(r, at, m)
    -- Holders added to a key that held some are never all removed by
    -- one script (adds go first), so the key keeps its TTL.
    if r.nh0 - (r.o0 and 1 or 0) <= 0 then r.wrote_h = true end
  end
  record(r, ticket, ts)
  r.used = r.used + n
  r.nh = r.nh + 1
  return ts
end

-- renew extends ticket's live lease m on r to now + ttl; a grant
-- announced to it (on a wake list) is confirmed so. Its record (the
-- token) stays until the lease ends, as a grant made at once keeps its
-- own: a late copy of the acquire that queued the ticket must find the
-- grant, not an unknown ticket to queue again.
local function renew(r, m, ttl)
  hold_at(r, now + ttl, m)
end

-- fits reports whether n more permits of r fit now, purging expired leases
-- if that is what it takes.
local function fits(r, n)
  if not r.cap or r.off then return false end
  if not fits_in(r.used, n, r.cap) then purge_holders(r) end
  return fits_in(r.used, n, r.cap)
end

-- head returns the first live waiter of r's queue, its member and
-- parsed form (nil for a member fairlock did not write). Dead waiters
-- found at the head (waiter_alive: their process's liveness) are dropped
-- on the way, within the budget (more is set when it runs out). The queue
-- is read in pages, members with their scores; members this script
-- removed are skipped.
local function head(r)
  if r.nq <= 0 or r.off then return nil end
  while true do
    local page = r.page
    if page then
      while r.pos < #page do
        local m = page[r.pos]
        if not r.qgone[m] then
          local w = parse_waiter(m)
          if not w then return m, nil end
          if waiter_alive(tonumber(page[r.pos + 1]), live_of(r, w.client, false, tonumber(page[r.pos + 1]))) then return m, w end
          if budget <= 0 then
            more = true
            return nil
          end
          budget = budget - 1
          drop_waiter(r, m, w)
          if r.nq <= 0 then return nil end
        end
        r.pos = r.pos + 2
      end
      if #page < 2 * r.want then
        -- The queue ended: the counter had drifted.
        r.nq = 0
        return nil
      end
    end
    -- The first read takes the head alone (the common case); later ones
    -- take a page.
    local size = 1
    if page then size = PAGE end
    r.want = size
    r.page = redis.call('ZRANGE', r.Q, r.qread, r.qread + size - 1, 'WITHSCORES')
    seen(r.Q)
    r.qread = r.qread + #r.page / 2
    r.pos = 1
  end
end

-- grantable_now reports whether n permits of r may be granted at once
-- (may_grant_now), purging expired leases if that is what it takes.
local function grantable_now(r, n)
  if r.off or r.nq > 0 then return false end
  if not fits_in(r.used, n, r.cap) then purge_holders(r) end
  return may_grant_now(r.nq, r.used, n, r.cap)
end

-- ready reports whether multi-request w, at the head of one of its
-- queues, is at the head of all of them and fits in all of them. A
-- request missing from one of its queues (dropped there as dead while its
-- refresh could not reach that queue) can never be granted: ready reports
-- it broken, and it is dropped; its process queues it again.
local function ready(w)
  for _, p in ipairs(w.parts) do
    local r = load(p.base)
    if r.off then return false end
    -- A resource whose state was lost takes the capacity the group
    -- records.
    if not r.cap and r.nq > 0 then r.cap, r.newcap = p.cap, true end
    local want = waiter_member(w.ticket, p.n, w.client, w.lease, w.wait, w.group)
    -- Whether it fits first: a queue's head is read (and the dead
    -- waiters at it dropped) only where the group could take its part,
    -- so that no script reads on past a part that stops the group. Read
    -- first, a multi-lock release sent twice dropped on its second
    -- sending a dead head that its first had left: the resend wrote what
    -- the first had not. A part that does not fit still reports a group
    -- missing from its queue (its keys lost, say: no capacity, so it
    -- never fits), or the group would hold its other queues forever.
    if not (fits(r, p.n) and head(r) == want) then
      if r.qgone[want] or not redis.call('ZSCORE', r.Q, want) then return false, true end
      return false
    end
  end
  return true
end

-- announce grants waiter w (already out of its queues) everything it asked
-- for, for grant_ttl of an announced grant, and tells its process on the
-- wake list of its first resource.
local function announce(w, parts)
  local ttl = grant_ttl(w.lease, w.wait, true)
  local tokens = {}
  for i, p in ipairs(parts) do
    tokens[i] = hold(load(p.base), w.ticket, p.n, p.ns or num(p.n), w.client, ttl)
  end
  local list, fallback = wake_list(parts[1].base, w.client)
  wake(list, fallback, wake_entry(w.ticket, num(now + ttl), tokens), ttl)
end

-- enqueue queues waiter m (ticket's member in r's queue, of process
-- client) behind everyone queued, alive until now + wait unless refreshed.
local function enqueue(r, ticket, m, client, wait)
  local seq = next_seq(r)
  write('ZADD', r.Q, num(seq), m)
  keep_alive(r, client, wait, seq)
  -- A queue that had waiters keeps them through this script (adds go
  -- first), and so its TTL.
  if r.nq0 <= 0 then r.wrote_q = true end
  r.nq = r.nq + 1
end

-- pump grants r's waiting tickets strictly in arrival order while the head
-- fits. A head that does not fit stops the loop even when a later, smaller
-- ticket would fit: letting that one pass is barging, and a stream of small
-- requests could then starve a large one forever. A multi-request at the
-- head is granted only when it heads every one of its queues and fits in
-- all of them at once; it never holds a part while it waits for the rest.
-- Every queue orders all requests by when their scripts ran, so the
-- earliest waiting request heads all its queues, and waits only for leases
-- to end: nothing waits in a cycle. Returns the other resources a grant
-- changed, whose queues may move now.
local function pump(r)
  local touched = {}
  if not r.cap or r.off then return touched end
  while true do
    -- Full: no waiter can be granted, so none is read.
    if r.used >= r.cap then
      purge_holders(r)
      if r.used >= r.cap then break end
    end
    local m, w = head(r)
    if not m then break end
    if budget <= 0 then
      more = true
      break
    end
    if not w then
      drop_waiter(r, m, false) -- not a waiter fairlock wrote
    elseif w.parts then
      local ok, broken = ready(w)
      if broken then
        drop_waiter(r, m, w)
      else
        if not ok then break end
        drop_waiter(r, m, w)
        announce(w, w.parts)
        for _, p in ipairs(w.parts) do
          if p.base ~= r.base then touched[#touched + 1] = load(p.base) end
        end
      end
    else
      if not fits(r, w.n) then break end
      unqueue(r, m, true)
      announce(w, { { base = r.base, n = w.n, ns = w.ns } })
    end
    budget = budget - 1
  end
  return touched
end

-- run_queues pumps the given resources, and every resource a grant on them
-- changed, until no queue can move or the budget is spent.
local function run_queues(rs)
  local todo = {}
  for i, r in ipairs(rs) do todo[i] = r end
  local i = 1
  while i <= #todo do
    for _, r in ipairs(pump(todo[i])) do todo[#todo + 1] = r end
    i = i + 1
  end
end
