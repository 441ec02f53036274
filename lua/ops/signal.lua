-- signal.lua: the entry of "signal": wakes waiters of a condition
-- variable (cond.lua).
--
-- KEYS: one resource's five keys, then the condition's :c key.
-- ARGV: op ("signal"), condition name, "1" (signal) or "all" (broadcast),
--       bound ("" on a first call), id (unique to this call: a resent call
--       carries the same).
-- Drops the resource's dead waiters (on the condition too), then wakes the
-- condition's longest waiter (or all of those whose sequence is at most
-- bound): each moves to the resource's queue, behind those already
-- queued, in order, or is granted at once if nobody is queued and it fits.
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
purge_waiters(r)
local cmore = more
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
    seen(cv.C)
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
local mf = more_flag()
if id then record(r, id, signalled(woken, cm, mf, bound)) end
finish()
return { woken, cm, mf, num(bound) }
