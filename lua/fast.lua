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

-- fast_expire gives key the expiry at (ms) at once (expiring's f for the
-- fast paths; the general path buffers it with expire_at).
local function fast_expire(key, at)
  redis.pcall('PEXPIREAT', key, num(at))
end

-- fast_acquire takes an "acquire" or "try" a (parse_acquire) for one
-- resource (keys K) that asks for the stored capacity and is not a
-- resend, when no tombstone trim is due and either the request may be
-- granted now or no queue can move (the resource is full, or nobody is
-- queued, and nothing is due by the bounds): then a "try" is refused and
-- an "acquire" queued.
local function fast_acquire(K, a)
  local S, ticket, client, lease, wait = K[KS], a[TICKET], a[CLIENT], a[LEASE], a[WAIT]
  local clock, st = fast_start(S, ticket)
  local cap, used, nh, nq, nc, exp0 = st[CAP], st[USED], st[NH], st[NQ], st[NC], st[EXP]
  local n = want_of(a, 1)
  local hmin, dmin = bound_of(st[HMIN], nh), bound_of(st[DMIN], nq + nc)
  local grant = n and may_grant_now(nq, used, n, cap)
  local ok = not st[MARK] and cap and n and lease and wait and cap == cap_of(a, 1) and not trim_due(st[TNEXT])
  if ok and not grant then
    -- No queue may move: nothing is due, and a queue with waiters is
    -- full. The waiters' deadline bound must be known (for the reply).
    local still = nh > 0 and nothing_due(hmin) and nothing_due(dmin) and (used >= cap or nq <= 0)
    ok = still
  end
  if not ok then return fast_defer(clock, S, st) end
  if not grant and a[OP] == 'try' then
    -- Refused, with nothing to write (the keys' TTL is as the last
    -- write left it).
    if keys_exp(exp0, 0, st[SEQ], false) == exp0 then return { 0 } end
    return fast_defer(clock, S, st)
  end
  local seq = next_token(st[SEQ])
  local ts = num(seq)
  local f, at, zkey, member, name, bound
  if grant then
    at = now + grant_ttl(lease, wait, false)
    f = { 'used', num(used + n), 'nh', num(nh + 1), 'seq', ts, ticket, ts }
    zkey, member, name, bound = K[KH], holder_member(ticket, num(n), client, ts), 'hmin', hmin
  else
    at = now + wait
    f = { 'nq', num(nq + 1), 'seq', ts, ticket, QUEUED }
    zkey, member, name, bound = K[KD], waiter_member(ticket, n, client, lease, wait, ''), 'dmin', dmin
  end
  local low = lowered(bound, at)
  put(f, name, low, bound)
  local exp = keys_exp(exp0, at, seq, false)
  put(f, 'exp', exp, exp0)
  local moved = exp ~= exp0
  -- Proven before the first write (a grant's is to :h, a waiter's to :q):
  -- the other keys written or given a TTL. S was read.
  if grant then
    if moved then
      must_be(K[KT], 'zset')
      must_be(K[KQ], 'zset')
      must_be(K[KD], 'zset')
    end
  else
    must_be(K[KD], 'zset')
    if moved then
      must_be(K[KT], 'zset')
      must_be(K[KH], 'zset')
    end
    redis.call('ZADD', K[KQ], ts, member)
  end
  redis.call('ZADD', zkey, num(at), member)
  redis.call('HSET', S, unpack(f))
  expiring(K, moved, false, grant and nh <= 0, not grant and nq <= 0, not grant and nq + nc <= 0, false, fast_expire, exp)
  if grant then return { 1, now, at, ts } end
  -- The next event, as next_event reports it: neither bound is due.
  return { 2, now, math.min(hmin, low) - now }
end

-- fast_release takes a "release" a (ARGV: it reads the ticket, client
-- and part_of, none of what parse_release converts) of a live lease on one
-- resource (keys K) when no tombstone trim is due and either nobody is
-- queued, or the queue's head waits for this resource alone, fits once
-- the lease is released, is the only one that may be granted (the
-- resource is full after, or nobody is left queued), and nothing is due
-- by the bounds: then the head is granted and told.
local function fast_release(K, a)
  local S, ticket, client = K[KS], a[TICKET], a[CLIENT]
  local n, ns, token = part_of(a, 1)
  local clock, st = fast_start(S, ticket)
  local cap, used, nh, nq, nc, exp0 = st[CAP], st[USED], st[NH], st[NQ], st[NC], st[EXP]
  local hmin, dmin = bound_of(st[HMIN], nh), bound_of(st[DMIN], nq + nc)
  -- A dead waiter (queued, or on a condition) is the general path's: it
  -- drops it when it runs the queue.
  local ok = cap and n and used - n < cap and not trim_due(st[TNEXT]) and (nq + nc <= 0 or nothing_due(dmin))
  local head, w, after = nil, nil, used
  if ok and nq > 0 then
    head = redis.call('ZRANGE', K[KQ], 0, 0)[1]
    local hw = head and parse_waiter(head)
    -- A head that is this very ticket (queued again while it holds: a
    -- resent call) is left to the general path, whose grant replaces
    -- the tombstone this release would leave.
    local single = hw and not hw.parts and hw.ticket ~= ticket
    w, ok = hw, single
    if ok then
      after = used - n + w.n
      local only = fits_in(used - n, w.n, cap) and ((after >= cap and nothing_due(hmin)) or (after < cap and nq == 1))
      ok = only
    end
  end
  local m, at = nil, nil
  if ok then
    m = holder_member(ticket, ns, client, token)
    at = tonumber(redis.call('ZSCORE', K[KH], m))
  end
  if not alive(at) then return fast_defer(clock, S, st) end
  local untl = tomb_until()
  local horizon = untl
  local f = { ticket, RELEASED }
  local seq, ttl, ts = st[SEQ], nil, nil
  if w then
    seq = next_token(seq)
    ts = num(seq)
    ttl = grant_ttl(w.lease, w.wait, true)
    horizon = math.max(horizon, now + ttl)
    f[#f + 1] = w.ticket
    f[#f + 1] = ts
    put(f, 'nq', nq - 1, nil)
    put(f, 'seq', seq, nil)
    put(f, 'hmin', lowered(hmin, now + ttl), hmin)
  else
    put(f, 'nh', nh - 1, nil)
    after = used - n
  end
  put(f, 'used', after, used)
  local tn = tnext_with(st[TNEXT], untl)
  if tn then put(f, 'tnext', tn, nil) end
  local idle = not w and is_idle(nh - 1, nq, nc)
  local exp = keys_exp(exp0, horizon, seq, idle)
  put(f, 'exp', exp, exp0)
  local moved = exp ~= exp0
  -- Proven before the first write (to :t): the other keys written or
  -- given a TTL. S, :h (and :q, for a handoff) were read.
  if w or (moved and not idle) then must_be(K[KD], 'zset') end
  if not w and moved and not idle then must_be(K[KQ], 'zset') end
  redis.call('ZADD', K[KT], num(untl), ticket)
  local list
  if w then
    redis.call('ZADD', K[KH], num(now + ttl), holder_member(w.ticket, w.ns, w.client, ts))
    -- The wake list is not declared: losing a wake-up is safe.
    local l, fallback = wake_list(base_of(S), w.client)
    list = push_wake(l, fallback, { wake_entry(w.ticket, now + ttl, { ts }) })
  end
  redis.call('HSET', S, unpack(f))
  redis.call('ZREM', K[KH], m)
  if w then
    redis.call('ZREM', K[KQ], head)
    redis.call('ZREM', K[KD], head)
    -- A list another program wrote, which refused the push, keeps its
    -- TTL.
    if list then redis.pcall('PEXPIRE', list, num(ttl)) end
  end
  expiring(K, moved, idle, false, false, false, (st[TNEXT] or 0) <= 0, fast_expire, exp)
  return { 1, 0 }
end
