-- refresh.lua: the entry of "refresh": keeps one process's waiters
-- alive and reports those that no longer wait.
--
-- KEYS: one resource's five keys.
-- ARGV: op ("refresh"), client, leaseMs, waiterMs, then ticket, permits,
--       group for each of (some of) the process's waiters whose first
--       resource it is.
-- Reply: {nextEventMs, {ticket, "expiryMs token..." or "0", ...}, nowMs}:
--   tokens mean granted (in case the wake-up was lost), "0" means gone
--   (dropped, or dead: a waiter whose deadline came before this refresh
--   is not brought back). A ticket waiting on a condition variable (its
--   CONDITION mark in S) is kept alive there, unless it waits on a
--   countdown latch that is open (see open below), or on a cyclic
--   barrier whose round has lost a party (see broken below): then it is
--   gone.

begin(KEYS)
local first = declared()[1]
local client, lease, wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
-- Expired leases go, whether or not their permits are needed now.
purge_holders(first)
local out = {}
local waiting = {} -- the tickets refreshed in a queue
-- What the first resource's state says of each ticket: waiting on a
-- condition, a token (granted), or nothing (queued, if its member is in
-- the queue; else gone).
local tickets = {}
for i = 5, #ARGV, 3 do tickets[#tickets + 1] = ARGV[i] end
local said = {}
if #tickets > 0 then said = redis.call('HMGET', first.S, unpack(tickets)) end
-- open reports whether first is a countdown latch's waiters (its base is
-- the latch's count: lua/ops/latch.lua) and the latch is open. Its
-- waiters are then gone, as if woken: the count down that opened it may
-- have left some for a later script that never ran (its caller ended),
-- and each asks again and finds the latch open.
local is_open = nil
local function open()
  if is_open == nil then
    is_open = false
    if string.sub(first.base, -2) == KEY_SEP .. 'L' then
      reach(first.base, 'hash')
      is_open = redis.call('HGET', first.base, 'count') == '0'
    end
  end
  return is_open
end
-- broken reports whether first is a cyclic barrier's waiters (its base
-- is the barrier's hash: lua/ops/barrier.lua) and its round has lost a
-- party: fewer of them live than arrived in the round (one died, or
-- left). Its waiters are then gone: each asks again with its ticket, and
-- the first to ask breaks the round for all (pushing each its wake-up).
local is_broken = nil
local function broken()
  if is_broken == nil then
    is_broken = false
    if string.sub(first.base, -2) == KEY_SEP .. 'B' then
      reach(first.base, 'hash')
      local n = tonumber(redis.call('HGET', first.base, 'n')) or 0
      is_broken = redis.call('ZCOUNT', first.D, live_min(), '+inf') ~= n
      seen(first.D)
    end
  end
  return is_broken
end
-- The tickets with no record (the holder kept in the state hash has no
-- field: its member says) are queued if their members are in the first
-- resource's queue: one look-up of them all, in calls of at most CHUNK.
local states, inq, look, at_k = {}, {}, {}, {}
for i = 5, #ARGV, 3 do
  local k, ticket, n, group = (i - 5) / 3 + 1, ARGV[i], ARGV[i + 1], ARGV[i + 2]
  states[k] = said[k] or inline_token(first.o, ticket)
  if not states[k] and first.nq > 0 then
    if group ~= '' then n = parse_group(group)[1].n end
    look[#look + 1] = waiter_member(ticket, n, client, lease, wait, group)
    at_k[#at_k + 1] = k
  end
end
for j = 1, #look, CHUNK do
  local got = redis.call('ZMSCORE', first.Q, unpack(look, j, math.min(j + CHUNK - 1, #look)))
  seen(first.Q)
  for x = 1, #got do inq[at_k[j + x - 1]] = got[x] ~= false and got[x] ~= nil end
end
for i = 5, #ARGV, 3 do
  local k, ticket, n, group = (i - 5) / 3 + 1, ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local parts = { { base = first.base, n = n } }
  if group ~= '' then parts = parse_group(group) end
  local state = states[k]
  local cv = nil
  if type(state) == 'string' and string.sub(state, 1, 1) == CONDITION then
    cv = cond_load(first, string.sub(state, 2))
  end
  -- Its member in the first resource's queue, if it is queued (inq).
  local m1 = waiter_member(ticket, parts[1].n, client, lease, wait, group)
  if cv then
    -- Waiting on a condition variable: alive there while its member is
    -- and its deadline has not come.
    local m = waiter_member(ticket, n, client, lease, wait, '')
    local at = nil
    if not cv.off then
      -- Its deadline (in :d while it waits on cv: the mark says it does).
      at = tonumber(redis.call('ZSCORE', first.D, m))
      seen(first.D)
    end
    if cv.off then
      -- Unreachable now: its deadline stays; the next refresh tries.
    elseif alive(at) and (open() or broken()) then
      cond_drop(first, cv, m)
      out[#out + 1] = ticket
      out[#out + 1] = '0'
    elseif alive(at) then
      wait_at(first, now + wait, m)
      refresh_live(first, client, wait)
      -- purge_waiters reads the deadlines as they were.
      first.fresh = first.fresh or {}
      first.fresh[m] = true
      -- The condition's key lives as long as its waiters' deadlines.
      cv.wrote = true
    else
      cond_forget(first, cv, m, ticket, at) -- dead: its deadline came first
      out[#out + 1] = ticket
      out[#out + 1] = '0'
    end
  elseif inq[k] and due_waiter(first, m1) then
    -- Dead: its deadline came before this refresh. It is not brought
    -- back; purge_waiters below drops it.
    out[#out + 1] = ticket
    out[#out + 1] = '0'
  elseif inq[k] then
    waiting[#waiting + 1] = { ticket = ticket, parts = parts }
    for _, p in ipairs(parts) do
      local r = load(p.base)
      if not r.off then
        local m = waiter_member(ticket, p.n, client, lease, wait, group)
        wait_at(r, now + wait, m)
        refresh_live(r, client, wait)
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
          token = redis.call('HGET', r.S, ticket) or inline_token(r.o, ticket)
        end
      end
      local at = nil
      if is_token(token) then
        at = holder_at(r, holder_member(ticket, num(p.n), client, token))
      end
      if not alive(at) then
        tokens = nil
        break
      end
      tokens[j] = token
      if exp == nil or at < exp then exp = at end
    end
    out[#out + 1] = ticket
    out[#out + 1] = tokens and (num(exp) .. ' ' .. table.concat(tokens, ' ')) or '0'
  end
end
-- Waiters whose process stopped refreshing go (this script's own are
-- fresh), whether or not the queue can move now.
purge_waiters(first)
run_queues(loaded)
-- Waiters this refresh's own run granted learn it in its reply, as a
-- refresh sent again would tell them (announced: a grant's TTL).
for _, w in ipairs(waiting) do
  local tokens = {}
  for j, p in ipairs(w.parts) do
    local token = load(p.base).grants[w.ticket]
    if not is_token(token) then
      tokens = nil
      break
    end
    tokens[j] = token
  end
  if tokens then
    out[#out + 1] = w.ticket
    out[#out + 1] = num(now + grant_ttl(tonumber(lease), wait, true)) .. ' ' .. table.concat(tokens, ' ')
  end
end
finish()
return { next_event(), out, now }
