-- RenewLeases: ARGV = prefix, group, worker, now, slot_ttl_ms, n, n delivery ids,
-- then (limit, holder) pairs.  Returns {ids this worker no longer holds,
-- holders whose slots are gone (taken over as stale)}.
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
local lost_slots = {}
for i = 7 + n, #ARGV, 2 do
  local slots = P .. ':slots:' .. ARGV[i]
  if redis.call('ZSCORE', slots, ARGV[i + 1]) then
    redis.call('ZADD', slots, now, ARGV[i + 1])
    redis.call('PEXPIRE', slots, slot_ttl)
  else
    lost_slots[#lost_slots + 1] = ARGV[i + 1]
  end
end
return {lost, lost_slots}
