-- Cancel: ARGV = prefix, group, key, now, ttl.  Returns the previous state ('' if none).
local key, now, ttl = ARGV[3], ARGV[4], ARGV[5]
local run = run_key(key)
local state = redis.call('HGET', run, 'state')
if not state then return '' end
if not LIVE[state] then return state end
unqueue(key)
local gen = next_generation()
redis.call('HSET', run, 'g', gen)
redis.call('HSET', run, 'state', 'cancelled', 'completed', now)
conclude(key, ttl)
publish(key, {type = 'state', state = 'cancelled', completed_at = tonumber(now)})
redis.call('PUBLISH', P .. ':cancel', cjson.encode({key = key, generation = gen}))
return state
