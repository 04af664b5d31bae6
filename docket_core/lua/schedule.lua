-- The fast path of the commonest call, ahead of the prelude (so the server
-- spares its definitions; it names nothing of it): one message due now, of
-- a key without a record, from a caller that keeps no memo (a Docket's add),
-- with nothing to acknowledge, follow or publish as ended.  It does what the
-- body below does for that message; any other call, or this one when the
-- partition is closing or the key has a record, goes on to the body, which
-- decides it whole (nothing is written before that is known).  A malformed
-- batch fails here as it would there, before any write.
if ARGV[3] == '' and string.match(ARGV[5] or '', '^%d+$') and #ARGV[4] >= 48 then
  local P, blob = ARGV[1], ARGV[4]
  local f = {struct.unpack('<' .. string.rep('I4c0', 12), blob, 1)}
  local when, now = tonumber(f[4]), tonumber(f[7])
  if f[13] == #blob + 1 and f[8] == '' and f[9] == '' and f[10] == '' and when and now
     and when <= now and when > -math.huge and when < math.huge
     and redis.call('EXISTS', P .. ':closing', P .. ':closed') == 0 then
    local key = f[1]
    local run = P .. ':run:' .. key
    if not redis.call('HGET', run, 'state') then
      redis.call('DEL', P .. ':prog:' .. key)
      local gen = redis.call('INCR', P .. ':generation')
      local sid = redis.call('XADD', P .. ':q', '*', 'k', key, 'f', f[2], 'p', f[3],
                             'w', f[4], 'a', f[5], 'g', gen)
      redis.call('HSET', run, 'f', f[2], 'p', f[3], 'w', f[4], 'a', f[5], 'g', gen,
                 'state', 'queued', 'sid', sid)
      -- (the event's JSON by hand, as state_head writes it: cjson's walk of
      -- a table was a fifth of this path's server time)
      redis.call('PUBLISH', P .. ':events:' .. key, '{"type":"state","state":"queued","when":'
                 .. string.format('%.14g', when) .. ',"key":' .. cjson.encode(key) .. '}')
      return {{1, tostring(gen), 'queued'}}
    end
  end
end
-- (the prelude goes here)
-- Schedule: ARGV = prefix, group, memo header, then the fields of one or
-- more messages packed into one argument (unpack_batch), then the partition
-- count of the caller's layout (refuse_closed).  12 fields a message: key,
-- function, payload, when, attempt, mode, now, acknowledge,
-- expect_generation, ended, ended_error, request number.  ended (a state,
-- or '') is how the run this message follows ended (a perpetual task's):
-- published, with ended_error, before the new message's event when the
-- message is stored.  A follow-up (expect_generation) of a run whose key was
-- cancelled while it ran stores nothing: the record concludes as ended (or
-- cancelled).  The consecutive schedules of a flush (or a batch of adds) go
-- in one call.  Returns one {accepted, generation,
-- state} per message; a resend answers its first outcome and does nothing.
-- A partition closed by a change of the partition count refuses the call,
-- unless every message of it is a resend that was stored.
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
    unqueue(key, ack)
    redis.call('HDEL', run, 'worker', 'started', 'completed', 'error', 'result', 'cancel',
               'slot', 'pin', 'prog')
    redis.call('PERSIST', run)
  end
  -- (progress reported for a key without a record is dropped too)
  redis.call('DEL', prog_key(key))
  gen = next_generation()
  if tonumber(when) <= tonumber(now) then
    -- (the record's message and its state in one command)
    enqueue(key, fn, payload, when, attempt, gen,
            {'f', fn, 'p', payload, 'w', when, 'a', attempt, 'g', gen})
    return {1, tostring(gen), 'queued'}
  end
  redis.call('HSET', msg_key(key), 'k', key, 'f', fn, 'p', payload, 'w', when,
             'a', attempt, 'g', gen)
  if not before then before = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES') end
  redis.call('ZADD', DUE, when, key)
  redis.call('HSET', run, 'f', fn, 'p', payload, 'w', when, 'a', attempt, 'g', gen,
             'state', 'scheduled')
  publish_head(key, state_head('scheduled', 'when', when),
               {type = 'state', state = 'scheduled', when = tonumber(when)})
  return {1, tostring(gen), 'scheduled'}
end
local items = unpack_batch(ARGV[4], 12)
check_count(ARGV[5])
open_memo(ARGV[3])
local seqs = {}
for i, item in ipairs(items) do seqs[i] = item[12] end
local firsts = recall_all(seqs)
-- a resend answers what already ran; a message not yet stored is refused
-- (the whole call, before any of its writes) by a closed partition
for _, seq in ipairs(seqs) do
  if firsts[seq] == nil then
    refuse_closed(ARGV[5])
    break
  end
end
for i, f in ipairs(items) do
  local seq = f[12]
  local first = firsts[seq]
  if first == nil then
    first = remember_later(seq, schedule(f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8], f[9],
                                         f[10], f[11]))
    if MEMO and seq ~= '' then firsts[seq] = first end
  end
  replies[i] = first
end
remember_all()
-- a new soonest message: wake one blocked reader so it re-arms its timer
if before then rearm(before) end
return replies
