-- Cancel: ARGV = prefix, group, memo header, request number, key, now, ttl.
-- Returns the previous state ('' if none); a resend answers its first
-- outcome and does nothing.
local seq, key, now, ttl = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
open_memo(ARGV[3])
local first = recall(seq)
if first then return first end
local run = run_key(key)
local state = redis.call('HGET', run, 'state')
if not state then return remember(seq, '') end
if not LIVE[state] then return remember(seq, state) end
local gen = cancel_key(key, now, ttl)
redis.call('PUBLISH', P .. ':cancel', cjson.encode({key = key, generation = gen}))
return remember(seq, state)
