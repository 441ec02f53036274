-- acquire.lua: the waiter's side. Runs after queue.lua, whose rule it
-- obeys: every check and error reply comes before finish().
--
-- ARGV[1] op:
--   "acquire" | "try"  KEYS: the keys of each resource asked for, in name
--                      order. ARGV: op, ticket, client, leaseMs, waiterMs,
--                      group ("" for one resource), then permits, capacity
--                      for each resource.
--     returns {1, nowMs, expiryMs, token...}  granted at once, a token per
--                                 resource (tokens are decimal strings)
--             {0}                 "try" only: not granted, nothing queued
--             {2, nowMs, nextEventMs}  queued; the grant arrives on the
--                                 wake list
--             {3, nowMs, expiryMs, token...}  granted already (this call
--                                 is a resend of one whose reply was lost,
--                                 or the queue moved while it ran):
--                                 confirm it; expiryMs 0: it has expired
--             {4}                 this request ended before this call ran
--                                 (a resend after its grant ended): ask
--                                 again under a new ticket
--     The call is idempotent: go-redis resends a command whose reply it did
--     not get, and the resent call finds what the first one did.
--     error   "FAIRLOCK_CAPACITY <stored> <index>" when a capacity differs
--             from the one stored with a resource in use (by live leases or
--             live waiters: expired ones are looked past)
--   "refresh"          KEYS: one resource's. ARGV: op, client, leaseMs,
--                      waiterMs, then ticket, permits, group for each of
--                      (some of) one process's waiters whose first
--                      resource it is: keeps them alive and reports those
--                      that no longer wait:
--     {nextEventMs, {ticket, "expiryMs token..." or "0", ...}, nowMs};
--     tokens mean granted (in case the wake-up was lost), "0" means
--     dropped. A ticket waiting on a condition variable (its "c" marker
--     in S) is kept alive there.
--   "renew_batch"      KEYS: one resource's. ARGV: op, client, then
--                      ticket, permits, token, announced ("1" or "0"),
--                      leaseMs for each of one process's leases on it:
--                      renews each as release.lua's "renew" does.
--     {{1 renewed or 0 gone, ...}, more}
--   "signal"           KEYS: one resource's, then the condition's :c and
--                      :e keys. ARGV: op, condition name, "1" (signal) or
--                      "all" (broadcast), bound ("" on a first call).
--                      Drops the condition's dead waiters, then wakes its
--                      longest waiter (or all of those whose sequence is
--                      at most bound): each moves to the resource's queue,
--                      behind those already queued, in order, or is granted
--                      at once if nobody is queued and it fits. Returns
--                      {woken, condMore, more, bound}: condMore 1 when a
--                      broadcast has waiters left to wake (call again with
--                      bound), or a signal found only dead waiters within
--                      its budget (call again); more as for "pump".
--   "pump"             KEYS: one resource's. ARGV: op. Goes on with work an
--                      earlier script left (grants, purges): {more,
--                      nextEventMs}, more 1 when work is left still.
--   "status"           KEYS: one resource's. ARGV: op; changes nothing.
--     Returns {nowMs, capacity, {holder, expiryMs, ...}, {waiter,
--     sequence, ...}, holders, waiters} for live entries, at most
--     STATUS_MAX of each, and the counts (which include entries that have
--     expired but were not yet dropped).

-- An acquire or try for one semaphore takes the fast path (queue.lua)
-- when it can; fast_acquire returns nil, having written nothing, when the
-- general path below must decide.
local op = ARGV[1]
if FAST_PATHS and (op == 'acquire' or op == 'try') and #KEYS == 5 and ARGV[6] == '' then
  local out = fast_acquire(KEYS, ARGV)
  if out then return out end
end
-- A call about a condition variable declares its two keys after the
-- resource's five: begin returns them.
local ckeys = begin(KEYS)

local STATUS_MAX = 1000

if op == 'status' then
  local r = declared()[1]
  local holders, waiters = {}, {}
  local h = redis.call('ZRANGEBYSCORE', r.H, '(' .. num(now), '+inf', 'WITHSCORES', 'LIMIT', 0, STATUS_MAX)
  for i = 1, #h, 2 do
    holders[#holders + 1] = h[i]
    holders[#holders + 1] = h[i + 1]
  end
  local q = redis.call('ZRANGE', r.Q, 0, STATUS_MAX - 1, 'WITHSCORES')
  for i = 1, #q, 2 do
    local at = redis.call('ZSCORE', r.D, q[i])
    if at and tonumber(at) > now then
      waiters[#waiters + 1] = q[i]
      waiters[#waiters + 1] = q[i + 1]
    end
  end
  return { now, r.cap or 0, holders, waiters, r.nh, r.nq }
end

if op == 'pump' then
  run_queues(declared())
  finish()
  return { more_flag(), next_event() }
end

if op == 'renew_batch' then
  -- Renews leases of one process on one resource, each as release.lua's
  -- "renew" does one: a live lease is extended to now + its leaseMs (and
  -- its grant record, if it was announced, forgotten: confirmed); one that
  -- has expired is dropped, never brought back.
  local r = declared()[1]
  local client = ARGV[2]
  local members = {}
  for i = 3, #ARGV, 5 do
    members[#members + 1] = holder_member(ARGV[i], ARGV[i + 1], client, ARGV[i + 2])
  end
  local at = {}
  if #members > 0 and not r.off then at = redis.call('ZMSCORE', r.H, unpack(members)) end
  local out, dropped = {}, false
  for j, m in ipairs(members) do
    local i = 3 + (j - 1) * 5
    local a = tonumber(at[j])
    out[j] = 0
    if a and a > now then
      hold_at(r, now + tonumber(ARGV[i + 4]), m)
      if ARGV[i + 3] == '1' then record(r, ARGV[i], false) end
      out[j] = 1
    elseif a then
      drop_holder(r, m, tonumber(ARGV[i + 1]), 'x')
      dropped = true
    end
  end
  if dropped then run_queues({ r }) end
  finish()
  return { out, more_flag() }
end

if op == 'signal' then
  local r = declared()[1]
  local cv = cond_load(r, ARGV[2], ckeys[1], ckeys[2])
  local all, bound = ARGV[3] == 'all', tonumber(ARGV[4])
  -- A broadcast wakes the waiters there were when it began: those whose
  -- sequence is at most the last one handed out then.
  if not bound then bound = r.seq end
  if not all then bound = math.huge end
  local cmore = cond_purge(r, cv)
  -- Those already queued go first.
  run_queues({ r })
  local woken = 0
  if not cmore then
    local want = 1
    if all then want = budget end
    if want > 0 then
      -- Waiters dropped above are still in the key, at its head.
      local skip = 0
      for _ in pairs(cv.gone) do skip = skip + 1 end
      local max = '+inf'
      if bound < math.huge then max = num(bound) end
      local got = redis.call('ZRANGEBYSCORE', cv.C, '-inf', max, 'LIMIT', 0, want + skip)
      for _, m in ipairs(got) do
        if woken >= want then break end
        if budget <= 0 then
          cmore = true
          break
        end
        if not cv.gone[m] then
          local w = parse_waiter(m)
          budget = budget - 1
          if w then
            cond_wake(r, cv, m, w)
            woken = woken + 1
          else
            cond_drop(r, cv, m) -- not a waiter fairlock wrote
          end
        end
      end
      if all and #got >= want + skip then cmore = true end
    else
      cmore = true
    end
  end
  local cm = 0
  if cmore then cm = 1 end
  if bound == math.huge then bound = 0 end
  finish()
  return { woken, cm, more_flag(), num(bound) }
end

if op == 'refresh' then
  local first = declared()[1]
  local client, lease, wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
  -- Expired leases go, whether or not their permits are needed now.
  purge_holders(first)
  local out = {}
  -- What the first resource's state says of each ticket: "q" queued, a
  -- token granted, else gone.
  local tickets = {}
  for i = 5, #ARGV, 3 do tickets[#tickets + 1] = ARGV[i] end
  local said = {}
  if #tickets > 0 then said = redis.call('HMGET', first.S, unpack(tickets)) end
  for i = 5, #ARGV, 3 do
    local ticket, n, group = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local parts = { { base = first.base, n = n } }
    if group ~= '' then parts = parse_group(group) end
    local state = said[(i - 5) / 3 + 1]
    local cv = nil
    if type(state) == 'string' and string.sub(state, 1, 1) == 'c' then
      cv = cond_load(first, string.sub(state, 2))
    end
    if cv then
      -- Waiting on a condition variable: alive there while its member is.
      local m = waiter_member(ticket, n, client, lease, wait, '')
      if cv.off then
        -- Unreachable now: its deadline stays; the next refresh tries.
      elseif redis.call('ZSCORE', cv.E, m) then
        write('ZADD', cv.E, num(now + wait), m)
        first.horizon = math.max(first.horizon, now + wait)
        cv.wrote = true
      else
        record(first, ticket, false)
        out[#out + 1] = ticket
        out[#out + 1] = '0'
      end
    elseif state == 'q' then
      for _, p in ipairs(parts) do
        local r = load(p.base)
        if not r.off then
          local m = waiter_member(ticket, p.n, client, lease, wait, group)
          wait_at(r, now + wait, m)
          -- purge_waiters reads the deadlines as they were.
          r.fresh = r.fresh or {}
          r.fresh[m] = true
        end
      end
    else
      -- Granted, if every part holds a live lease under the token its
      -- announcement recorded.
      local tokens, exp = {}, nil
      for j, p in ipairs(parts) do
        local r = load(p.base)
        local token = r.grants[ticket]
        if token == nil then
          if j == 1 then
            token = state
          elseif not r.off then
            token = redis.call('HGET', r.S, ticket)
          end
        end
        local at = nil
        if token and token ~= 'r' and token ~= 'x' and token ~= 'q' then
          at = redis.call('ZSCORE', r.H, holder_member(ticket, num(p.n), client, token))
        end
        if not (at and tonumber(at) > now) then
          tokens = nil
          break
        end
        tokens[j] = token
        if exp == nil or tonumber(at) < exp then exp = tonumber(at) end
      end
      out[#out + 1] = ticket
      out[#out + 1] = tokens and (num(exp) .. ' ' .. table.concat(tokens, ' ')) or '0'
    end
  end
  -- Waiters whose process stopped refreshing go (this script's own are
  -- fresh), whether or not the queue can move now.
  purge_waiters(first)
  run_queues(loaded)
  finish()
  return { next_event(), out, now }
end

local ticket, client = ARGV[2], ARGV[3]
local lease, wait, group = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local rs = declared(ticket)

-- granted returns the reply for a ticket granted on every resource: its
-- tokens and the earliest expiry of its parts (0 if any has expired).
local function granted(code)
  local out, exp = { code, now, 0 }, nil
  for i, r in ipairs(rs) do
    local ts, at = r.grants[ticket], nil
    if ts then
      -- Granted by this script: the lease is in the buffer.
      at = now + math.min(lease, wait)
    else
      ts = r.grant
      at = ts and tonumber(redis.call('ZSCORE', r.H, holder_member(ticket, ARGV[5 + 2 * i], client, ts)))
    end
    if not at or at <= now then
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
-- released or confirmed), a tombstone (the grant has ended), or its place
-- in the queue.
local g = rs[1].grant
if g == 'r' or g == 'x' then return { 4 } end
if g and g ~= 'q' then return granted(3) end

local want = {}
for i, r in ipairs(rs) do
  local n, capacity = tonumber(ARGV[5 + 2 * i]), tonumber(ARGV[6 + 2 * i])
  want[i] = n
  if r.cap and r.cap ~= capacity and (r.nh > 0 or r.nq > 0) then
    -- The users of the stored capacity may all be gone: leases expired,
    -- waiters dead. Look before refusing.
    purge_holders(r)
    purge_waiters(r)
  end
  if not r.cap or (r.nh <= 0 and r.nq <= 0) then
    -- Idle (whatever capacity was stored belonged to users who are all
    -- gone), or the state hash was lost and rebuilt: take the caller's.
    if r.cap ~= capacity then r.newcap = true end
    r.cap = capacity
  elseif r.cap ~= capacity then
    -- Nothing has been written: the buffer is dropped.
    return redis.error_reply('FAIRLOCK_CAPACITY ' .. num(r.cap) .. ' ' .. i)
  end
end

local members = {}
for i in ipairs(rs) do
  members[i] = waiter_member(ticket, want[i], client, lease, wait, group)
end
if g == 'q' then
  -- A resend of a call that queued the ticket: keep it where it is.
  for i, r in ipairs(rs) do
    wait_at(r, now + wait, members[i])
    r.fresh = r.fresh or {}
    r.fresh[members[i]] = true
  end
  run_queues(rs)
  if rs[1].grants[ticket] then
    local out = granted(3)
    finish()
    return out
  end
  finish()
  return { 2, now, next_event() }
end

-- Expired leases and dead waiters may have made room for the queues.
local stuck = {}
for i, r in ipairs(rs) do
  if r.nq > 0 or r.used + want[i] > r.cap then stuck[#stuck + 1] = r end
end
if #stuck > 0 then
  run_queues(stuck)
  for i, r in ipairs(rs) do
    if r.nq <= 0 then fits(r, want[i]) end
  end
end

local free = true
for i, r in ipairs(rs) do
  if r.nq > 0 or r.used + want[i] > r.cap then
    free = false
    break
  end
end
if free then
  local out = { 1, now, now + lease }
  for i, r in ipairs(rs) do
    out[i + 3] = hold(r, ticket, want[i], num(want[i]), client, lease)
  end
  finish()
  return out
end
if op == 'try' then
  finish()
  return { 0 }
end

for i, r in ipairs(rs) do
  local m = members[i]
  write('ZADD', r.Q, num(next_seq(r)), m)
  wait_at(r, now + wait, m)
  record(r, ticket, 'q')
  -- A queue that had waiters keeps them through this script (adds go
  -- first), and so its TTL.
  if r.nq0 <= 0 then r.wrote_q = true end
  r.nq = r.nq + 1
end
finish()
return { 2, now, next_event() }
