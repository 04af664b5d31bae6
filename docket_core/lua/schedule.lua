-- Schedule: ARGV = prefix, group, memo header, then the fields of one or
-- more messages packed into one argument (unpack_fields), 12 a message: key,
-- function, payload, when, attempt, mode, now, acknowledge,
-- expect_generation, ended, ended_error, request number.  ended (a state,
-- or '') is how the run this message follows ended (a perpetual task's):
-- published, with ended_error, before the new message's event when the
-- message is stored.  A follow-up (expect_generation) of a run whose key was
-- cancelled while it ran stores nothing: the record concludes as ended (or
-- cancelled).  The consecutive schedules of a flush (or a batch of adds) go
-- in one call.  Returns one {accepted, generation,
-- state} per message; a resend answers its first outcome and does nothing.
-- the soonest due time before the first future message of this call, if any
local before = false
local replies = {}
local function schedule(key, fn, payload, when, attempt, mode, now, ack, expect, ended, err)
  -- a follow-up of a delivery another worker took over changes nothing
  if ack ~= '' and taken_over(ack) then return {0, '-1', ''} end
  acknowledge(ack)
  local run = run_key(key)
  local record = redis.call('HMGET', run, 'state', 'g', 'cancel')
  local state, gen, cancelled = record[1], tonumber(record[2] or '0'), record[3]
  if expect ~= '' and (not state or gen ~= tonumber(expect)) then
    return {0, '-1', ''}
  end
  if expect ~= '' and cancelled then
    -- nothing follows a run whose key was cancelled while it ran
    cancel_key(key, now, cancelled, ended ~= '' and ended or nil, err)
    return {0, '-1', ''}
  end
  -- (a running key that was cancelled is free again at once)
  if mode == 'add' and state and LIVE[state] and not cancelled then
    return {0, tostring(gen), state}
  end
  if ended ~= '' then
    local event = {type = 'state', state = ended, completed_at = tonumber(now)}
    if err ~= '' then event['error'] = err end
    publish(key, event)
  end
  if state then
    -- a record without a live message needs no unqueue (records of live keys
    -- never expire), so a new key skips this part
    unqueue(key)
    redis.call('HDEL', run, 'worker', 'started', 'completed', 'error', 'result', 'cancel',
               'slot', 'pin')
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
if #f % 12 ~= 0 then error('docket: schedule takes 12 fields a message') end
open_memo(ARGV[3])
for i = 1, #f, 12 do
  local first = recall(f[i + 11])
  if not first then
    first = remember(f[i + 11], schedule(f[i], f[i + 1], f[i + 2], f[i + 3], f[i + 4], f[i + 5],
                                         f[i + 6], f[i + 7], f[i + 8], f[i + 9], f[i + 10]))
  end
  replies[#replies + 1] = first
end
-- a new soonest message: wake one blocked reader so it re-arms its timer
if before then rearm(before) end
return replies
