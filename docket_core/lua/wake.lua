-- WakeParked, step 4 of a scoped limit, in the namespace P of the docket
-- whose keys wait: ARGV = prefix, group, memo header, request number,
-- limit, namespace (the scope's "{scope}"), now.  Pops the keys of
-- P:waiters:<S>|<limit> oldest first until one is live (its record
-- scheduled and parked on this limit), clears its parking, takes its
-- message off the schedule and queues it now.  Returns {woken (0 or 1),
-- how many keys still wait, the park time of the oldest of them ('' if
-- none)}; a resend answers its first outcome and does nothing.
local seq, limit, S, now = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if not tonumber(now) then error('docket: wake takes a number for now') end
open_memo(ARGV[3])
local first = recall(seq)
if first then return first end
local waiting = waiters_key(S, limit)
local woken = 0
while woken == 0 do
  local key = pop_oldest(waiting)
  if not key then break end
  local run = run_key(key)
  local r = redis.call('HMGET', run, 'state', 'parked', 'pin', 'f', 'p', 'w', 'a', 'g')
  if r[1] == 'scheduled' and r[2] == limit and r[3] == S then
    unpark(key, run, limit, S)
    redis.call('ZREM', DUE, key)
    redis.call('DEL', msg_key(key))
    local when = r[6]
    if (tonumber(when or '') or 0) > tonumber(now) then when = now end
    enqueue(key, r[4], r[5], when, r[7], r[8])
    woken = 1
  end
end
local oldest = redis.call('ZRANGE', waiting, 0, 0, 'WITHSCORES')
return remember(seq, {woken, redis.call('ZCARD', waiting), oldest[2] or ''})
