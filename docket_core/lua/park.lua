-- Park, step 2b of a scoped limit (the limit was full), in the docket's
-- namespace P: ARGV = prefix, group, memo header, then the fields of one or
-- more parkings packed into one argument (unpack_fields), 11 each: id, key,
-- function, payload, when, attempt, generation, limit, namespace (the
-- scope's "{scope}"), now, retry_at, request number (12: the request
-- number is the last).  For each: 2 (lost, nothing changed) when the
-- sender no longer holds the delivery; else the delivery is acknowledged
-- and, if the record is at the generation: a record a cancel marked
-- concludes cancelled (0); one parked on this limit already stays (1);
-- any other waits in P:waiters:<S>|<limit>, scheduled with its message due
-- at retry_at (1: not in P:parked, so it counts once, as scheduled).  A record at another generation, or
-- none, is only acknowledged (0).  A resend answers its first outcome.
local before = false
local function park(id, key, fn, payload, when, attempt, gen, limit, S, now, retry_at)
  if WORKER and holder_of(id) ~= WORKER then return 2 end
  acknowledge(id)
  local run = run_key(key)
  local r = redis.call('HMGET', run, 'g', 'parked', 'pin', 'cancel')
  if tonumber(r[1] or '-1') ~= tonumber(gen) then return 0 end
  if r[4] then
    -- cancelled since its claim: it never waits, it concludes cancelled
    cancel_key(key, now, r[4])
    return 0
  end
  if r[2] == limit and r[3] == S then return 1 end
  -- (parked before on another limit: that parking ends)
  if r[2] then unpark(key, run, r[2], r[3]) end
  redis.call('ZADD', waiters_key(S, limit), now, key)
  redis.call('HSET', run, 'state', 'scheduled', 'parked', limit, 'pin', S)
  redis.call('HDEL', run, 'worker', 'started', 'slot')
  redis.call('DEL', prog_key(key))
  redis.call('HSET', msg_key(key), 'k', key, 'f', fn, 'p', payload, 'w', when,
             'a', attempt, 'g', gen)
  if not before then before = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES') end
  redis.call('ZADD', DUE, retry_at, key)
  publish(key, {type = 'state', state = 'scheduled'})
  return 1
end
local f = unpack_fields(ARGV[4])
if #f % 12 ~= 0 then error('docket: park takes 12 fields a parking') end
for i = 1, #f, 12 do  -- every input checked before the first write
  if not (tonumber(f[i + 6]) and tonumber(f[i + 9]) and tonumber(f[i + 10])) then
    error('docket: park takes numbers for generation, now and retry_at')
  end
end
open_memo(ARGV[3])
local parked = {}
for i = 1, #f, 12 do
  local first = recall(f[i + 11])
  if not first then
    first = remember(f[i + 11], park(f[i], f[i + 1], f[i + 2], f[i + 3], f[i + 4], f[i + 5],
                                     f[i + 6], f[i + 7], f[i + 8], f[i + 9], f[i + 10]))
  end
  parked[#parked + 1] = first
end
-- a parked message is due sooner than any before: a blocked reader re-arms
if before then rearm(before) end
return parked
