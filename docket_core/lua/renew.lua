-- RenewLeases: ARGV = prefix, group, worker, now, slot_ttl_ms, n, n delivery ids,
-- then (namespace, limit, holder) triples.  Returns {ids this worker no longer holds,
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
for i = 7 + n, #ARGV, 3 do
  local slots = ARGV[i] .. ':slots:' .. ARGV[i + 1]
  local holder = ARGV[i + 2]
  if redis.call('ZSCORE', slots, holder) then
    redis.call('ZADD', slots, now, holder)
    redis.call('PEXPIRE', slots, slot_ttl)
    restale_waiting(ARGV[i], ARGV[i + 1])
  else
    lost_slots[#lost_slots + 1] = holder
  end
end
return {lost, lost_slots}
