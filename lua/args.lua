-- args.lua: the arguments of the ops that both a fast path and the
-- general path serve, each read here only (acquire.lua and release.lua
-- document them). A parser converts ARGV's numbers in place and returns
-- ARGV, read by the names and functions below: a table built for the
-- arguments would cost the fast paths more than the rest of their reading.

-- The leading arguments of acquire and release, by name. (Release's
-- seventh, announced, is read by no rule.)
local OP, TICKET, CLIENT, LEASE, WAIT, GROUP = 1, 2, 3, 4, 5, 6

-- parse_acquire reads an "acquire" or "try" for nres resources: op,
-- ticket, client, leaseMs, waiterMs, group, then permits and capacity for
-- each resource (want_of, cap_of). A number that does not parse is nil.
local function parse_acquire(A, nres)
  A[LEASE], A[WAIT] = tonumber(A[LEASE]), tonumber(A[WAIT])
  for i = 7, 6 + 2 * nres do A[i] = tonumber(A[i]) end
  return A
end

-- want_of returns the permits acquire a asks of its i-th resource; cap_of
-- the capacity it gives that resource.
local function want_of(a, i)
  return a[5 + 2 * i]
end
local function cap_of(a, i)
  return a[6 + 2 * i]
end

-- parse_release reads a "release", "renew", "leave" or "wait" for nres
-- resources: op, ticket, client, leaseMs, waiterMs, group, announced, then
-- permits and token for each resource (part_of); "wait" adds the new
-- ticket and the condition's name (wait_args).
local function parse_release(A, nres)
  A[LEASE], A[WAIT] = tonumber(A[LEASE]), tonumber(A[WAIT])
  return A
end

-- part_of returns what release a says of its i-th resource: the permits
-- (nil if they do not parse), the permits as the client formats them
-- (which is how the scripts format them: they serve in members as they
-- are), and the lease's token.
local function part_of(a, i)
  local ns = a[6 + 2 * i]
  return tonumber(ns), ns, a[7 + 2 * i]
end

-- wait_args returns a "wait"'s new ticket and condition name.
local function wait_args(a, nres)
  return a[8 + 2 * nres], a[9 + 2 * nres]
end
