-- signal.lua: the entry of "signal": wakes waiters of a condition
-- variable (cond.lua).
--
-- KEYS: one resource's five keys, then the condition's :c key.
-- ARGV: op ("signal"), condition name, "1" (signal) or "all" (broadcast),
--       bound ("" on a first call), id (unique to this call: a resent call
--       carries the same).
-- Runs the resource's queue, then wakes the condition's longest live
-- waiter (or all of those whose sequence is at most bound), dropping the
-- dead ones it meets on the way (waiter_alive): each moves to the
-- resource's queue, behind those already queued, in order, or is granted
-- at once if nobody is queued and it fits.
-- Reply: {woken, condMore, more, bound}: condMore 1 when a broadcast has
-- waiters left to wake (call again with bound and a new id), or a signal
-- found more dead waiters than its budget (call again); more as for
-- "pump".
-- The call is idempotent: it records its reply in S under its id (kept as
-- long as a tombstone), and a resent call (go-redis resends a command
-- whose reply it did not get) answers that reply and wakes nobody more.

local ckeys = begin(KEYS)
local id = ARGV[5]
if id == '' then id = nil end
local r = declared(id)[1]
if is_signalled(r.grant) then
  local w, cm, m, b = parse_signalled(r.grant)
  return { w, cm, m, b }
end
local cv = cond_load(r, ARGV[2], ckeys[1])
local all, bound = ARGV[3] == 'all', tonumber(ARGV[4])
-- A broadcast wakes the waiters there were when it began: those whose
-- sequence is at most the last one handed out then.
if not bound then bound = r.seq end
if not all then bound = math.huge end
-- Those already queued go first.
run_queues({ r })
local cmore = false
local woken = 0
local want = 1
if all then want = budget end
if want <= 0 then cmore = true end
-- Read in order, a page of those still wanted at a time: the dead ones
-- met (dropped, never woken) take no waking's place.
while not cmore and woken < want do
  local ms, seqs, ended = cond_waiters(r, cv, want - woken, bound)
  if #ms == 0 then break end
  for i, m in ipairs(ms) do
    if woken >= want then break end
    if budget <= 0 then
      cmore = true
      break
    end
    local w = parse_waiter(m)
    budget = budget - 1
    if w and waiter_alive(seqs[i], live_of(r, w.client, false, seqs[i])) then
      cond_wake(r, cv, m, w)
      woken = woken + 1
    else
      cond_drop(r, cv, m) -- dead, or not a waiter fairlock wrote
    end
  end
  if ended then break end
end
-- A broadcast that woke as many as its budget allowed may have more.
if all and not cmore and woken >= want then cmore = true end
local cm = 0
if cmore then cm = 1 end
if bound == math.huge then bound = 0 end
local mf = more_flag()
if id then record(r, id, signalled(woken, cm, mf, bound)) end
finish()
return { woken, cm, mf, num(bound) }
