-- AcquireSlot: ARGV = prefix, group, limit, holder, max, now, stale_after,
-- slot_ttl_ms, id, key, generation, namespace (where the limit's slots live).
-- Returns 1 if acquired, 0 if parked.
local limit, holder, max, now = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local stale_after, slot_ttl, id, key, gen = tonumber(ARGV[7]), ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local S = ARGV[12]
local slots = S .. ':slots:' .. limit
local function take()
  redis.call('ZADD', slots, now, holder)
  redis.call('PEXPIRE', slots, slot_ttl)
  return 1
end
if redis.call('ZSCORE', slots, holder) then return take() end
if redis.call('ZCARD', slots) < max then return take() end
local stale = redis.call('ZRANGEBYSCORE', slots, '-inf', now - stale_after, 'LIMIT', 0, 1)
if stale[1] then
  redis.call('ZREM', slots, stale[1])
  return take()
end
-- park: the delivery is acknowledged and the key waits at the tail
acknowledge(id)
local run = run_key(key)
local r = redis.call('HMGET', run, 'g', 'parked', 'pin')
if tonumber(r[1] or '-1') == tonumber(gen) and not (r[2] == limit and r[3] == S) then
  redis.call('RPUSH', wait_key(S, limit), waiter(P, key))
  redis.call('SADD', S .. ':waiting', limit)
  redis.call('SADD', P .. ':parked', key)
  -- this docket's reads watch the shared namespace for stale slots
  if S ~= P then redis.call('SADD', P .. ':pools', S) end
  redis.call('HSET', run, 'state', 'scheduled', 'parked', limit, 'pin', S)
  redis.call('HDEL', run, 'worker', 'started')
  redis.call('DEL', prog_key(key))
  publish(key, {type = 'state', state = 'scheduled'})
end
return 0
