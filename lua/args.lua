-- args.lua: the arguments of the ops that both a fast path and the
-- general path serve, each parsed here only (acquire.lua and release.lua
-- document them).

-- parse_acquire reads an "acquire" or "try" for nres resources: op,
-- ticket, client, leaseMs, waiterMs, group, then permits and capacity for
-- each resource. A number that does not parse is nil.
local function parse_acquire(A, nres)
  local a = {
    op = A[1], ticket = A[2], client = A[3], lease = tonumber(A[4]), wait = tonumber(A[5]),
    group = A[6], want = {}, caps = {},
  }
  for i = 1, nres do
    a.want[i] = tonumber(A[5 + 2 * i])
    a.caps[i] = tonumber(A[6 + 2 * i])
  end
  return a
end

-- parse_release reads a "release", "renew", "leave" or "wait" for nres
-- resources: op, ticket, client, leaseMs, waiterMs, group, announced, then
-- permits and token for each resource (as the client formats them, which
-- is how the scripts format them: they serve in members as they are);
-- "wait" adds the new ticket and the condition's name.
local function parse_release(A, nres)
  local a = {
    op = A[1], ticket = A[2], client = A[3], lease = tonumber(A[4]), wait = tonumber(A[5]),
    group = A[6], announced = A[7] == '1', parts = {},
  }
  for i = 1, nres do
    a.parts[i] = { n = tonumber(A[6 + 2 * i]), ns = A[6 + 2 * i], ts = A[7 + 2 * i] }
  end
  a.fresh, a.cond = A[8 + 2 * nres], A[9 + 2 * nres]
  return a
end
