-- fast.lua: the fast paths. The commonest calls (an acquire granted at
-- once, or queued behind a holder; a release that hands on to the queue's
-- head, or to nobody) need five to twelve Redis commands; the general path
-- (load, the write buffer, finish) costs several times those commands in
-- Lua work. A fast path takes a call only when it can see, from what it
-- has read, that the general path would do nothing more than it does; it
-- then writes directly, with the values the rules (rules.lua,
-- members.lua) give, as the general path would. Otherwise it returns nil
-- having written nothing, and leaves what it read in pre for the general
-- path. Both read everything first and write with commands that cannot
-- fail for data reasons: every key a fast path writes or gives a TTL is
-- proven first (a read of it, or must_be), but for the key of its first
-- write, whose failure (a key of another type) writes nothing: the rule
-- in queue.lua.
-- TestFastPathsMatchGeneralPath proves each equal to the general path.

-- FAST_PATHS lets the commonest calls take their fast path.
-- internal/testhook.NoFastPaths turns it off in tests, so that every
-- call takes the general path and the two can be compared.
local FAST_PATHS = true

-- fast holds the fast paths (one table: the scripts' prelude is near
-- Lua's limit of locals in one function).
local fast = {}

-- fast.expire gives key the expiry at (ms) at once (expiring's f for the
-- fast paths; the general path buffers it with expire_at).
function fast.expire(key, at)
  redis.pcall('PEXPIREAT', key, num(at))
end

-- fast.defer leaves what a fast path read for call a (ARGV) to the
-- general path (see pre: the row completed, finish_state), and returns
-- nil: the fast path's answer when it cannot take the call. A fast
-- release that popped the head of K's queue (hscore: its score; nil when
-- none was popped) puts it back first, with the keys' expiry exp0 (its
-- key may have gone with it).
function fast.defer(clock, S, st, a, K, hscore, head, exp0)
  finish_state(st, a[TICKET], a[CLIENT])
  if hscore then
    redis.call('ZADD', K[KQ], hscore, head)
    fast.expire(K[KQ], exp0)
  end
  pre = { clock = clock, S = S, st = st }
  return nil
end

-- fast.lean_acquire grants acquire a (a "try" alike) at once on a
-- resource (keys K) that nobody holds, waits for or waits on, whose state
-- hash exists and keeps no tombstone due to be trimmed (nor any, when the
-- keys' expiry moves), given its state row as read
-- (read_row, not converted): the commonest call of all, decided from the
-- row's strings with the fewest conversions. It writes what fast.acquire writes then, and returns nil,
-- having written nothing, for any other case.
function fast.lean_acquire(K, a, row)
  -- used, nh, nq, nc, o and the ticket's field absent: nobody holds or
  -- waits, and this is no resend (a grant of this ticket would be held).
  if row[2] or row[3] or row[4] or row[9] or row[11] or row[15] or row[10] ~= LAYOUT then return nil end
  local cap, n, lease = tonumber(row[1]), want_of(a, 1), a[LEASE]
  if not (cap and n and lease and a[WAIT]) or cap ~= cap_of(a, 1) or not fits_in(0, n, cap) then return nil end
  -- Tombstones (tnext) while none is due to be trimmed: their key is
  -- neither proven nor given a TTL here (see below).
  local tnext = row[7] and tonumber(row[7])
  if row[7] and not (tnext and tnext > 0 and not trim_due(tnext)) then return nil end
  local seq = next_token(row[5] and tonumber(row[5]) or 0)
  local ts, at = num(seq), now + grant_ttl(lease, a[WAIT], false)
  local ats = num(at)
  local exp0 = row[6] and tonumber(row[6]) or 0
  local exp = keys_exp(exp0, at, seq, false)
  local S = K[KS]
  local member = holder_member(a[TICKET], num(n), a[CLIENT], ts)
  if exp == exp0 then
    redis.call('HSET', S, 'used', num(n), 'nh', '1', 'seq', ts, 'o', member, 'oe', ats)
    return { 1, now, at, ts }
  end
  -- The keys' expiry moves: only the state hash holds anything, unless
  -- it keeps tombstones, whose key fast.acquire proves and moves too.
  if row[7] then return nil end
  redis.call('HSET', S, 'used', num(n), 'nh', '1', 'seq', ts, 'o', member, 'oe', ats, 'exp', num(exp))
  fast.expire(S, exp)
  return { 1, now, at, ts }
end

-- fast.acquire takes an "acquire" or "try" a (parse_acquire) for one
-- resource (keys K) that asks for the stored capacity (or for a resource
-- with no state: a new one) and is not a resend, when no tombstone trim
-- is due and either the request may be granted now or no queue can move
-- (the resource is full, or nobody is queued, and nothing is due by the
-- bounds): then a "try" is refused and an "acquire" queued.
function fast.acquire(K, a)
  local S, ticket, client, lease, wait = K[KS], a[TICKET], a[CLIENT], a[LEASE], a[WAIT]
  -- Redis's clock and the state row, as begin and load would read them.
  local clock = redis.call('TIME')
  set_now(clock)
  local row = read_row(S, ticket, client)
  local out = fast.lean_acquire(K, a, row)
  if out then return out end
  local st = convert_row(row, ticket, client)
  local cap, used, nh, nq, nc, exp0, o, oe = st[CAP], st[USED], st[NH], st[NQ], st[NC], st[EXP], st[O], st[OE]
  local fresh = not st[EXISTS]
  if fresh then cap = cap_of(a, 1) end
  local n = want_of(a, 1)
  local inh = nh - (o and 1 or 0)
  local hmin, lmin = bound_of(st[HMIN], inh), bound_of(st[LMIN], nq + nc)
  local grant = n and may_grant_now(nq, used, n, cap)
  -- A liveness bound due is the general path's: it reads it anew.
  local ok = not st[MARK] and cap and n and lease and wait and cap == cap_of(a, 1) and not trim_due(st[TNEXT]) and (nq + nc <= 0 or nothing_due(lmin))
  if ok and not grant then
    -- No queue may move: nothing is due (the liveness bound: see ok),
    -- and a queue with waiters is full.
    local still = nh > 0 and nothing_due(hmin) and not (o and due(oe)) and (used >= cap or nq <= 0)
    ok = still
  end
  -- No state hash, but holders or waiters left in :h or :q: the state
  -- was lost (another program's DEL, or an eviction), and the general
  -- path rebuilds it from them (rebuild), counting their permits.
  if ok and fresh and redis.call('EXISTS', K[KH], K[KQ]) > 0 then ok = false end
  if not ok then return fast.defer(clock, S, st, a) end
  if not grant and a[OP] == 'try' then
    -- Refused, with nothing to write (the keys' TTL is as the last
    -- write left it).
    if keys_exp(exp0, 0, st[SEQ], false) == exp0 then return { 0 } end
    return fast.defer(clock, S, st, a)
  end
  local seq = next_token(st[SEQ])
  local ts = num(seq)
  local f, at, member, low
  local inline = grant and not o
  if grant then
    at = now + grant_ttl(lease, wait, false)
    member = holder_member(ticket, num(n), client, ts)
    if inline then
      -- The state hash's place is free: the lease takes it, and its
      -- member is its record.
      f = { 'used', num(used + n), 'nh', num(nh + 1), 'seq', ts, 'o', member, 'oe', num(at) }
    else
      f = { 'used', num(used + n), 'nh', num(nh + 1), 'seq', ts, ticket, ts }
      put(f, 'hmin', lowered(hmin, at), hmin)
    end
  else
    at = now + wait
    member = waiter_member(ticket, n, client, lease, wait, '')
    f = { 'nq', num(nq + 1), 'seq', ts }
    -- Its process's liveness (keep_alive): a field missing or dead takes
    -- this waiter's sequence as its born.
    local lat = st[LIVE]
    local born, anew = live_write(lat, st[BORN], wait, seq)
    if born then
      local k = #f
      f[k + 1], f[k + 2] = live_field(client), live_value(at, born)
      if anew then f[k + 3], f[k + 4] = 'zq', ts end
      lat = at
    end
    low = lmin
    if lat then low = lowered(lmin, lat) end
    put(f, 'lmin', low, lmin)
  end
  if fresh then
    local k = #f
    f[k + 1], f[k + 2], f[k + 3], f[k + 4] = 'cap', num(cap), 'layout', LAYOUT
  end
  local exp = keys_exp(exp0, at, seq, false)
  -- The condition keys follow a move of the keys' expiry
  -- (cond_keys_follow): the general path's.
  if exp ~= exp0 and nc > 0 then return fast.defer(clock, S, st, a) end
  put(f, 'exp', exp, exp0)
  local moved = exp ~= exp0
  -- What the keys hold after.
  local has_h = inh > 0 or (grant and not inline)
  local has_q, has_t = nq > 0 or not grant, (st[TNEXT] or 0) > 0
  -- Proven before the first write (a grant's is to S, which was read, or
  -- to :h; a waiter's to :q): the other keys written or given a TTL.
  if moved then
    if has_t then must_be(K[KT], 'zset') end
    if has_h and inline then must_be(K[KH], 'zset') end
    if has_q and grant then must_be(K[KQ], 'zset') end
  end
  if grant then
    if not inline then redis.call('ZADD', K[KH], num(at), member) end
  else
    if moved and has_h then must_be(K[KH], 'zset') end
    -- A queued ticket has no record but its member: a resend of the call
    -- that queued it finds it there (ZADD NX answers 0) and writes
    -- nothing more.
    if redis.call('ZADD', K[KQ], 'NX', ts, member) == 0 then
      local e = event_bound(hmin, o and oe, lmin, nq, nc, used, cap)
      return { 2, now, e == math.huge and -1 or e - now }
    end
  end
  redis.call('HSET', S, unpack(f))
  expiring(K, moved, has_h, has_q, has_t, grant and not inline and inh <= 0, not grant and nq <= 0, false, fast.expire, exp)
  if grant then return { 1, now, at, ts } end
  -- (As next_event would answer: none of the bounds is due.)
  local e = event_bound(hmin, o and oe, low, nq + 1, nc, used, cap)
  return { 2, now, e == math.huge and -1 or e - now }
end

-- fast.lean_release releases the lease of release a (ARGV, as fast.release
-- reads it) on a resource (keys K) when it is the only holder, kept in the
-- state hash, live, and nobody waits or is due to be trimmed, given the
-- state row as read (read_row): the commonest release of all, decided from
-- the row's strings. It writes what fast.release writes then and returns
-- true, or returns false having written nothing.
function fast.lean_release(K, a, row)
  -- nh 1, and nq and nc absent; used as the lease holds; tombstones
  -- (tnext) only while none is due to be trimmed (then see below).
  if row[3] ~= '1' or row[4] or row[9] or not row[11] or row[2] ~= a[8] then return false end
  local tnext = row[7] and tonumber(row[7])
  if row[7] and not (tnext and tnext > 0 and not trim_due(tnext)) then return false end
  local n, ns, token = part_of(a, 1)
  -- (The capacity as the fast path reads it: a state without one, or
  -- with one that frees nothing, is the general path's.)
  local cap = tonumber(row[1])
  if not (n and cap and cap > 0) or row[11] ~= holder_member(a[TICKET], ns, a[CLIENT], token) then return false end
  if not alive(tonumber(row[12])) then return false end
  local S, seq = K[KS], tonumber(row[5]) or 0
  if row[7] then
    -- Idle with tombstones: the keys live as long as the latest, which
    -- their expiry covers; it stays when that does not depend on when the
    -- latest is (idle_exp_known), and moves otherwise (fast.release_row).
    local exp0 = tonumber(row[6]) or 0
    if not idle_exp_known(exp0, seq) then return false end
    redis.call('HDEL', S, 'used', 'nh', 'o', 'oe')
    return true
  end
  if may_delete(nil, seq) then
    -- Nothing in it is needed any more.
    redis.call('DEL', S)
    return true
  end
  local exp0 = tonumber(row[6]) or 0
  local exp = keys_exp(exp0, 0, seq, true)
  redis.call('HDEL', S, 'used', 'nh', 'o', 'oe')
  if exp ~= exp0 then
    redis.call('HSET', S, 'exp', num(exp))
    fast.expire(S, exp)
  end
  return true
end

-- fast.release_row is fast.release once it has read Redis's clock and the
-- state row (read_row, not converted) and fast.lean_release has declined. It
-- takes a "release" a (ARGV: it reads the ticket, client
-- and part_of, none of what parse_release converts) of a live lease on one
-- resource (keys K) when no tombstone trim is due and either nobody is
-- queued, or the queue's head waits for this resource alone, fits once
-- the lease is released, is the only one that may be granted (the
-- resource is full after, or nobody is left queued), and nothing is due
-- by the bounds: then the head is granted and told. The released ticket
-- leaves no trace; a resource left idle is deleted when it may be
-- (may_delete).
--
-- On a resource of capacity 1 the head is taken with ZPOPMIN, the
-- release's first write: whoever it is, it is the only waiter that may be
-- granted. A head the fast path cannot serve (dead, part of a group, this
-- very ticket), or a key it cannot prove, is put back as it was, with the
-- keys' expiry (its key may have gone with it), before the general path
-- takes the call; so the release costs one command less in the common
-- case, and two more in those.
function fast.release_row(K, a, clock, row)
  local S, ticket, client = K[KS], a[TICKET], a[CLIENT]
  local n, ns, token = part_of(a, 1)
  -- Its liveness and mark only when needed (finish_state).
  local st = convert_row(row, ticket, client, true)
  local cap, used, nh, nq, nc, exp0, o, oe = st[CAP], st[USED], st[NH], st[NQ], st[NC], st[EXP], st[O], st[OE]
  local inh = nh - (o and 1 or 0)
  local hmin, lmin = bound_of(st[HMIN], inh), bound_of(st[LMIN], nq + nc)
  local m = holder_member(ticket, ns, client, token)
  local mine = m == o
  -- A liveness bound due is the general path's: it reads it anew.
  local ok = cap and n and used - n < cap and not trim_due(st[TNEXT]) and (nq + nc <= 0 or nothing_due(lmin))
  local at = nil
  if ok then
    if mine then
      at = oe
    elseif inh > 0 then
      at = tonumber(redis.call('ZSCORE', K[KH], m))
    end
  end
  if not alive(at) then return fast.defer(clock, S, st, a) end
  local head, hscore, w, after = nil, nil, nil, used
  if nq > 0 then
    local got
    -- (A state without exp, which another program's mistake may leave,
    -- tells no expiry to put a popped head's key back with: its head is
    -- read.)
    if cap == 1 and exp0 > 0 then
      got = redis.call('ZPOPMIN', K[KQ])
      hscore = got[2]
    else
      got = redis.call('ZRANGE', K[KQ], 0, 0, 'WITHSCORES')
    end
    head = got[1]
    local hw = head and parse_waiter(head)
    -- A head that is this very ticket (queued again while it holds: a
    -- resent call) is left to the general path, whose grant replaces
    -- the record this release would forget.
    local single = hw and not hw.parts and hw.ticket ~= ticket
    w, ok = hw, single
    if ok then
      -- A dead head is the general path's: it drops it and looks on. A
      -- head from zq on is alive while lmin is not due (ok says it is
      -- not), with nothing read (see queue.lua); another process's older
      -- one is looked up.
      local hseq, lat, born = tonumber(got[2]), nil, nil
      if hw.client == client then
        finish_state(st, ticket, client)
        lat, born = st[LIVE], st[BORN]
      elseif hseq < st[ZQ] then
        lat, born = parse_live(redis.call('HGET', S, live_field(hw.client)))
      end
      ok = (hw.client ~= client and hseq >= st[ZQ]) or waiter_alive(hseq, lat, born)
    end
    if ok then
      after = used - n + w.n
      -- No other lease is due (which would make room for more).
      local quiet = nothing_due(hmin) and (mine or not o or not due(oe))
      local only = fits_in(used - n, w.n, cap) and ((after >= cap and quiet) or (after < cap and nq == 1))
      ok = only
    end
    if not ok then return fast.defer(clock, S, st, a, K, hscore, head, exp0) end
  end
  local seq = st[SEQ]
  local idle = not w and is_idle(nh - 1, nq, nc)
  -- An idle resource with tombstones keeps its keys as long as the
  -- latest (idle_exp_known): when its expiry would move to a time the
  -- latest decides, the general path reads when that is.
  if idle and (st[TNEXT] or 0) > 0 and not idle_exp_known(exp0, seq) then return fast.defer(clock, S, st, a) end
  if idle and may_delete(st[TNEXT], seq) then
    -- Nothing in it is needed any more.
    if not mine then redis.call('ZREM', K[KH], m) end
    redis.call('DEL', S)
    return { 1, 0 }
  end
  -- The released ticket's record goes (the holder kept in the state hash
  -- has none: its member was its record).
  local f, d = {}, {}
  if not mine then d[1] = ticket end
  -- The state hash's place, free after the release.
  local free = mine or not o
  local horizon, ttl, ts, wm, hs = 0, nil, nil, nil, nil
  if w then
    seq = next_token(seq)
    ts = num(seq)
    ttl = grant_ttl(w.lease, w.wait, true)
    horizon = now + ttl
    hs = num(horizon)
    wm = holder_member(w.ticket, w.ns, w.client, ts)
    put0(f, d, 'nq', nq - 1, nq)
    local k = #f
    f[k + 1], f[k + 2] = 'seq', ts
    if free then
      -- The grant takes the state hash's place: its member is its
      -- record.
      f[k + 3], f[k + 4], f[k + 5], f[k + 6] = 'o', wm, 'oe', hs
    else
      f[k + 3], f[k + 4] = w.ticket, ts
      put(f, 'hmin', lowered(hmin, horizon), hmin)
    end
  else
    put0(f, d, 'nh', nh - 1, nh)
    after = used - n
    if mine then
      d[#d + 1], d[#d + 2] = 'o', 'oe'
    end
  end
  put0(f, d, 'used', after, used)
  local exp = keys_exp(exp0, horizon, seq, idle)
  -- The condition keys follow a move of the keys' expiry
  -- (cond_keys_follow): the general path's.
  if exp ~= exp0 and nc > 0 then return fast.defer(clock, S, st, a, K, hscore, head, exp0) end
  put(f, 'exp', exp, exp0)
  local moved = exp ~= exp0
  -- What the keys hold after.
  local has_h = inh - (mine and 0 or 1) + ((w and not free) and 1 or 0) > 0
  local has_q, has_t = nq - (w and 1 or 0) > 0, (st[TNEXT] or 0) > 0
  -- Proven before the first write (to :h or S, or the pop): the other
  -- keys written or given a TTL. S, :h (unless the lease was the state
  -- hash's) and, for a handoff, :q were read. After a pop, a key that is
  -- not proven puts the head back for the general path to refuse.
  if moved then
    for _, x in ipairs({ { has_t, K[KT] }, { has_h and mine, K[KH] }, { has_q and not w, K[KQ] } }) do
      if x[1] then
        local t = hscore and type_of(x[2])
        if t and t ~= 'none' and t ~= 'zset' then return fast.defer(clock, S, st, a, K, hscore, head, exp0) end
        if t then seen(x[2]) else must_be(x[2], 'zset') end
      end
    end
  end
  local list
  if w then
    if not free then redis.call('ZADD', K[KH], hs, wm) end
    -- The wake list is not declared: losing a wake-up is safe.
    local l, fallback = wake_list(base_of(S), w.client)
    list = push_wake(l, fallback, { wake_entry(w.ticket, hs, { ts }) })
  end
  if #f > 0 then redis.call('HSET', S, unpack(f)) end
  if #d > 0 then redis.call('HDEL', S, unpack(d)) end
  if not mine then redis.call('ZREM', K[KH], m) end
  if w then
    if not hscore then redis.call('ZREM', K[KQ], head) end
    -- A list another program wrote, which refused the push, keeps its
    -- TTL.
    if list then redis.pcall('PEXPIRE', list, num(ttl)) end
  end
  expiring(K, moved, has_h, has_q, has_t, false, false, false, fast.expire, exp)
  return { 1, 0 }
end

-- fast.release takes a "release" a of one resource (keys K) on its fast
-- paths: fast.lean_release, then fast.release_row; it returns nil, having
-- written nothing, when the general path must decide. (Two functions, as
-- Lua limits how many outer names one function may use.)
function fast.release(K, a)
  -- Redis's clock and the state row, as begin and load would read them.
  local clock = redis.call('TIME')
  set_now(clock)
  local row = read_row(K[KS], a[TICKET], a[CLIENT])
  if fast.lean_release(K, a, row) then return { 1, 0 } end
  return fast.release_row(K, a, clock, row)
end
