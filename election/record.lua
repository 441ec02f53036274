-- record.lua: the leader record of one election, kept beside the election's
-- mutex (same hash tag, so the same Cluster slot).
--
-- KEYS[1]  the record: a hash {value, term}
-- ARGV[1]  op: "set", "clear" or "get"
-- ARGV[2]  term (set, clear): the leader's fencing token
-- ARGV[3]  value (set): the leader's value
-- ARGV[4]  TTL of the record in ms (set)
-- ARGV[5]  channel to PUBLISH changes on (set, clear)
--
-- set   records {value, term} unless a term at least as high is stored, and
--       renews the record's TTL when the same term is stored. It publishes
--       "term value" when the record changed. Returns {1, term} when the
--       record holds term now, {0, stored} when a higher term is stored.
-- clear deletes the record if it holds term, and then publishes "0".
--       Returns 1 if it deleted, else 0.
-- get   returns {value, term}, or {false, false} with no record.
--
-- THE RULE (as in queue.lua): read and check everything first, then write.

local rec = KEYS[1]
local op = ARGV[1]

if op == 'get' then
  return redis.call('HMGET', rec, 'value', 'term')
end

local term = tonumber(ARGV[2])
if not term then
  return redis.error_reply('ERR election record: bad term ' .. tostring(ARGV[2]))
end
local stored = tonumber(redis.call('HGET', rec, 'term') or '0') or 0

if op == 'set' then
  local ttl = tonumber(ARGV[4])
  if not ttl or ttl < 1 then
    return redis.error_reply('ERR election record: bad ttl ' .. tostring(ARGV[4]))
  end
  if stored > term then
    return {0, stored}
  end
  if stored == term then
    redis.call('PEXPIRE', rec, ttl)
    return {1, term}
  end
  redis.call('HSET', rec, 'value', ARGV[3], 'term', ARGV[2])
  redis.call('PEXPIRE', rec, ttl)
  redis.call('PUBLISH', ARGV[5], ARGV[2] .. ' ' .. ARGV[3])
  return {1, term}
end

if op == 'clear' then
  if stored ~= term then
    return 0
  end
  redis.call('DEL', rec)
  redis.call('PUBLISH', ARGV[5], '0')
  return 1
end

return redis.error_reply('ERR election record: unknown op ' .. tostring(op))
