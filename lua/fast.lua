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
-- fail for data reasons, the first of which is the only one that may fail
-- at all (a key of the wrong type): the rule in queue.lua.
-- TestFastPathsMatchGeneralPath proves each equal to the general path.

-- FAST_PATHS lets the commonest calls take their fast path.
-- internal/scripthook.NoFastPaths turns it off in tests, so that every
-- call takes the general path and the two can be compared.
local FAST_PATHS = true

-- fast_start reads Redis's clock and resource state hash S with ticket's
-- mark (read_state), as begin and load would.
local function fast_start(S, ticket)
  local clock = redis.call('TIME')
  set_now(clock)
  return clock, read_state(S, ticket)
end

-- fast_defer leaves what a fast path read to the general path (see pre),
-- and returns nil: the fast path's answer when it cannot take the call.
local function fast_defer(clock, S, st)
  pre = { clock = clock, S = S, st = st }
  return nil
end

-- fast_expire gives key the expiry x at once (expiring's f for the fast
-- paths; the general path buffers it with expire_at).
local function fast_expire(key, x)
  redis.pcall('PEXPIREAT', key, x)
end

-- fast_ttls gives the keys of K that expiring names the expiry x.
local function fast_ttls(K, moved, idle, new_h, new_q, new_t, x)
  expiring(K, moved, idle, new_h, new_q, new_t, fast_expire, x)
end

-- fast_acquire takes an "acquire" or "try" a (parse_acquire) for one
-- resource (keys K) that asks for the stored capacity and is not a
-- resend, when no tombstone trim is due and either the request may be
-- granted now or no queue can move (the resource is full, or nobody is
-- queued, and nothing is due by the bounds): then a "try" is refused and
-- an "acquire" queued.
local function fast_acquire(K, a)
  local clock, st = fast_start(K.S, a.ticket)
  local n, cap = a.want[1], st.cap
  local hmin, dmin = bound_of(st.hmin, st.nh), bound_of(st.dmin, st.nq)
  local grant = n and may_grant_now(st.nq, st.used, n, cap)
  local ok = not st.mark and cap and n and a.lease and a.wait and cap == a.caps[1] and not trim_due(st.tnext)
  if ok and not grant then
    -- No queue may move: nothing is due, and a queue with waiters is
    -- full. The waiters' deadline bound must be known (for the reply).
    local still = st.nh > 0 and nothing_due(hmin) and nothing_due(dmin) and (st.used >= cap or st.nq <= 0)
    ok = still
  end
  if not ok then return fast_defer(clock, K.S, st) end
  if not grant and a.op == 'try' then
    -- Refused, with nothing to write (the keys' TTL is as the last
    -- write left it).
    if keys_exp(st.exp, 0, st.seq, false) == st.exp then return { 0 } end
    return fast_defer(clock, K.S, st)
  end
  local seq = next_token(st.seq)
  local ts = num(seq)
  local f, at, zkey, member, name, bound
  if grant then
    at = now + grant_ttl(a.lease, a.wait, false)
    f = { 'used', num(st.used + n), 'nh', num(st.nh + 1), 'seq', ts, a.ticket, ts }
    zkey, member, name, bound = K.H, holder_member(a.ticket, num(n), a.client, ts), 'hmin', hmin
  else
    at = now + a.wait
    f = { 'nq', num(st.nq + 1), 'seq', ts, a.ticket, QUEUED }
    zkey, member, name, bound = K.D, waiter_member(a.ticket, n, a.client, a.lease, a.wait, ''), 'dmin', dmin
  end
  local low = lowered(bound, at)
  put(f, name, low, bound)
  local exp = keys_exp(st.exp, at, seq, false)
  local x = num(exp)
  put(f, 'exp', exp, st.exp)
  if not grant then redis.call('ZADD', K.Q, ts, member) end
  redis.call('ZADD', zkey, num(at), member)
  redis.call('HSET', K.S, unpack(f))
  fast_ttls(K, exp ~= st.exp, false, grant and st.nh <= 0, not grant and st.nq <= 0, false, x)
  if grant then return { 1, now, at, ts } end
  -- The next event, as next_event reports it: neither bound is due.
  return { 2, now, math.min(hmin, low) - now }
end

-- fast_release takes a "release" a (parse_release) of a live lease on one
-- resource (keys K) when no tombstone trim is due and either nobody is
-- queued, or the queue's head waits for this resource alone, fits once
-- the lease is released, is the only one that may be granted (the
-- resource is full after, or nobody is left queued), and nothing is due
-- by the bounds: then the head is granted and told.
local function fast_release(K, a)
  local p = a.parts[1]
  local clock, st = fast_start(K.S, a.ticket)
  local cap, used, n = st.cap, st.used, p.n
  local hmin, dmin = bound_of(st.hmin, st.nh), bound_of(st.dmin, st.nq)
  local ok = cap and n and used - n < cap and not trim_due(st.tnext)
  local head, w, after = nil, nil, used
  if ok and st.nq > 0 then
    local quiet = nothing_due(dmin)
    ok = quiet
    if ok then
      head = redis.call('ZRANGE', K.Q, 0, 0)[1]
      local hw = head and parse_waiter(head)
      -- A head that is this very ticket (queued again while it holds: a
      -- resent call) is left to the general path, whose grant replaces
      -- the tombstone this release would leave.
      local single = hw and not hw.parts and hw.ticket ~= a.ticket
      w, ok = hw, single
    end
    if ok then
      after = used - n + w.n
      local only = fits_in(used - n, w.n, cap) and ((after >= cap and nothing_due(hmin)) or (after < cap and st.nq == 1))
      ok = only
    end
  end
  local m, at = nil, nil
  if ok then
    m = holder_member(a.ticket, p.ns, a.client, p.ts)
    at = tonumber(redis.call('ZSCORE', K.H, m))
  end
  if not alive(at) then return fast_defer(clock, K.S, st) end
  local untl = tomb_until()
  local horizon = untl
  local f = { a.ticket, RELEASED }
  local seq, ttl, ts = st.seq, nil, nil
  if w then
    seq = next_token(seq)
    ts = num(seq)
    ttl = grant_ttl(w.lease, w.wait, true)
    horizon = math.max(horizon, now + ttl)
    f[#f + 1] = w.ticket
    f[#f + 1] = ts
    put(f, 'nq', st.nq - 1, nil)
    put(f, 'seq', seq, nil)
    put(f, 'hmin', lowered(hmin, now + ttl), hmin)
  else
    put(f, 'nh', st.nh - 1, nil)
    after = used - n
  end
  put(f, 'used', after, used)
  local tn = tnext_with(st.tnext, untl)
  if tn then put(f, 'tnext', tn, nil) end
  local idle = not w and is_idle(st.nh - 1, st.nq, st.nc)
  local exp = keys_exp(st.exp, horizon, seq, idle)
  local x = num(exp)
  put(f, 'exp', exp, st.exp)
  redis.call('ZADD', K.T, num(untl), a.ticket)
  local list
  if w then
    redis.call('ZADD', K.H, num(now + ttl), holder_member(w.ticket, w.ns, w.client, ts))
    list = wake_list(base_of(K.S), w.client)
    -- The wake list is not declared: losing a wake-up is safe.
    redis.pcall('RPUSH', list, wake_entry(w.ticket, now + ttl, { ts }))
  end
  redis.call('HSET', K.S, unpack(f))
  redis.call('ZREM', K.H, m)
  if w then
    redis.call('ZREM', K.Q, head)
    redis.call('ZREM', K.D, head)
    redis.pcall('PEXPIRE', list, ttl)
  end
  fast_ttls(K, exp ~= st.exp, idle, false, false, (st.tnext or 0) <= 0, x)
  return { 1, 0 }
end
