-- refresh.lua: the entry of "refresh": keeps one process's waiters
-- alive and reports those that no longer wait.
--
-- KEYS: one resource's five keys.
-- ARGV: op ("refresh"), client, leaseMs, waiterMs, then ticket, permits,
--       group for each of (some of) the process's waiters whose first
--       resource it is.
-- Reply: {nextEventMs, {ticket, "expiryMs token..." or "0", ...}, nowMs}:
--   tokens mean granted (in case the wake-up was lost), "0" means gone
--   (dropped, or dead: waiters whose process's liveness deadline came
--   before this refresh are not brought back, and it drops them). A ticket waiting on a condition variable (its
--   CONDITION mark in S) is kept alive there, unless it waits on a
--   countdown latch that is open (see open below), or on a cyclic
--   barrier whose round has lost a party (see broken below): then it is
--   gone.

begin(KEYS)
local client, lease, wait = ARGV[2], ARGV[3], tonumber(ARGV[4])
local first = declared(nil, client)[1]
-- The process's liveness field on the first resource as read: its
-- waiters there that it does not keep alive are dead (waiter_alive).
local lat, lborn = live_of(first, client, true)
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
-- The round's waiters are those of its one condition, cv (at most its
-- parties), read before this refresh moves any liveness.
local is_broken = nil
local function broken(cv)
  if is_broken == nil then
    is_broken = false
    if string.sub(first.base, -2) == KEY_SEP .. 'B' then
      reach(first.base, 'hash')
      local n = tonumber(redis.call('HGET', first.base, 'n')) or 0
      local ms, seqs = cond_waiters(first, cv, nil)
      local live = 0
      for j, m in ipairs(ms) do
        local w = parse_waiter(m)
        if w then
          if waiter_alive(seqs[j], live_of(first, w.client, true)) then live = live + 1 end
        end
      end
      is_broken = live ~= n
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
  for x = 1, #got do inq[at_k[j + x - 1]] = tonumber(got[x]) end
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
    -- (its mark says it counts) and its process lives.
    local m = waiter_member(ticket, n, client, lease, wait, '')
    local seq = nil
    if not cv.off then
      seq = tonumber(redis.call('ZSCORE', cv.C, m))
      seen(cv.C)
    end
    if cv.off then
      -- Unreachable now: the next refresh tries.
    elseif waiter_alive(seq, lat, lborn) and (open() or broken(cv)) then
      cond_drop(first, cv, m)
      out[#out + 1] = ticket
      out[#out + 1] = '0'
    elseif waiter_alive(seq, lat, lborn) then
      keep_alive(first, client, wait)
      -- The condition's key lives as long as its waiters' deadlines.
      cv.wrote = true
    else
      -- Dead (its process's deadline came first), or gone from cv with
      -- its key (which outlives its waiters' deadlines, not the keys'
      -- later moves): its mark still counts it, and goes.
      cond_drop(first, cv, m)
      out[#out + 1] = ticket
      out[#out + 1] = '0'
    end
  elseif inq[k] and not waiter_alive(inq[k], lat, lborn) then
    -- Dead: its process's deadline came before this refresh. It is not
    -- brought back: it goes from every queue it is in.
    if budget > 0 then
      budget = budget - 1
      drop_waiter(first, m1, parse_waiter(m1))
    else
      more = true
    end
    out[#out + 1] = ticket
    out[#out + 1] = '0'
  elseif inq[k] then
    waiting[#waiting + 1] = { ticket = ticket, parts = parts }
    for _, p in ipairs(parts) do
      keep_alive(load(p.base), client, wait)
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
-- The queues move past their dead heads, as far as they can move.
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
