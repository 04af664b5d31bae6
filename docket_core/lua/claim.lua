-- Claim: ARGV = prefix, group, worker, now, then (id, key, generation) triples.
-- Returns one verdict per item: claimed, superseded, cancelled or lost.
local worker, now = ARGV[3], ARGV[4]
local verdicts = {}
for i = 5, #ARGV, 3 do
  local id, key, gen = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local verdict
  if holder_of(id) ~= worker then
    verdict = 'lost'
  else
    local run = run_key(key)
    local record = redis.call('HMGET', run, 'state', 'g')
    if record[1] == 'cancelled' then
      verdict = 'cancelled'
    elseif not record[1] or tonumber(record[2]) ~= gen or not LIVE[record[1]] then
      -- superseded, or this generation already ran to its end (an earlier copy)
      verdict = 'superseded'
    else
      verdict = 'claimed'
    end
    if verdict == 'claimed' then
      redis.call('XCLAIM', Q, GROUP, worker, 0, id, 'JUSTID')
      redis.call('HSET', run, 'state', 'running', 'worker', worker, 'started', now)
      redis.call('HDEL', run, 'sid')
      redis.call('DEL', prog_key(key))
      redis.call('HSET', prog_key(key), 'current', 0, 'total', 100)
      publish(key, {type = 'state', state = 'running', worker = worker,
                    started_at = tonumber(now)})
    else
      acknowledge(id)
    end
  end
  verdicts[#verdicts + 1] = verdict
end
return verdicts
