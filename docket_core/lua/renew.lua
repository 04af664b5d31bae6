-- RenewLeases, the part in P: ARGV = prefix, group, worker, now, slot_ttl_ms,
-- n, n delivery ids, then (limit, holder) pairs of the slots of limits
-- without a scope (each scope's slots are renewed in its own namespace by
-- renew_slots.lua).  Returns {ids this worker no longer holds, holders
-- whose slots are gone (taken over as stale)}.
local worker, now, slot_ttl, n = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local lost = {}
for i = 7, 6 + n do
  local id = ARGV[i]
  if holder_of(id) == worker then
    redis.call('XCLAIM', Q, GROUP, worker, 0, id, 'JUSTID')
  else
    lost[#lost + 1] = id
  end
end
if (#ARGV - 6 - n) % 2 ~= 0 then error('docket: renew takes (limit, holder) pairs') end
return {lost, renew_slots(7 + n, now, slot_ttl)}
