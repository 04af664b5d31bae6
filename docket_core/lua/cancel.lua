-- Cancel: ARGV = prefix, group, memo header, request number, key, now, ttl.
-- Returns the previous state ('' if none); a resend answers its first
-- outcome and does nothing.  A scheduled or queued key concludes cancelled
-- at once (cancel_key).  A running one is only marked: its 'cancel' field
-- keeps the ttl, its run records its own end and nothing follows it (see
-- schedule.lua), and a copy handed out again concludes it (claim.lua,
-- acquire.lua).  Either way the workers get the signal.
local seq, key, now, ttl = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
open_memo(ARGV[3])
local first = recall(seq)
if first then return first end
local run = run_key(key)
local record = redis.call('HMGET', run, 'state', 'g', 'cancel')
local state = record[1]
if not state then return remember(seq, '') end
if not LIVE[state] then return remember(seq, state) end
-- the signal names the first generation it spares: runs below it stop
local spared
if state ~= 'running' then
  spared = cancel_key(key, now, ttl)
else
  spared = tonumber(record[2] or '0') + 1
  if not record[3] then redis.call('HSET', run, 'cancel', ttl) end
end
redis.call('PUBLISH', P .. ':cancel', cjson.encode({key = key, generation = spared}))
return remember(seq, state)
