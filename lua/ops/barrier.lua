-- barrier.lua: the entry of "barrier_await", "barrier_break" and
-- "barrier_status": a cyclic barrier (package barrier). Its state is a
-- hash {parties, round, n} at <b>/B (b the barrier name's base): the
-- parties it was made with, the current round (1, 2, ... while the hash
-- lives) and how many parties wait in it. Its waiters are condition
-- waiters (cond.lua) of a resource of its own whose base is that key, as
-- a countdown latch's are (latch.lua): they live, are refreshed by their
-- process and are dropped when it dies as every other waiter is; nothing
-- is ever granted there. Every waiter on the condition belongs to the
-- current round: a round ends for all its waiters at once.
--
-- A round is intact while every party that arrived in it still waits
-- (n equals the live waiters). One that left (its caller's context
-- ended: barrier_break) or died (its deadline passed) breaks it: the
-- script that finds it so (barrier_break, the next barrier_await, or a
-- waiter's re-ask after its refresh reported it gone: refresh.lua's
-- broken) takes every waiter off and pushes each a "broken" wake-up, and
-- the next round begins with nobody. The last party's arrival completes
-- the round: every waiter is taken off and pushed a "completed" wake-up.
-- Either way each waiter's outcome is recorded under its ticket (as a
-- signal's reply is, kept as a tombstone), so that a waiter whose
-- wake-up is lost, and a resent call, find it.
--
-- KEYS: the barrier resource's five keys (<b>/B:s ...), its condition's
--       key (<b>/B/c/), the barrier's hash (<b>/B).
-- ARGV: op, parties (the parties the caller's handle was made with), then
--   barrier_await   ttlMs (the hash's TTL), ticket, client, leaseMs,
--                   waiterMs, round ('' on arrival; on a re-ask after a
--                   lost wake-up, the round the ticket arrived in);
--   barrier_break   ttlMs, ticket, round ('' when unknown);
--   barrier_status  nothing more; with parties 0, it reads whatever
--                   parties are stored (0 when the barrier does not
--                   exist).
-- A hash that does not exist is made (round 1) by barrier_await and
-- barrier_break; one stored with other parties fails every op, having
-- written nothing, with the error "FAIRLOCK_BARRIER_PARTIES <stored>".
-- Reply:
--   barrier_await   {0, round, index}: the ticket's round completed (by
--                   this arrival, or, on a resend or a re-ask, found in
--                   its record); index is 0-based, in arrival order;
--                   {1, nowMs, nextEventMs, round, index}: it waits (a
--                   resend finds it waiting and does nothing);
--                   {2, round, index, 2}: the ticket's round broke
--                   (index -1 unknown).
--   barrier_break   {broke, 0}: broke 1 if this call broke the ticket's
--                   round (release.lua's reply form).
--   barrier_status  {round, parties, broken, client...}: the clients of
--                   the round's waiters in arrival order; broken 1 when
--                   the round has lost a party and awaits its break.
-- Reads and checks first, then writes through the buffer (THE RULE).

-- The condition the barrier's waiters wait on.
local BARRIER_COND = ''
-- The error of a call with other parties than the stored ones.
local BARRIER_PARTIES_ERR = 'FAIRLOCK_BARRIER_PARTIES'
-- A round's outcomes, as wake-ups carry them (the token of a grant of
-- nothing) and as records keep them.
local COMPLETED, BROKEN = 1, 2

local ckeys = begin(KEYS)
local B = ckeys[2]
declare_kind(#KEYS, 'hash')
local op, parties = ARGV[1], tonumber(ARGV[2])
-- A status read with parties 0 takes whatever parties are stored (a
-- tool's read: fairlock status).
local any = op == 'barrier_status' and parties == 0
if not parties or (parties < 1 and not any) then return redis.error_reply('ERR barrier: bad parties ' .. tostring(ARGV[2])) end
-- The waiters' state first (another release's layout refused, as on
-- every resource); ticket is the call's own.
local ticket = ARGV[4]
if op == 'barrier_status' then ticket = nil end
local r = declared(ticket)[1]
local st = redis.call('HMGET', B, 'parties', 'round', 'n')
seen(B)
local stored = tonumber(st[1])
if stored and stored ~= parties and not any then return redis.error_reply(BARRIER_PARTIES_ERR .. ' ' .. num(stored)) end
local exists = stored ~= nil
if any then parties = stored or 0 end
local round, n = tonumber(st[2]) or 1, tonumber(st[3]) or 0
local cv = cond_load(r, BARRIER_COND, ckeys[1])

-- intact reports whether every party that arrived in the round still
-- waits (after cond_purge, r.nc counts the live ones).
local function intact()
  return r.nc == n
end

if op == 'barrier_status' then
  local out = { round, parties, 0 }
  if r.nc > 0 then
    -- Live waiters only: a dead one has broken the round.
    local live = 0
    local ms, seqs = cond_waiters(r, cv, nil)
    for i, m in ipairs(ms) do
      local w = parse_waiter(m)
      if w and waiter_alive(seqs[i], live_of(r, w.client, false, seqs[i])) then live = live + 1 end
    end
    if live ~= n then out[3] = 1 end
    for _, m in ipairs(redis.call('ZRANGE', cv.C, 0, -1)) do
      local w = parse_waiter(m)
      if w then out[#out + 1] = w.client end
    end
  elseif n > 0 then
    out[3] = 1
  end
  return out
end

local ttl = tonumber(ARGV[3])
if not ttl or ttl < 1 then return redis.error_reply('ERR barrier: bad ttl ' .. tostring(ARGV[3])) end

-- keep buffers the hash, alive ttl from now.
local function keep()
  write('HSET', B, 'round', num(round))
  write('HSET', B, 'n', num(n))
  if not exists then write('HSET', B, 'parties', num(parties)) end
  expire_at(B, now + ttl)
end

-- end_round takes every waiter of the round off the condition, records
-- its outcome under its ticket and pushes it to its process (a grant of
-- nothing whose token is the outcome, in wake_entry's form, so that the
-- listener hands it to its waiter as it hands a grant), then begins the
-- next round with nobody. It returns the index of waiter mine (or -1).
local function end_round(outcome, mine)
  local at = -1
  if r.nc > 0 then
    local got = redis.call('ZRANGE', cv.C, 0, -1)
    seen(cv.C)
    for i, m in ipairs(got) do
      if not cv.gone[m] then
        budget = budget - 1
        local w = parse_waiter(m)
        cond_drop(r, cv, m)
        if w then
          record(r, w.ticket, signalled(round, i - 1, outcome, 0))
          if w.ticket == mine then
            at = i - 1
          else
            local list, fallback = wake_list(r.base, w.client)
            wake(list, fallback, wake_entry(w.ticket, now, { num(outcome) }), w.wait)
          end
        end
      end
    end
  end
  round, n = round + 1, 0
  return at
end

-- A record of the ticket's round's end: a resend, or a re-ask after a
-- lost wake-up.
if is_signalled(r.grant) then
  local rd, idx, outcome = parse_signalled(r.grant)
  if op == 'barrier_break' then return { 0, 0 } end
  -- As the first run answered, when it completed the round.
  if outcome == COMPLETED then return { 0, rd, idx } end
  return { 2, rd, idx, outcome }
end

cond_purge(r, cv, nil)
local asked = tonumber(ARGV[#ARGV])
local waiting = r.grant == CONDITION .. BARRIER_COND

if op == 'barrier_break' then
  -- The ticket's round breaks if it waits there, or if it was dropped
  -- from it and the round has not ended since (it is not intact).
  if waiting or (asked == round and not intact()) then
    end_round(BROKEN, ticket)
    record(r, ticket, signalled(round - 1, 0, BROKEN, 0))
    keep()
    finish()
    return { 1, 0 }
  end
  return { 0, 0 }
end
if op ~= 'barrier_await' then return redis.error_reply('ERR barrier: unknown op ' .. tostring(op)) end
local client, lease, wait = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local m = waiter_member(ticket, 1, client, lease, wait, '')

if waiting and asked == nil and intact() then
  -- A resend: the first run made the ticket wait.
  local idx = redis.call('ZRANK', cv.C, m)
  return { 1, now, -1, round, idx or -1 }
end
if waiting or asked ~= nil then
  -- A re-ask (its refresh reported it gone), or a resend into a round
  -- that lost a party: the round cannot complete. Unless it ended
  -- already (then the ticket's record answered above, or it was
  -- forgotten: the round is over, and how is not known, so it is
  -- reported broken, never completed), it breaks now.
  local rd, idx = asked or round, -1
  if rd == round then
    idx = end_round(BROKEN, ticket)
    record(r, ticket, signalled(rd, math.max(idx, 0), BROKEN, 0))
    keep()
    finish()
  end
  return { 2, rd, idx, BROKEN }
end

-- A new arrival. A round that lost a party breaks first; the arrival
-- begins the next.
if not intact() then end_round(BROKEN, nil) end
local idx = n
if n + 1 >= parties then
  -- The last party: the round completes for every one of them.
  end_round(COMPLETED, nil)
  record(r, ticket, signalled(round - 1, idx, COMPLETED, 0))
  keep()
  finish()
  return { 0, round - 1, idx }
end
cond_add(r, cv, ticket, 1, client, lease, wait)
n = n + 1
keep()
finish()
return { 1, now, next_event(), round, idx }
