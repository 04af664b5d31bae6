-- Finish: ARGV = prefix, group, then the fields of one or more deliveries
-- packed into one argument (unpack_fields), 9 a delivery: id, key,
-- generation, state, now, ttl, error, has_result, result.  A flush's
-- consecutive finishes go in one call.  For each: acknowledges the delivery;
-- records the outcome only if the generation is still current.  Returns one
-- 1 (recorded) or 0 per delivery.
local recorded = {}
local f = unpack_fields(ARGV[3])
for i = 1, #f, 9 do
  local id, key, gen, state, now = f[i], f[i + 1], tonumber(f[i + 2]), f[i + 3], f[i + 4]
  local ttl, err, has_result, result = f[i + 5], f[i + 6], f[i + 7], f[i + 8]
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
