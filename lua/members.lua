-- members.lua: how the scripts write and read what they store: a waiter's
-- and a holder's member, a multi-request's group, a resource's keys and
-- its state row (see the key layout in queue.lua). Each format is built
-- and parsed here only.

-- waiter_member is a waiter: "ticket permits client leaseMs waiterMs",
-- then a tab and its group for a multi-request.
local function waiter_member(ticket, n, client, lease, wait, group)
  local m = ticket .. ' ' .. num(n) .. ' ' .. client .. ' ' .. num(lease) .. ' ' .. num(wait)
  if group and group ~= '' then m = m .. '\t' .. group end
  return m
end

-- holder_member is a holder: "ticket permits client token" (permits and
-- token already formatted).
local function holder_member(ticket, ns, client, ts)
  return ticket .. ' ' .. ns .. ' ' .. client .. ' ' .. ts
end

-- ticket_of returns the ticket of a waiter or holder member.
local function ticket_of(m)
  return string.match(m, '^%S+')
end

-- parse_holder returns the ticket and permits of holder member m.
local function parse_holder(m)
  local ticket, n = string.match(m, '^(%S+) (%d+)')
  return ticket, tonumber(n) or 0
end

-- parse_group reads a multi-request's group ("base\tpermits\tcap" for each
-- resource) into its parts {base, n, cap}.
local function parse_group(group)
  local parts, f = {}, {}
  for x in string.gmatch(group, '[^\t]+') do f[#f + 1] = x end
  for i = 1, #f - 2, 3 do
    parts[#parts + 1] = { base = f[i], n = tonumber(f[i + 1]), cap = tonumber(f[i + 2]) }
  end
  return parts
end

-- parse_waiter reads waiter member m, or returns nil for a member
-- fairlock did not write.
local function parse_waiter(m)
  local tab = string.find(m, '\t', 1, true)
  local head = m
  if tab then head = string.sub(m, 1, tab - 1) end
  local ticket, n, client, lease, wait = string.match(head, '^(%S+) (%d+) (%S+) (%d+) (%d+)$')
  if not ticket then return nil end
  local w = { ticket = ticket, n = tonumber(n), ns = n, client = client, lease = tonumber(lease), wait = tonumber(wait) }
  if tab then
    w.group = string.sub(m, tab + 1)
    w.parts = parse_group(w.group)
  end
  return w
end

-- inline_token returns the token of ticket's lease when it is the holder
-- kept in the state hash (o: its member, or false), else false. That
-- holder has no record of its own in the hash: its member is its record.
local function inline_token(o, ticket)
  if not o or not ticket then return false end
  -- (A plain search first: the pattern costs ten times as much, and the
  -- holder is most often another ticket.)
  if string.find(o, ticket .. ' ', 1, true) ~= 1 then return false end
  local t, ts = string.match(o, '^(%S+) %d+ %S+ (%d+)$')
  if t == ticket then return ts end
  return false
end

-- cond_key names the key of the condition name of the resource at base.
local function cond_key(base, name)
  return derived_key(base, 'c', name)
end

-- cond_marks finds the condition marks in all, a state hash's fields and
-- values as HGETALL returns them: a ticket's field (tickets are not
-- lowercase words, as the state's own fields and the liveness fields
-- are) whose value is CONDITION and a condition's name. It returns the
-- names, each once, in the order met, and the tickets marked with each.
local function cond_marks(all)
  local names, marked = {}, {}
  for i = 1, #all, 2 do
    local f, v = all[i], all[i + 1]
    local b = string.byte(f, 1)
    if b and (b < 97 or b > 122) and string.sub(v, 1, 1) == CONDITION then
      local name = string.sub(v, 2)
      local ts = marked[name]
      if not ts then
        ts = {}
        marked[name] = ts
        names[#names + 1] = name
      end
      ts[#ts + 1] = f
    end
  end
  return names, marked
end

-- live_field names the field of a resource's state hash that holds the
-- liveness deadline (ms) of process client's waiters there: "l", KEY_SEP,
-- the client (a control character no state field or ticket holds).
local function live_field(client)
  return 'l' .. KEY_SEP .. client
end

-- base_of returns the base of a resource's keys, given its state hash.
local function base_of(S)
  return string.sub(S, 1, -3)
end

-- resource_keys returns the five keys (indexed by KS...KT) of the resource
-- whose keys start with base, or, given KEYS and k, those declared at
-- KEYS[k..k+4]. A call on one resource passes KEYS itself.
local function resource_keys(base, K, k)
  if K then return { K[k], K[k + 1], K[k + 2], K[k + 3], K[k + 4] } end
  return { base .. ':s', base .. ':q', base .. ':d', base .. ':h', base .. ':t' }
end

-- check_layout fails the call (see run_entry) when state hash S, as
-- read, was written in another layout than LAYOUT: v is its 'layout'
-- field, and exists says whether the hash exists (a hash of the first
-- layout has no such field). Every script checks each resource it acts on
-- before it writes any key: through read_state, or (an election's record)
-- by itself.
local function check_layout(S, v, exists)
  if exists and v ~= LAYOUT then
    -- (A value another program wrote may hold anything: one word of it.)
    local found = string.gsub(string.sub(v or '1', 1, 32), '%s', '_')
    error({ fairlock_layout = S, found = found })
  end
end

-- The fields of a resource's state row (read_state), by name.
local CAP, USED, NH, NQ, SEQ, EXP, TNEXT, HMIN, NC, O, OE, LMIN, LIVE, MARK, EXISTS, BORN, ZQ = 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18

-- live_value is a liveness field's value: "deadline born", the process's
-- waiters' deadline (ms) and the sequence number from which its waiters
-- count (see waiter_alive in rules.lua); parse_live reads one (nil, nil:
-- none; 0, 0: a value fairlock did not write, which reads as a dead
-- field, so that writing it anew moves zq past its process's waiters, as
-- for any dead field: see keep_alive).
local function live_value(at, born)
  return num(at) .. ' ' .. num(born)
end
local function parse_live(v)
  if type(v) ~= 'string' then return nil, nil end
  local at, born = string.match(v, '^(%d+) (%d+)$')
  if not at then return 0, 0 end
  return tonumber(at), tonumber(born)
end

-- read_state reads resource state hash S, and ticket's mark in it when
-- ticket is given, and client's liveness field when client is, into a
-- row indexed by the names above: CAP (nil: unknown), USED, NH, NQ, SEQ,
-- EXP, TNEXT, NC, HMIN and LMIN (as stored: nil unknown), O and OE (the holder
-- kept in the hash, see queue.lua, and its expiry: false and nil when
-- there is none), LIVE and BORN (client's liveness field, parse_live: nil
-- when it has none), MARK (the ticket's record: its field, a token or a
-- mark; the token of the holder kept in the hash, which has no field; or
-- false), and EXISTS (whether the hash exists). The row is HMGET's reply
-- converted in place: the fast paths read it on every call, and a table
-- built with named fields costs more than the rest of their reading. A
-- state hash of another layout than LAYOUT fails the call here
-- (check_layout), before anything is written. With lazy true the row is
-- left incomplete: LIVE, BORN and MARK hold what HMGET returned, not yet
-- parsed (see finish_state), and only a caller that reads none of the
-- three, or calls finish_state before it does, may ask for that.
-- read_state is read_row (the HMGET reply as it came, the layout checked:
-- the lean paths decide from its strings) then convert_row (the row
-- converted in place, as above).
local read_state, finish_state, read_row, convert_row
do
  -- The fields read_state asks for: the 14th (the liveness field) and
  -- the 15th (the ticket's) are set at each call.
  local fields = { 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'nc', 'layout', 'o', 'oe', 'lmin', 'layout', 'layout', 'zq' }
  -- finish_state completes row st that read_state read lazily, for
  -- ticket and client as read: LIVE, BORN and MARK, which take pattern
  -- matches. A complete row is left as it is. (LIVE holds fields, which
  -- no read gives, until then; BORN the liveness field as read.)
  function finish_state(st, ticket, client)
    if st[LIVE] ~= fields then return st end
    local at, born = nil, nil
    if client then at, born = parse_live(st[BORN]) end
    local mark = st[MARK]
    if not (ticket and mark) then mark = inline_token(st[O], ticket) end
    st[LIVE], st[BORN], st[MARK] = at, born, mark
    return st
  end
  -- The last client whose liveness field was named, and its field: a
  -- process's calls name the same one, and the name costs a new string.
  local lclient, lfield = nil, nil
  function read_row(S, ticket, client)
    if client then
      if client ~= lclient then lclient, lfield = client, live_field(client) end
      fields[14] = lfield
    else
      fields[14] = 'layout'
    end
    fields[15] = ticket or 'layout'
    local st = redis.call('HMGET', S, unpack(fields))
    -- Every state hash holds its sequence and its keys' expiry, or says
    -- its layout.
    check_layout(S, st[10], st[5] ~= false or st[6] ~= false or st[1] ~= false or st[10] ~= false)
    return st
  end
  function convert_row(st, ticket, client, lazy)
    local exists = st[5] ~= false or st[6] ~= false or st[1] ~= false or st[10] ~= false
    -- Literal indexes: the names above, which every reader uses. A field
    -- that is absent (false) is not handed to tonumber: most are, and a
    -- call costs more than the test.
    local v1, v2, v3, v4, v5, v6, v7, v8, v9, v12, v13, v16 = st[1], st[2], st[3], st[4], st[5], st[6], st[7], st[8], st[9], st[12], st[13], st[16]
    st[1], st[2], st[3], st[4] = v1 and tonumber(v1) or nil, v2 and tonumber(v2) or 0, v3 and tonumber(v3) or 0, v4 and tonumber(v4) or 0
    st[5], st[6], st[7], st[8] = v5 and tonumber(v5) or 0, v6 and tonumber(v6) or 0, v7 and tonumber(v7) or nil, v8 and tonumber(v8) or nil
    st[9], st[11], st[12], st[13] = v9 and tonumber(v9) or 0, st[11] or false, v12 and tonumber(v12) or nil, v13 and tonumber(v13) or nil
    st[16], st[17], st[18] = exists, st[14], v16 and tonumber(v16) or 0
    st[14] = fields
    if lazy then return st end
    return finish_state(st, ticket, client)
  end
  function read_state(S, ticket, client, lazy)
    return convert_row(read_row(S, ticket, client), ticket, client, lazy)
  end
end
