-- leader.lua: the entry of "leader_set", "leader_clear" and "leader_get":
-- the leader record of an election (package election), kept beside the
-- election's mutex, whose grants are the election's terms.
--
-- KEYS: the mutex's five keys, then the record (<b>/ld, a hash {value,
--       term}).
-- ARGV: op, term (the leader's fencing token; set and clear), value (set),
--       the record's TTL in ms (set), the channel changes are published
--       on (set, clear).
-- Reply:
--   leader_set    {1, term} when the record holds term now, {0, stored}
--                 when it does not: a higher term is recorded, or term is
--                 not the mutex's live lease by Redis's clock (its holder
--                 has lost it, say after a pause), which is never
--                 recorded, so that the record never goes back. It writes
--                 {value, term} (publishing "term value") unless term is
--                 recorded already, whose TTL it renews.
--   leader_clear  1 when it deleted the record (term was recorded; it
--                 publishes "0"), else 0.
--   leader_get    {value, term, msLeft} when the recorded term is the
--                 mutex's live lease, which expires msLeft from now by
--                 Redis's clock unless renewed, else {false, false}:
--                 nobody leads (or the leader has not recorded itself yet).
-- Reads first, then writes to the record alone (THE RULE).

local extra = begin(KEYS)
local rec = extra[1]
declare_kind(#KEYS, 'hash')
local op = ARGV[1]
-- The mutex's lease is read below: in another release's layout it is
-- refused, as every call on the mutex is.
local st = redis.call('HMGET', KEYS[KS], 'layout', 'seq', 'exp', 'cap', 'o', 'oe')
check_layout(KEYS[KS], st[1], st[1] ~= false or st[2] ~= false or st[3] ~= false or st[4] ~= false)

-- live_term returns when the mutex's live lease under token term expires
-- (ms, Redis's clock), or nil when it has none: the lease kept in the
-- state hash, or one in :h.
local function live_term(term)
  if st[5] then
    local at = tonumber(st[6])
    if tonumber(string.match(st[5], '^%S+ %S+ %S+ (%d+)$')) == term and alive(at) then return at end
  end
  local h = redis.call('ZRANGEBYSCORE', KEYS[KH], live_min(), '+inf', 'WITHSCORES')
  for i = 1, #h, 2 do
    local token = string.match(h[i], '^%S+ %S+ %S+ (%d+)$')
    if tonumber(token) == term then return tonumber(h[i + 1]) end
  end
  return nil
end

if op == 'leader_get' then
  local got = redis.call('HMGET', rec, 'value', 'term')
  local at = got[2] and live_term(tonumber(got[2]))
  if at then return { got[1], got[2], num(at - now) } end
  return { false, false }
end

local term = tonumber(ARGV[2])
if not term then return redis.error_reply('ERR leader record: bad term ' .. tostring(ARGV[2])) end
local stored = tonumber(redis.call('HGET', rec, 'term') or '0') or 0
seen(rec)

if op == 'leader_set' then
  local ttl = tonumber(ARGV[4])
  if not ttl or ttl < 1 then return redis.error_reply('ERR leader record: bad ttl ' .. tostring(ARGV[4])) end
  if stored > term or not live_term(term) then return { 0, stored } end
  if stored == term then
    redis.call('PEXPIRE', rec, ttl)
    return { 1, term }
  end
  redis.call('HSET', rec, 'value', ARGV[3], 'term', ARGV[2])
  redis.call('PEXPIRE', rec, ttl)
  redis.call('PUBLISH', ARGV[5], ARGV[2] .. ' ' .. ARGV[3])
  return { 1, term }
end

if op == 'leader_clear' then
  if stored ~= term then return 0 end
  redis.call('DEL', rec)
  redis.call('PUBLISH', ARGV[5], '0')
  return 1
end

return redis.error_reply('ERR leader record: unknown op ' .. tostring(op))
