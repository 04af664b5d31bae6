-- Cancel: ARGV = prefix, group, key, now, ttl.  Returns the previous state ('' if none).
local key, now, ttl = ARGV[3], ARGV[4], ARGV[5]
local run = run_key(key)
local state = redis.call('HGET', run, 'state')
if not state then return '' end
if not LIVE[state] then return state end
local gen = cancel_key(key, now, ttl)
redis.call('PUBLISH', P .. ':cancel', cjson.encode({key = key, generation = gen}))
return state
