-- Finish: ARGV = prefix, group, then one (id, key, generation, state, now, ttl,
-- error, has_result, result) group per delivery: a flush's consecutive
-- finishes go in one call.  For each: acknowledges the delivery; records the
-- outcome only if the generation is still current.  Returns one 1 (recorded)
-- or 0 per delivery.
local recorded = {}
for i = 3, #ARGV, 9 do
  local id, key, gen, state, now = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4]
  local ttl, err, has_result, result = ARGV[i + 5], ARGV[i + 6], ARGV[i + 7], ARGV[i + 8]
  acknowledge(id)
  local run = run_key(key)
  if tonumber(redis.call('HGET', run, 'g') or '-1') ~= gen then
    recorded[#recorded + 1] = 0
  else
    redis.call('HSET', run, 'state', state, 'completed', now)
    local event = {type = 'state', state = state, completed_at = tonumber(now)}
    if err ~= '' then
      redis.call('HSET', run, 'error', err)
      event['error'] = err
    end
    if has_result == '1' then redis.call('HSET', run, 'result', result) end
    conclude(key, ttl)
    publish(key, event)
    recorded[#recorded + 1] = 1
  end
end
return recorded
