-- Schedule: ARGV = prefix, group, memo header, then the fields of one or
-- more messages packed into one argument (unpack_fields), 10 a message: key,
-- function, payload, when, attempt, mode, now, acknowledge,
-- expect_generation, request number.  The consecutive schedules of a flush
-- (or a batch of adds) go in one call.  Returns one {accepted, generation,
-- state} per message; a resend answers its first outcome and does nothing.
-- the soonest due time before the first future message of this call, if any
local before = false
local replies = {}
local function schedule(key, fn, payload, when, attempt, mode, now, ack, expect)
  -- a follow-up of a delivery another worker took over changes nothing
  if ack ~= '' and taken_over(ack) then return {0, '-1', ''} end
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
  if state then
    -- a record without a live message needs no unqueue (records of live keys
    -- never expire), so a new key skips this part
    unqueue(key)
    redis.call('HDEL', run, 'worker', 'started', 'completed', 'error', 'result')
    redis.call('PERSIST', run)
  end
  -- (progress reported for a key without a record is dropped too)
  redis.call('DEL', prog_key(key))
  gen = next_generation()
  redis.call('HSET', run, 'f', fn, 'p', payload, 'w', when, 'a', attempt, 'g', gen)
  if tonumber(when) <= tonumber(now) then
    enqueue(key, fn, payload, when, attempt, gen)
    return {1, tostring(gen), 'queued'}
  end
  redis.call('HSET', msg_key(key), 'k', key, 'f', fn, 'p', payload, 'w', when,
             'a', attempt, 'g', gen)
  if not before then before = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES') end
  redis.call('ZADD', DUE, when, key)
  redis.call('HSET', run, 'state', 'scheduled')
  publish(key, {type = 'state', state = 'scheduled', when = tonumber(when)})
  return {1, tostring(gen), 'scheduled'}
end
local f = unpack_fields(ARGV[4])
if #f % 10 ~= 0 then error('docket: schedule takes 10 fields a message') end
open_memo(ARGV[3])
for i = 1, #f, 10 do
  local first = recall(f[i + 9])
  if not first then
    first = remember(f[i + 9], schedule(f[i], f[i + 1], f[i + 2], f[i + 3], f[i + 4], f[i + 5],
                                        f[i + 6], f[i + 7], f[i + 8]))
  end
  replies[#replies + 1] = first
end
-- a new soonest message: wake one blocked reader so it re-arms its timer
if before then
  local after = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  if after[1] and (not before[1] or after[1] ~= before[1] or after[2] ~= before[2]) then
    redis.call('XADD', Q, '*', 'wake', '1')
  end
end
return replies
