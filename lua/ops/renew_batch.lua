-- renew_batch.lua: the entry of "renew_batch": renews leases of one
-- process on one resource, each as release.lua's "renew" does one (see
-- grant.lua's renew): a live lease is extended to now + its leaseMs (so
-- its grant, if announced, is confirmed); one that has expired is dropped,
-- never brought back.
--
-- KEYS: one resource's five keys.
-- ARGV: op ("renew_batch"), client, then ticket, permits, token,
--       announced ("1" or "0"), leaseMs for each lease.
-- Reply: {{1 renewed or 0 gone, ...}, more}.

begin(KEYS)
local r = declared()[1]
local client = ARGV[2]
local leases = {}
for i = 3, #ARGV, 5 do
  leases[#leases + 1] = {
    ticket = ARGV[i], n = tonumber(ARGV[i + 1]), ttl = tonumber(ARGV[i + 4]),
    m = holder_member(ARGV[i], ARGV[i + 1], client, ARGV[i + 2]),
  }
end
local at = {}
if #leases > 0 and not r.off then
  local members = {}
  for j, l in ipairs(leases) do members[j] = l.m end
  at = redis.call('ZMSCORE', r.H, unpack(members))
end
local out, dropped = {}, false
for j, l in ipairs(leases) do
  local t = tonumber(at[j])
  out[j] = 0
  if alive(t) then
    renew(r, l.m, l.ttl)
    out[j] = 1
  elseif t then
    drop_holder(r, l.m, l.n, ENDED)
    dropped = true
  end
end
if dropped then run_queues({ r }) end
finish()
return { out, more_flag() }
