-- Finish: ARGV = prefix, group, memo header, then the fields of one or more
-- deliveries packed into one argument (unpack_fields), 10 a delivery: id,
-- key, generation, state, now, ttl, error, has_result, result, request
-- number.  A flush's consecutive finishes go in one call.  For each:
-- acknowledges the delivery; records the outcome only if the generation is
-- still current.  Nothing changes while another worker holds the delivery.  Returns one 1 (recorded) or 0 per delivery; a resend
-- answers its first outcome and does nothing.
local function finish(id, key, gen, state, now, ttl, err, has_result, result)
  -- a worker whose lease lapsed and was taken over leaves the run to the taker
  if taken_over(id) then return 0 end
  acknowledge(id)
  local run = run_key(key)
  if tonumber(redis.call('HGET', run, 'g') or '-1') ~= gen then return 0 end
  redis.call('HSET', run, 'state', state, 'completed', now)
  redis.call('HDEL', run, 'cancel')
  local event = {type = 'state', state = state, completed_at = tonumber(now)}
  if err ~= '' then
    redis.call('HSET', run, 'error', err)
    event['error'] = err
  end
  if has_result == '1' then redis.call('HSET', run, 'result', result) end
  conclude(key, ttl)
  publish(key, event)
  return 1
end
local f = unpack_fields(ARGV[4])
if #f % 10 ~= 0 then error('docket: finish takes 10 fields a delivery') end
open_memo(ARGV[3])
local recorded = {}
for i = 1, #f, 10 do
  local first = recall(f[i + 9])
  if not first then
    first = remember(f[i + 9], finish(f[i], f[i + 1], tonumber(f[i + 2]), f[i + 3], f[i + 4],
                                      f[i + 5], f[i + 6], f[i + 7], f[i + 8]))
  end
  recorded[#recorded + 1] = first
end
return recorded
