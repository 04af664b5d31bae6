-- AcquireSlot: ARGV = prefix, group, limit, holder, max, now, stale_after,
-- slot_ttl_ms, id, key, generation.  Returns 1 if acquired, 0 if parked.
local limit, holder, max, now = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local stale_after, slot_ttl, id, key, gen = tonumber(ARGV[7]), ARGV[8], ARGV[9], ARGV[10], ARGV[11]
local slots = P .. ':slots:' .. limit
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
local r = redis.call('HMGET', run, 'g', 'parked')
if tonumber(r[1] or '-1') == tonumber(gen) and r[2] ~= limit then
  redis.call('RPUSH', wait_key(limit), key)
  redis.call('SADD', P .. ':waiting', limit)
  redis.call('HSET', run, 'state', 'scheduled', 'parked', limit)
  redis.call('HDEL', run, 'worker', 'started')
  redis.call('DEL', prog_key(key))
  publish(key, {type = 'state', state = 'scheduled'})
end
return 0
