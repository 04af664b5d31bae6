-- Finish: ARGV = prefix, group, id, key, generation, state, now, ttl, error,
-- has_result, result.  Acknowledges the delivery; records the outcome only if
-- the generation is still current.  Returns 1 when recorded.
local id, key, gen, state, now = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6], ARGV[7]
local ttl, err, has_result, result = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
acknowledge(id)
local run = run_key(key)
if tonumber(redis.call('HGET', run, 'g') or '-1') ~= gen then
  return 0
end
redis.call('HSET', run, 'state', state, 'completed', now)
local event = {type = 'state', state = state, completed_at = tonumber(now)}
if err ~= '' then
  redis.call('HSET', run, 'error', err)
  event['error'] = err
end
if has_result == '1' then redis.call('HSET', run, 'result', result) end
conclude(key, ttl)
publish(key, event)
return 1
