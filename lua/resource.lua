-- resource.lua: a resource as one script sees it. load reads its state
-- once per script into a table that holds it until finish buffers what
-- changed (with its tombstones and its keys' expiry) for writing;
-- next_event reads what the caller waits for next.

-- rebuild recounts a resource's state from its sorted sets, should its state
-- hash be missing while they are not (it is never evicted alone under
-- noeviction). It reads every holder: a recovery path, not a common one.
local function rebuild(r)
  if r.cap or redis.call('EXISTS', r.H, r.Q) == 0 then return end
  r.nh, r.nq, r.used = redis.call('ZCARD', r.H), redis.call('ZCARD', r.Q), 0
  local h = redis.call('ZRANGE', r.H, 0, -1, 'WITHSCORES')
  for i = 1, #h, 2 do
    local _, n = parse_holder(h[i])
    r.used = r.used + n
    -- The keys live as long as the leases (the lost hash said how long).
    r.horizon = math.max(r.horizon, tonumber(h[i + 1]) or 0)
  end
  r.nh0, r.nq0, r.used0 = 0, 0, 0
  r.hmin, r.lmin, r.o = nil, nil, false
  r.wrote_h, r.wrote_q = true, r.nq > 0
end

-- load returns the resource with key base base, reading its state on first
-- use. k is the index in KEYS of its first key, if it was declared; ticket,
-- if given, is looked up in its grants (r.grant), and client, if given,
-- in its liveness fields (live_of). An undeclared resource
-- whose keys this node cannot serve now (its slot is migrating) comes back
-- with r.off set and no state: nothing may be granted on it or written to
-- it in this script.
local function load(base, k, ticket, client)
  local r = by_base[base]
  if r then return r end
  local K
  if k then
    K = resource_keys(base, keys, k)
  else
    K = resource_keys(base)
    local probe = redis.pcall('EXISTS', K[KS], K[KQ], K[KH], K[KT])
    if type(probe) == 'table' and probe.err then
      r = { base = base, off = true, nq = 0, nh = 0, nc = 0, used = 0 }
      by_base[base] = r
      return r
    end
    for _, i in ipairs({ KS, KQ, KH, KT }) do
      reach(K[i], kind_of(i, 5))
    end
  end
  local st
  if ticket and pre_call and pre_call.S == K[KS] then
    st = pre_call.st -- read by a fast path that deferred to this one
  else
    st = read_state(K[KS], ticket, client)
  end
  seen(K[KS])
  -- One constructor with every field: growing a table field by field
  -- costs more than the rest of this function.
  r = {
    base = base, keys = K, S = K[KS], Q = K[KQ], H = K[KH], T = K[KT], grant = st[MARK], ticket = ticket,
    -- Processes' liveness fields (see keep_alive): as read (client ->
    -- { at, born }, false: none), the caller's with the state; those
    -- this script writes, and their order.
    lread = {}, lives = {}, lorder = {},
    cap = st[CAP], used = st[USED], nh = st[NH], nq = st[NQ], seq = st[SEQ], exp = st[EXP], existed = st[EXISTS],
    -- The holder kept in the hash (false: none) and its expiry, and as
    -- read.
    o = st[O], oe = st[OE], o0 = st[O], oe0 = st[OE],
    nc = st[NC], nc0 = st[NC], conds = {}, conds_by = {}, -- condition waiters; conditions loaded (cond_load)
    tnext = st[TNEXT], had_t = (st[TNEXT] or 0) > 0,
    -- The bound of :h (see bound_of): nil unknown, math.huge nothing
    -- there. hbuf: the earliest score this script adds (buffered).
    hmin = bound_of(st[HMIN], st[NH] - (st[O] and 1 or 0)), hbuf = math.huge,
    -- The bound of the waiters' liveness deadlines (lmin: no later than
    -- the earliest live field's, see live_bound).
    lmin = bound_of(st[LMIN], st[NQ] + st[NC]),
    -- as read, to write back only what changed
    used0 = st[USED], nh0 = st[NH], nq0 = st[NQ], seq0 = st[SEQ], hmin0 = st[HMIN], lmin0 = st[LMIN],
    -- From which sequence number queued waiters are known alive while
    -- lmin is not due (see queue.lua), and as read.
    zq = st[ZQ], zq0 = st[ZQ],
    horizon = 0, -- latest deadline written by this script
    -- Keys this script added members to, which may have been created (or
    -- emptied and created again) here and so have no TTL yet.
    wrote_h = false, wrote_q = false, wrote_t = false,
    hpurged = false, newcap = false,
    -- Grants to record (ticket -> token), marks (ticket -> CONDITION...),
    -- tombstones (ticket -> ENDED) or forget (ticket -> false) in S, and
    -- their order.
    grants = {}, gorder = {}, cleared = {},
    -- Members this script removed (buffered), which reads still return:
    -- from :h and from :q.
    hgone = {}, qgone = {},
    -- The queue as read so far: page, position in it, members read.
    page = nil, pos = 1, qread = 0,
  }
  if client then r.lread[client] = { st[LIVE], st[BORN] } end
  rebuild(r)
  by_base[base] = r
  loaded[#loaded + 1] = r
  return r
end

-- declared returns the resources whose keys the caller passed in KEYS,
-- looking ticket (and client's liveness, if given) up in each.
local function declared(ticket, client)
  local rs = {}
  for i = 1, #keys, 5 do
    rs[#rs + 1] = load(base_of(keys[i]), i, ticket, client)
  end
  return rs
end

-- live_of returns process client's liveness field on r (at, born; nil:
-- none) as this script leaves it (written here), or as it found it when
-- read is set; each field is read once per script (with the state for
-- the caller's process). Given seq, the sequence number of one of the
-- process's waiters, it reads nothing when zq covers that waiter while
-- lmin is not due (see queue.lua): it returns a field waiter_alive takes
-- as alive, whose deadline means nothing (a caller that passes seq asks
-- only that).
local function live_of(r, client, read, seq)
  if seq and not read and not r.off and seq >= r.zq and nothing_due(r.lmin) then return math.huge, 0 end
  local x = r.lives[client]
  if x and not read then return x[1], x[2] end
  x = r.lread[client]
  if not x then
    x = {}
    if not r.off then x[1], x[2] = parse_live(redis.call('HGET', r.S, live_field(client))) end
    r.lread[client] = x
  end
  return x[1], x[2]
end

-- keep_alive keeps process client's waiters on r alive for wait ms from
-- now. A call that makes one of them wait there (joining at sequence
-- seq) writes the field as live_write says; a refresh of its live
-- waiters (seq nil) moves a live field on, and leaves a dead one dead.
local function keep_alive(r, client, wait, seq)
  if r.off then return end
  local at, born = live_of(r, client)
  if seq == nil then
    if not alive(at) or born == nil then return end
  else
    local anew
    born, anew = live_write(at, born, wait, seq)
    if born == nil then
      -- Its waiters' deadline bounds the new one's, and the keys must
      -- live until it: an idle resource's keys may have been given a
      -- shorter TTL since the field was written.
      if at then
        r.lmin = lowered(r.lmin, at)
        r.horizon = math.max(r.horizon, at)
      end
      return
    end
    if anew then r.zq = math.max(r.zq, seq) end
  end
  if not r.lives[client] then r.lorder[#r.lorder + 1] = client end
  r.lives[client] = { now + wait, born }
  r.horizon = math.max(r.horizon, now + wait)
  r.lmin = lowered(r.lmin, now + wait)
end

-- in_h returns how many of r's holders :h holds: all but the one kept in
-- the state hash (o).
local function in_h(r)
  if r.o then return r.nh - 1 end
  return r.nh
end

-- holder_at returns the expiry (ms) of r's holder m, or nil if r has no
-- such holder: from the state hash if m is the one kept there, else from
-- :h (not read when it holds nobody).
local function holder_at(r, m)
  if r.o == m then return r.oe end
  if r.off or in_h(r) <= 0 then return nil end
  local at = tonumber(redis.call('ZSCORE', r.H, m))
  seen(r.H)
  return at
end

-- record notes a grant's token (a string), a mark, a tombstone, or
-- forgets the ticket (false); finish buffers it. A ticket forgotten and
-- then granted by one script (a condition's waiter woken and granted)
-- had a field, which a grant kept in the state hash deletes (cleared).
local function record(r, ticket, v)
  local was = r.grants[ticket]
  if was == nil then r.gorder[#r.gorder + 1] = ticket end
  if was == false then r.cleared[ticket] = true end
  r.grants[ticket] = v
end

-- hold_at buffers a holder's expiry: the one kept in the state hash, or
-- one in :h, keeping :h's bound (hmin, and hbuf: the earliest time this
-- script writes) no later than the earliest.
local function hold_at(r, at, m)
  r.horizon = math.max(r.horizon, at)
  if r.o == m then
    r.oe = at
    return
  end
  write('ZADD', r.H, num(at), m)
  if at < r.hbuf then r.hbuf = at end
  r.hmin = lowered(r.hmin, at)
end

-- next_seq hands out the next number of a resource's sequence (next_token).
local function next_seq(r)
  r.seq = next_token(r.seq)
  return r.seq
end

-- put adds field = v to the field list f when v differs from v0.
local function put(f, field, v, v0)
  if v ~= v0 then
    local k = #f
    f[k + 1], f[k + 2] = field, num(v)
  end
end

-- put0 is put for a count (used, nh, nq, nc, tnext), which the state
-- hash leaves out when 0: a field that becomes 0 goes to d, the fields to
-- delete.
local function put0(f, d, field, v, v0)
  if v == v0 then return end
  if v == 0 then
    d[#d + 1] = field
  else
    local k = #f
    f[k + 1], f[k + 2] = field, num(v)
  end
end

local finish_one
do
  -- live_bound returns the earliest deadline of r's live liveness fields
  -- (math.huge: none), as this script leaves them: lmin's value when it
  -- is unknown or due (what it bounded may have moved on, or died). It
  -- reads the state hash whole, so it runs only then: about once per
  -- waiter TTL while processes wait. The dead fields it finds go into d
  -- (deleted): a process without a field has no live waiter, as one with
  -- a dead field has none, and a busy semaphore keeps no field of every
  -- process that ever waited on it.
  local function live_bound(r, d)
    local low = math.huge
    local all = redis.call('HGETALL', r.S)
    local pre = live_field('')
    for i = 1, #all, 2 do
      if string.sub(all[i], 1, #pre) == pre and not r.lives[string.sub(all[i], #pre + 1)] then
        local at = parse_live(all[i + 1])
        if alive(at) then
          if at < low then low = at end
        else
          -- The new bound leaves this dead field out: zq passes every
          -- waiter queued so far (see queue.lua).
          r.zq = math.max(r.zq, r.seq + 1)
          d[#d + 1] = all[i]
        end
      end
    end
    for _, x in pairs(r.lives) do
      if x[1] < low then low = x[1] end
    end
    return low
  end

  -- trim_tombstones forgets tombstones whose time has come, when the oldest
  -- one's has (tnext); each trim takes those due within half a lifetime, so
  -- trims are rare.
  local function trim_tombstones(r)
    if r.off or not trim_due(r.tnext) or budget <= 0 then return end
    local limit = budget
    local old = redis.call('ZRANGEBYSCORE', r.T, '-inf', now + TOMB_MS / 2, 'WITHSCORES', 'LIMIT', 0, limit)
    seen(r.T)
    local kept = nil -- the earliest time of the tombstones kept
    for i = 1, #old, 2 do
      local t = old[i]
      budget = budget - 1
      -- A ticket this script changes again keeps its entry; so does the
      -- call's own, so that the call sent again finds what this run did.
      if r.grants[t] == nil and t ~= r.ticket then
        write('ZREM', r.T, t)
        record(r, t, false)
      elseif r.grants[t] == nil then
        -- (The call's own, which this script leaves as it is.)
        local at = tonumber(old[i + 1])
        if not kept or at < kept then kept = at end
      end
    end
    local n = #old / 2
    if n >= limit then
      r.tnext = now -- more are due: the next script goes on
      more = true
    else
      local nxt = redis.call('ZRANGE', r.T, n, n, 'WITHSCORES')
      r.tnext = tonumber(nxt[2])
      -- A tombstone kept is trimmed by a later script, and the state that
      -- holds it stays until then.
      if kept and (not r.tnext or kept < r.tnext) then r.tnext = kept end
    end
    r.tnext_set = true
  end

  -- cond_keys_follow gives every condition key of r that has waiters the
  -- keys' new expiry at: a condition's waiters live until their processes'
  -- deadlines, which any call on r can move (a wait elsewhere, an acquire),
  -- so each such key follows the state hash whenever its expiry moves, not
  -- only when a call writes it. The keys are found by their waiters'
  -- marks (cond_marks); a key this call cannot reach (its slot is
  -- migrating) is left alone, as cond_load leaves it, and its waiters'
  -- next refresh moves it. Runs about once per waiter TTL while a
  -- condition has waiters (the expiry moves at most that often: keys_exp).
  local function cond_keys_follow(r, at)
    if r.off then return end
    for _, name in ipairs((cond_marks(redis.call('HGETALL', r.S)))) do
      local cv = r.conds_by[name]
      if not cv then
        local C = cond_key(r.base, name)
        if not unreachable(C) then expire_at(C, at) end
      elseif not (cv.wrote or cv.off) then
        expire_at(cv.C, at)
      end
    end
  end

  -- finish_one buffers what changed of a resource's state, and keeps its
  -- keys alive until the last deadline they hold. A semaphore with no holders
  -- and no waiters keeps only its state hash (for the sequence, and its
  -- tombstones), and deletes it when it may (may_delete).
  function finish_one(r)
    if r.off then return end
    trim_tombstones(r)
    local idle = is_idle(r.nh, r.nq, r.nc)
    local tombs = false
    for _, t in ipairs(r.gorder) do
      if is_tomb(r.grants[t]) then tombs = true end
    end
    if idle and not tombs and may_delete(r.tnext, r.seq) then
      -- Nothing in it is needed any more: the other keys are empty.
      if r.existed then write('DEL', r.S) end
      return
    end
    local changed = false
    local d = {}
    for _, t in ipairs(r.gorder) do
      local v = r.grants[t]
      if is_tomb(v) then
        -- A tombstone: forgotten with the index's entry.
        local untl = tomb_until()
        write('HSET', r.S, t, v)
        write('ZADD', r.T, num(untl), t)
        if not r.had_t then r.wrote_t = true end
        r.horizon = math.max(r.horizon, untl)
        local tn = tnext_with(r.tnext, untl)
        if tn then r.tnext, r.tnext_set = tn, true end
      elseif v and inline_token(r.o, t) == v then
        -- The holder kept in the state hash: its member is its record. A
        -- field the ticket had (see record) goes.
        if r.cleared[t] then d[#d + 1] = t end
      elseif v then
        write('HSET', r.S, t, v)
      else
        d[#d + 1] = t
      end
      changed = true
    end
    local f = {}
    if r.nq + r.nc > 0 and not nothing_due(r.lmin) then r.lmin = live_bound(r, d) end
    if r.nq + r.nc > 0 and r.lmin < math.huge then put(f, 'lmin', r.lmin, r.lmin0) end
    put(f, 'zq', r.zq, r.zq0)
    for _, c in ipairs(r.lorder) do
      local x = r.lives[c]
      f[#f + 1], f[#f + 2] = live_field(c), live_value(x[1], x[2])
    end
    if r.newcap then put(f, 'cap', r.cap or 0, nil) end
    put0(f, d, 'used', r.used, r.used0)
    put0(f, d, 'nh', r.nh, r.nh0)
    put0(f, d, 'nq', r.nq, r.nq0)
    put(f, 'seq', r.seq, r.seq0)
    put0(f, d, 'nc', r.nc, r.nc0)
    if r.tnext_set then put0(f, d, 'tnext', r.tnext or 0, nil) end
    if r.o ~= r.o0 or r.oe ~= r.oe0 then
      if r.o then
        f[#f + 1], f[#f + 2], f[#f + 3], f[#f + 4] = 'o', r.o, 'oe', num(r.oe)
      elseif r.o0 then
        d[#d + 1], d[#d + 2] = 'o', 'oe'
      end
    end
    if in_h(r) > 0 and r.hmin and r.hmin < math.huge then put(f, 'hmin', r.hmin, r.hmin0) end
    local exp = r.exp
    if not idle or #f > 0 or #d > 0 or changed then
      if idle and (r.tnext or 0) > 0 then
        -- The keys of an idle resource live as long as its tombstones,
        -- those of earlier scripts too: read even when this script wrote
        -- one, since one of an earlier script may end later (Redis's clock
        -- stepped back since). So the keys' expiry covers every tombstone.
        local last = redis.call('ZRANGE', r.T, -1, -1, 'WITHSCORES')
        seen(r.T)
        r.horizon = math.max(r.horizon, tonumber(last[2]) or 0)
      end
      exp = keys_exp(r.exp, r.horizon, r.seq, idle)
    end
    local moved = exp ~= r.exp
    local at = num(exp)
    -- A condition's key written here lives as long as the state hash, which
    -- holds its waiters' markers (and lives past their deadlines).
    for _, cv in ipairs(r.conds) do
      if cv.wrote then expire_at(cv.C, at) end
    end
    if moved and r.nc > 0 then cond_keys_follow(r, at) end
    if #f == 0 and #d == 0 and not changed and not (moved or r.wrote_h or r.wrote_q or r.wrote_t) then return end
    if moved then
      f[#f + 1] = 'exp'
      f[#f + 1] = at
    end
    -- A state hash this script creates says its layout.
    if #f > 0 and not r.existed then
      f[#f + 1] = 'layout'
      f[#f + 1] = LAYOUT
    end
    for i = 1, #f, 2 do write('HSET', r.S, f[i], f[i + 1]) end
    for _, x in ipairs(d) do write('HDEL', r.S, x) end
    expiring(r.keys, moved, in_h(r) > 0, r.nq > 0, (r.tnext or 0) > 0, r.wrote_h, r.wrote_q, r.wrote_t, expire_at, at)
  end
end

-- prove_event_keys proves the keys next_event will read (those whose
-- bound is unknown or due), so that its reads cannot fail or read another
-- program's value: a call that answers next_event calls it before its
-- first write, or before it answers if it writes nothing.
local function prove_event_keys()
  for _, r in ipairs(loaded) do
    if not r.off then
      if in_h(r) > 0 and not nothing_due(r.hmin) and not proven[r.H] then must_be(r.H, 'zset') end
    end
  end
end

-- finish buffers every loaded resource's state and the wake-ups, then
-- applies the buffer. Nothing may fail after it: the keys next_event will
-- read after it are proven first.
local function finish()
  for _, r in ipairs(loaded) do finish_one(r) end
  prove_event_keys()
  apply()
end

-- next_event returns the milliseconds until the earliest event
-- (event_bound: a lease expiry, or the waiters' liveness deadline where a
-- death can move the queue) of the resources this script loaded,
-- when a queue may move without anybody releasing, or -1 for none or
-- overdue; 0 when work
-- was left over. It runs after finish, so its reads may not fail: a key
-- it cannot read tells nothing.
local function next_event()
  if more then return 0 end
  local at = math.huge
  for _, r in ipairs(loaded) do
    if not r.off then
      local hmin = nil
      if in_h(r) > 0 then
        -- A bound that is unknown, or due (stale: what it bounded may
        -- have moved on), is read; reads after apply may not fail.
        hmin = r.hmin
        if not nothing_due(hmin) then
          local x = redis.pcall('ZRANGE', r.H, 0, 0, 'WITHSCORES')
          hmin = type(x) == 'table' and tonumber(x[2]) or nil
        end
      end
      at = math.min(at, event_bound(hmin, r.o and r.oe, r.lmin, r.nq, r.nc, r.used, r.cap))
    end
  end
  -- None; or overdue: a lease or waiter this script could not drop (on
  -- another resource), which the caller's periodic refresh sees to. Only
  -- work left over asks for the next script at once (0).
  if at == math.huge or due(at) then return -1 end
  return at - now
end
