-- Schedule: ARGV = prefix, group, key, function, payload, when, attempt, mode,
-- now, acknowledge, expect_generation.  Returns {accepted, generation, state}.
local key, fn, payload, when, attempt = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local mode, now, ack, expect = ARGV[8], ARGV[9], ARGV[10], ARGV[11]
acknowledge(ack)
local run = run_key(key)
local record = redis.call('HMGET', run, 'state', 'g')
local state, gen = record[1], tonumber(record[2] or '0')
if expect ~= '' and (not state or gen ~= tonumber(expect)) then
  return {0, '-1', ''}
end
if mode == 'add' and state and LIVE[state] then
  return {0, tostring(gen), state}
end
unqueue(key)
gen = next_generation()
redis.call('DEL', prog_key(key))
redis.call('HDEL', run, 'worker', 'started', 'completed', 'error', 'result')
redis.call('HSET', run, 'f', fn, 'p', payload, 'w', when, 'a', attempt, 'g', gen)
redis.call('PERSIST', run)
if tonumber(when) <= tonumber(now) then
  enqueue(key, fn, payload, when, attempt, gen)
  return {1, tostring(gen), 'queued'}
end
redis.call('HSET', msg_key(key), 'k', key, 'f', fn, 'p', payload, 'w', when,
           'a', attempt, 'g', gen)
redis.call('ZADD', DUE, when, key)
redis.call('HSET', run, 'state', 'scheduled')
publish(key, {type = 'state', state = 'scheduled', when = tonumber(when)})
-- the new soonest message: wake one blocked reader so it re-arms its timer
local head = redis.call('ZRANGE', DUE, 0, 0)
if head[1] == key then
  redis.call('XADD', Q, '*', 'wake', '1')
end
return {1, tostring(gen), 'scheduled'}
