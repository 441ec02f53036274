-- rules.lua: the model's rules, each written once. The general path and
-- the fast paths (fast.lua) both call them: a fast path decides only when
-- it may skip the general path's work, never what a rule says.

-- The marks a resource's state hash keeps for a ticket besides a grant's
-- token (see the key layout in queue.lua). A queued ticket has none: its
-- member in the queue is its record.
local ENDED = 'x'     -- tombstone: the lease or request ended without its
                      -- holder's release (a released one leaves none)
local CONDITION = 'c' -- followed by the condition's name: waiting there
local SIGNALLED = 's' -- followed by its reply: a signal's record (kept as
                      -- a tombstone), under the signal's id

-- due reports whether time at (ms: a lease's expiry, a waiter's deadline,
-- or a bound no later than some of those) has come. A lease or a waiter
-- that is due is gone, whether or not a script has dropped it yet. A
-- bound that is not due shows that nothing it bounds is due.
local function due(at)
  return at <= now
end

-- due_max and live_min are due as a zset query's score range: the members
-- with scores from '-inf' to due_max() are due, those from live_min() to
-- '+inf' alive.
local function due_max() return num(now) end
local function live_min() return '(' .. num(now) end

-- alive reports whether a lease or waiter found with time at (nil or
-- false: not found) still lives.
local function alive(at)
  return at ~= nil and at ~= false and not due(at)
end

-- nothing_due reports whether bound (hmin as loaded: nil unknown,
-- math.huge nothing there) shows that nothing it bounds is due.
local function nothing_due(bound)
  return bound ~= nil and not due(bound)
end

-- bound_of reads a stored bound (hmin, as the state row holds
-- it) of a zset of count members: nothing is due in an empty one (a bound
-- left from before is stale); an unknown bound is nil.
local function bound_of(stored, count)
  if count <= 0 then return math.huge end
  return stored
end

-- lowered returns bound once a member with time at is added: lowered to
-- at when known and later; an unknown bound stays unknown.
local function lowered(bound, at)
  if bound and at < bound then return at end
  return bound
end

-- is_token tells a grant's token (decimal digits) from the marks above
-- and from nothing.
local function is_token(v)
  return type(v) == 'string' and string.find(v, '^%d') ~= nil
end

-- is_signalled tells a signal's record; signalled makes one of a signal's
-- reply, and parse_signalled reads it back.
local function is_signalled(v)
  return type(v) == 'string' and string.sub(v, 1, 1) == SIGNALLED
end
local function signalled(woken, cm, mf, bound)
  return SIGNALLED .. num(woken) .. ' ' .. num(cm) .. ' ' .. num(mf) .. ' ' .. num(bound)
end
local function parse_signalled(v)
  local w, cm, mf, b = string.match(v, '^' .. SIGNALLED .. '(%d+) (%d+) (%d+) (%d+)$')
  return tonumber(w), tonumber(cm), tonumber(mf), b
end

-- is_tomb tells a record that is kept for a while and then forgotten: a
-- tombstone (the ticket's grant or request has ended) or a signal's
-- record.
local function is_tomb(v)
  return v == ENDED or is_signalled(v)
end

-- is_lease_trace tells a record a ticket's lease leaves: its grant's token
-- while it may live, and its tombstone once it ended unreleased. What a
-- resent release looks for (release.lua: no trace, and its first run
-- released it). A waiter's mark is not one: the ticket waits again, under
-- a request made since (a delayed copy of its acquire), and a first run
-- of the release may drop that waiter and its mark.
local function is_lease_trace(v)
  return is_token(v) or v == ENDED
end

local next_token, keys_exp, idle_exp_known
do
  -- exact returns x, a number read from a state hash, when it is one that
  -- a script wrote: not negative, and small enough that every integer up to
  -- it is a number exactly; else 0 (none). A value another program wrote
  -- ('nan', 'inf', '1e300', '-1') is no time and no sequence number: taken
  -- as one, it would make the keys' expiry never move, or move it to a time
  -- that deletes them at once, with their leases.
  local function exact(x)
    if x >= 0 and x < 9007199254740992 then return x end
    return 0
  end

  -- next_token returns the number after seq in a resource's one sequence,
  -- which is both arrival order and fencing token. It is at least the
  -- current time in microseconds, so it keeps increasing after the state
  -- hash is gone (the hash lives until a second after Redis's clock passes
  -- the last number; see keys_exp).
  function next_token(seq)
    return math.max(exact(seq) + 1, now_us)
  end

  -- keys_exp returns when a resource's keys are to expire (ms), given when
  -- they do now (exp), the latest deadline they hold (horizon), the last
  -- sequence number, and whether the resource is idle. The keys move only
  -- when they must, or when they would otherwise live long past the need:
  -- most scripts set no TTL.
  function keys_exp(exp, horizon, seq, idle)
    exp, seq = exact(exp), exact(seq)
    -- The sequence is kept until Redis's clock passes its last number.
    local need = math.max(horizon, math.floor(seq / 1000) + 1000)
    if idle then
      -- The queue and holders are empty, so Redis has deleted those keys
      -- (or will, when the buffer is applied). The state hash stays for the
      -- sequence and the tombstones. The expiry set while it was in use
      -- stands (the next grant will most likely find it far enough, and
      -- set none) unless it lies more than IDLE_MS ahead.
      if exp < need or exp > math.max(need, now) + IDLE_MS then return need + TOMB_MS / 4 end
      return exp
    end
    -- Move the horizon well past what is needed, so that renewals seldom
    -- have to move it again.
    if need > exp then return math.max(exp, need + math.max(need - now, 1000)) end
    return exp
  end

  -- idle_exp_known reports whether the keys' expiry of a resource that
  -- becomes idle with tombstones, given when they expire now (exp, which
  -- covers the latest tombstone) and its last sequence number, stays as
  -- it is whatever the latest tombstone is: when exp covers the sequence
  -- and lies less than IDLE_MS past it, or past now (keys_exp keeps it
  -- then, the latest tombstone being no later). Otherwise the expiry
  -- moves to a time the latest tombstone decides, which the general path
  -- reads.
  function idle_exp_known(exp, seq)
    exp, seq = exact(exp), exact(seq)
    local need = math.floor(seq / 1000) + 1000
    return exp >= need and exp <= math.max(need, now) + IDLE_MS
  end
end

-- grant_ttl returns how long a grant made now lasts: a lease granted to the
-- caller lasts its lease TTL; one announced on a wake list lasts only the
-- waiter TTL (if shorter) until its process confirms it by renewing, so
-- a grant that reaches a process that has just died delays the queue by
-- one waiter TTL, not one lease TTL.
local function grant_ttl(lease, wait, announced)
  if announced then return math.min(lease, wait) end
  return lease
end

-- A process's waiters on a resource (queued, or on its condition
-- variables) live and die together: its liveness field in the state hash
-- (live_field in members.lua) holds their deadline, which the process's
-- refresh moves on, and born, the sequence number from which its waiters
-- count. waiter_alive reports whether a waiter that joined at sequence
-- seq (its score) is alive, given its process's field (at, born; nil:
-- none, see live_of): the deadline has not come, and the waiter is not
-- older than the field. A field written anew after its deadline passed (the process
-- paused past its waiter TTL and came back) takes a new born: the
-- waiters it had are dead, and stay so; only those it queues from then on
-- count.
local function waiter_alive(seq, at, born)
  return alive(at) and born ~= nil and seq ~= nil and seq >= born
end

-- live_write returns the born with which a call that makes one of a
-- process's waiters wait on a resource for wait ms (joining at sequence
-- seq) writes the process's liveness field there (at, born as read; nil:
-- none), or nil when it need not write it: a field missing or dead is
-- written anew with born seq (the waiters it counted stay dead); a live
-- one is moved on to now + wait, keeping its born. A new waiter lives a
-- whole waiter TTL from its call, as after a refresh: the process's first
-- refresh comes a third of the TTL later and finds it alive with two
-- thirds to spare. (Leaving a field younger than a third of the TTL as it
-- was let a pause of a third kill a waiter just queued.) It costs no
-- command: it goes in the HSET a queued call makes anyway. The second
-- value is true when a dead field is written anew: its process's older
-- waiters stay dead, so zq must pass them (see queue.lua).
local function live_write(at, born, wait, seq)
  if at ~= nil and at >= now + wait then return nil, false end
  if not alive(at) or born == nil then return seq, at ~= nil end
  return born, false
end

-- fits_in reports whether n more permits fit with used held, on a
-- resource of capacity cap (nil: unknown, nothing fits).
local function fits_in(used, n, cap)
  return cap ~= nil and used + n <= cap
end

-- may_grant_now reports whether n permits may be granted at once with nq
-- waiters queued: only when nobody waits (no barging) and they fit.
local function may_grant_now(nq, used, n, cap)
  return nq <= 0 and fits_in(used, n, cap)
end

-- is_idle reports whether a resource has nobody: no holder, no waiter in
-- its queue or on its condition variables. It is the one answer to "is the
-- resource in use": for the capacity check, the keys' TTL, and every other
-- question of the kind; a participant a later primitive adds must count
-- here.
local function is_idle(nh, nq, nc)
  return nh <= 0 and nq <= 0 and nc <= 0
end

-- derived_key names the key of kind (with payload, unless nil) beside the
-- keys of the resource at base: keys.derived in keys.go, the one place
-- either language names such a key.
local function derived_key(base, kind, payload)
  if payload == nil then return base .. KEY_SEP .. kind end
  return base .. KEY_SEP .. kind .. KEY_SEP .. payload
end

-- wake_list names the list on which process client hears the grants to
-- its waiters on the resource whose keys start with base, and the list to
-- push to instead when that one holds another program's value (or nil).
-- A client whose id begins with "/N/" (on one server, where any keys may
-- share a blocking read) hears all of them on one list under the key
-- prefix (the first N bytes of base), hash-tagged by its own name, so
-- that one read covers every name it waits on, and falls back on the
-- resource's own; any other has only a list per resource, in the
-- resource's slot. The keys' names (keys.go)
-- follow the same rule. wake_entry is what a grant pushes there: "ticket
-- expiryMs token..." (the expiry formatted by num).
local function wake_list(base, client)
  local own = derived_key(base, 'w', client)
  local n = string.match(client, '^/(%d+)/')
  if n then
    return string.sub(base, 1, tonumber(n)) .. '{w:' .. client .. '}', own
  end
  return own, nil
end
local function wake_entry(ticket, ats, tokens)
  if tokens[2] == nil then return ticket .. ' ' .. ats .. ' ' .. tokens[1] end
  return ticket .. ' ' .. ats .. ' ' .. table.concat(tokens, ' ')
end

-- tomb_until returns when a tombstone written now may be forgotten.
local function tomb_until()
  return now + TOMB_MS
end

-- tnext_with returns a resource's new tnext (when its oldest tombstone may
-- be trimmed; nil or 0 for none) once a tombstone lasting until untl is
-- written, or nil when it stays as it is.
local function tnext_with(tnext, untl)
  if not tnext or tnext == 0 or tnext > untl then return untl end
  return nil
end

-- event_bound returns the earliest of a queue's bounds that are events of
-- it, when it may move without anybody releasing (math.huge: none): its
-- leases' expiries (hmin, the bound of :h; oe, the lease kept in the state
-- hash, or nil) and, where a waiter's process's death can move it, the
-- waiters' liveness deadline (lmin). A held mutex's queue of nq waiters
-- (used of cap 1) moves only when its lease ends: its release hands on to
-- the first live waiter, passing the dead by, and its expiry is an event
-- of its own. On a semaphore of more permits, a release may free fewer
-- than the first waiter asks for, and leave it, dead, holding back the
-- others: its death is an event there. A condition waiter's death (nc of
-- them) is watched wherever there is one (a barrier's round, a latch).
local function event_bound(hmin, oe, lmin, nq, nc, used, cap)
  local at = math.min(hmin or math.huge, oe or math.huge)
  if lmin and (nc > 0 or (nq > 0 and (used < 1 or cap ~= 1))) then at = math.min(at, lmin) end
  return at
end

-- trim_due reports whether a tombstone trim is due, by tnext.
local function trim_due(tnext)
  return tnext ~= nil and tnext > 0 and due(tnext)
end

-- may_delete reports whether an idle resource's state hash may be
-- deleted now, rather than kept until its TTL: it holds no tombstone
-- (tnext) and its sequence is more than a second behind Redis's clock,
-- so that every token handed out after is greater (next_token) even if
-- the clock steps back by as much.
local function may_delete(tnext, seq)
  return (tnext or 0) <= 0 and seq < now_us - 1000000
end

-- expiring calls f(key, x) for each of a resource's keys (K, indexed by
-- KS...KT) that must be given the keys' expiry x: the state hash when the
-- expiry moved, and each other key that holds something after the script
-- (has_h: holders in :h, has_q: waiters queued, has_t: tombstones) when
-- the expiry moved or the script may have created it (new_h: holders
-- added to an empty :h; new_q: a waiter to an empty :q; new_t: a
-- tombstone to an empty :t). A key that holds nothing does not exist, and
-- takes no command. (The third key, :d, is unused: see queue.lua.)
local function expiring(K, moved, has_h, has_q, has_t, new_h, new_q, new_t, f, x)
  if moved then f(K[KS], x) end
  if has_t and (moved or new_t) then f(K[KT], x) end
  if has_h and (moved or new_h) then f(K[KH], x) end
  if has_q and (moved or new_q) then f(K[KQ], x) end
end
