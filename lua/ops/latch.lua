-- latch.lua: the entry of "latch_wait", "latch_down" and "latch_count":
-- a countdown latch (package latch). Its count is a hash {count, init}
-- at <b>/L (b the latch name's base); its waiters are condition waiters
-- (cond.lua) of a resource of its own whose base is that key, so that
-- they live, are refreshed by their process and are dropped when it dies
-- as every other waiter is, and no semaphore's key is ever a latch's.
-- Nothing is ever granted on that resource: it has no capacity.
--
-- KEYS: the latch resource's five keys (<b>/L:s ...), its condition's key
--       (<b>/L/c/), the count (<b>/L).
-- ARGV: op, init (the count the caller's handle was made with), then
--   latch_wait   ttlMs (the count's TTL), ticket, client, leaseMs,
--                waiterMs;
--   latch_down   ttlMs, id (unique to the call: a resent call carries
--                the same);
--   latch_count  nothing more; with init 0, it reads whatever count is
--                stored.
-- A count that does not exist is created at init by latch_wait and
-- latch_down (latch_count reads it as init); one stored with another init
-- fails every op, having written nothing, with the error
-- "FAIRLOCK_LATCH_COUNT <storedInit>".
-- Reply:
--   latch_wait   {0} when the count is 0 (the latch is open), else
--                {1, nowMs, nextEventMs}: ticket waits on the latch's
--                condition until the count reaches 0 (a resend finds it
--                waiting and does nothing).
--   latch_down   {count, more}: the count after this call, never below
--                0 (a call on an open latch leaves it 0). The call that
--                takes it to 0 takes every waiter off the condition and
--                pushes a wake-up to its process (LATCH_OPEN); more is 1
--                when waiters are left (call again with a new id). The
--                reply is recorded under id as a signal's is
--                (lua/rules.lua's signalled, kept as a tombstone): a
--                resent call answers it and acts no more.
--   latch_count  {count}; with init 0, {count, init, waiters}: the
--                stored count and init (0 and 0 when the latch does not
--                exist) and the waiters registered (the dead among them
--                until they are dropped).
-- Reads and checks first, then writes through the buffer (THE RULE).

-- The condition the latch's waiters wait on.
local LATCH_COND = ''
-- The error of a call with another count than the stored one.
local LATCH_COUNT_ERR = 'FAIRLOCK_LATCH_COUNT'

-- latch_open_entry is the wake-up of a latch's waiter: a grant of nothing
-- (expiry now, token 1), in wake_entry's form, so that the listener hands
-- it to its waiter as it hands a grant. A waiter whose wake-up is lost
-- learns it from its refresh (it is gone), and asks again: the count is 0.
local function latch_open_entry(ticket)
  return wake_entry(ticket, now, { '1' })
end

local ckeys = begin(KEYS)
local L = ckeys[2]
declare_kind(#KEYS, 'hash')
local op, init = ARGV[1], tonumber(ARGV[2])
-- A count read with init 0 takes whatever count is stored (a tool's
-- read: fairlock status).
local any = op == 'latch_count' and init == 0
if not init or (init < 1 and not any) then return redis.error_reply('ERR latch: bad count ' .. tostring(ARGV[2])) end
-- The waiters' state, read (and its layout checked: another release's is
-- refused, as on every resource) before anything else; ticket is the
-- call's own (a waiter's, or a count down's id).
local r = declared(ARGV[4])[1]
local st = redis.call('HMGET', L, 'count', 'init')
seen(L)
local stored, count = tonumber(st[2]), tonumber(st[1])
if stored and stored ~= init and not any then return redis.error_reply(LATCH_COUNT_ERR .. ' ' .. num(stored)) end
local exists = stored ~= nil and count ~= nil
if not exists then count = init end

if op == 'latch_count' then
  if any then return { exists and count or 0, exists and stored or 0, r.nc } end
  return { count }
end

local ttl = tonumber(ARGV[3])
if not ttl or ttl < 1 then return redis.error_reply('ERR latch: bad ttl ' .. tostring(ARGV[3])) end

-- keep_count buffers the count (and init, when created here), alive ttl
-- from now.
local function keep_count(n)
  write('HSET', L, 'count', num(n))
  if not exists then write('HSET', L, 'init', num(init)) end
  expire_at(L, now + ttl)
end

if op == 'latch_wait' then
  local ticket, client, lease, wait = ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
  -- A resend: the first run made the ticket wait.
  if r.grant == CONDITION .. LATCH_COND then return { 1, now, -1 } end
  -- A copy that reaches Redis after its waiter withdrew (the withdrawal
  -- left the ticket's tombstone): it does nothing, and answers as a
  -- resend does (nobody reads it).
  if r.grant == ENDED then return { 1, now, -1 } end
  if count <= 0 then return { 0 } end
  local cv = cond_load(r, LATCH_COND, ckeys[1])
  cond_add(r, cv, ticket, 1, client, lease, wait)
  keep_count(count)
  finish()
  return { 1, now, next_event() }
end

if op ~= 'latch_down' then return redis.error_reply('ERR latch: unknown op ' .. tostring(op)) end
local id = ARGV[4]
if is_signalled(r.grant) then
  local c, m = parse_signalled(r.grant)
  return { c, m }
end
-- Never below 0: a latch that is open stays open.
if count > 0 then count = count - 1 end
if count == 0 and r.nc > 0 then
  -- Open: every live waiter leaves the condition and hears it on its
  -- process's wake list; dead ones (waiter_alive) are dropped, never
  -- woken.
  local cv = cond_load(r, LATCH_COND, ckeys[1])
  if budget > 0 and r.nc > 0 then
    local ms, seqs = cond_waiters(r, cv, budget)
    for i, m in ipairs(ms) do
      if budget <= 0 then break end
      budget = budget - 1
      local w = parse_waiter(m)
      cond_drop(r, cv, m)
      if w and waiter_alive(seqs[i], live_of(r, w.client, false, seqs[i])) then
        local list, fallback = wake_list(r.base, w.client)
        wake(list, fallback, latch_open_entry(w.ticket), w.wait)
      end
    end
    -- With budget left, the condition's key had no more members; marks
    -- still counted lost theirs with an earlier life of the key (it
    -- expired with only dead waiters in it and was made again): they go
    -- by their marks (purge_waiters), or the latch would report waiters
    -- left to wake at every call.
    if budget > 0 and r.nc > 0 then purge_waiters(r) end
  end
end
local left = 0
if count == 0 and r.nc > 0 then left = 1 end
keep_count(count)
record(r, id, signalled(count, left, 0, 0))
finish()
return { count, left }
