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
  -- The lease kept in the state hash is read there; the others in :h.
  local members, index = {}, {}
  for j, l in ipairs(leases) do
    if l.m == r.o then
      at[j] = r.oe
    else
      members[#members + 1] = l.m
      index[#index + 1] = j
    end
  end
  if #members > 0 and in_h(r) > 0 then
    local got = redis.call('ZMSCORE', r.H, unpack(members))
    seen(r.H)
    for k, j in ipairs(index) do at[j] = got[k] end
  end
end
local out, dropped = {}, false
for j, l in ipairs(leases) do
  local t = tonumber(at[j])
  out[j] = 0
  if alive(t) then
    renew(r, l.m, l.ttl)
    out[j] = 1
  elseif t then
    drop_holder(r, l.m, l.n, false)
    dropped = true
  end
end
if dropped then run_queues({ r }) end
finish()
return { out, more_flag() }
