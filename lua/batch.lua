-- batch.lua: several calls of one entry in one script call (a client's
-- concurrent calls that reached it together; see batch.go).
--
-- KEYS: every call's keys, call after call.
-- ARGV: n, then for each call the number of its keys and of its
--       arguments, then every call's arguments, call after call.
-- Reply: one element per call, in order: {0, reply} for a call that
--   returned a reply, {1} for one that returned nil, {2, message} for one
--   that failed with an error (an error reply, or an error raised).
--
-- Each call runs as its own script would, through run_entry, one after
-- the other: a call's begin resets what the one before it set, as a new
-- script call's does. An error stops its own call only; one raised after
-- a write (which THE RULE forbids) leaves that write, as it does when the
-- call is alone. The arguments are checked before any call runs: a batch
-- whose header does not add up runs none of them.
local function run_batch(body, K, A)
  local n = tonumber(A[1])
  if not n or n < 1 or #A < 1 + 2 * n then
    return redis.error_reply('FAIRLOCK_BATCH malformed header')
  end
  local nk, na = 0, 1 + 2 * n
  for c = 1, n do
    local k, a = tonumber(A[2 * c]), tonumber(A[2 * c + 1])
    if not k or not a or k < 0 or a < 1 then
      return redis.error_reply('FAIRLOCK_BATCH malformed header')
    end
    nk, na = nk + k, na + a
  end
  if nk ~= #K or na ~= #A then
    return redis.error_reply('FAIRLOCK_BATCH ' .. nk .. ' keys and ' .. na .. ' arguments declared, ' .. #K .. ' and ' .. #A .. ' sent')
  end
  local out = {}
  local ki, ai = 1, 2 + 2 * n
  for c = 1, n do
    local ck, ca = {}, {}
    for j = 1, tonumber(A[2 * c]) do
      ck[j] = K[ki]
      ki = ki + 1
    end
    for j = 1, tonumber(A[2 * c + 1]) do
      ca[j] = A[ai]
      ai = ai + 1
    end
    local ok, res = pcall(run_entry, body, ck, ca)
    if not ok then
      if type(res) == 'table' then res = res.err end
      out[c] = { 2, tostring(res) }
    elseif type(res) == 'table' and res.err then
      out[c] = { 2, res.err }
    elseif res == nil or res == false then
      out[c] = { 1 }
    else
      out[c] = { 0, res }
    end
  end
  return out
end
