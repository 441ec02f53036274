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

-- base_of returns the base of a resource's keys, given its state hash.
local function base_of(S)
  return string.sub(S, 1, -3)
end

-- resource_keys names the five keys of the resource whose keys start
-- with base, or, given KEYS and k, those declared at KEYS[k..k+4].
local function resource_keys(base, K, k)
  if K then return { S = K[k], Q = K[k + 1], D = K[k + 2], H = K[k + 3], T = K[k + 4] } end
  return { S = base .. ':s', Q = base .. ':q', D = base .. ':d', H = base .. ':h', T = base .. ':t' }
end

-- read_state reads resource state hash S, and ticket's mark in it when
-- ticket is given, into a row of named fields: cap (nil: unknown), used,
-- nh, nq, seq, exp, tnext, nc, hmin and dmin (as stored: nil unknown),
-- mark (the ticket's field: a token, a mark, or false).
local function read_state(S, ticket)
  local f
  if ticket then
    f = redis.call('HMGET', S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'dmin', 'nc', ticket)
  else
    f = redis.call('HMGET', S, 'cap', 'used', 'nh', 'nq', 'seq', 'exp', 'tnext', 'hmin', 'dmin', 'nc')
  end
  return {
    cap = tonumber(f[1]), used = tonumber(f[2]) or 0, nh = tonumber(f[3]) or 0, nq = tonumber(f[4]) or 0,
    seq = tonumber(f[5]) or 0, exp = tonumber(f[6]) or 0, tnext = tonumber(f[7]),
    hmin = tonumber(f[8]), dmin = tonumber(f[9]), nc = tonumber(f[10]) or 0, mark = f[11] or false,
  }
end
