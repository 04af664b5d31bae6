-- Read: ARGV = prefix, group, worker, count, now, redelivery_ms, promote_limit,
-- recover ('1': first hand back up to 1000 entries this worker already holds),
-- scan_every_ms (how often the docket's deliveries are scanned for stale
-- ones, by whichever worker reads; '0': every read), repair ('1': a blocked
-- read found the wake stream without its group), fresh_apart ('1': the
-- caller reads the new deliveries itself, with a plain XREADGROUP right
-- behind this call in the same round trip; a script that hands the
-- server's reply through Lua costs the server several times the command).
-- Queues due messages, takes over deliveries idle for redelivery_ms (when a
-- scan is due), then reads new ones.  Returns {deliveries, next_due, cursor,
-- created} where each delivery is {id, fields, redelivered}, cursor is where
-- the scan stopped ('0-0': it went through), and created is 1 when this read
-- made the consumer group (and the stream, if it was missing too).  Wake-up
-- entries live in their own stream (P:wake); one met in the queue (written
-- by an older docket) is acknowledged and skipped.
local worker, count, now = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local idle, limit = ARGV[6], tonumber(ARGV[7])
local due = redis.call('ZRANGEBYSCORE', DUE, '-inf', now, 'LIMIT', 0, limit)
for _, key in ipairs(due) do
  local m = redis.call('HMGET', msg_key(key), 'f', 'p', 'w', 'a', 'g')
  redis.call('ZREM', DUE, key)
  redis.call('DEL', msg_key(key))
  local run = run_key(key)
  local r = redis.call('HMGET', run, 'state', 'parked', 'pin')
  -- a key parked behind a scoped limit whose wake-up never came: it is
  -- retried now (its claim takes the slot, or parks it again)
  if r[2] then unpark(key, run, r[2], r[3]) end
  -- a message that lost fields is queued as it is (the reader sets it aside)
  if m[1] or m[2] or m[3] or m[4] or m[5] or r[1] == 'scheduled' then
    enqueue(key, m[1], m[2], m[3], m[4], m[5])
  end
end
-- free the slots of holders that stopped renewing (their worker died) and
-- wake a waiter for each; a limit nobody holds whose last woken waiter never
-- took its slot within the timeout (cancelled, say) wakes the next one.
-- These are the limits without a scope (their waiters live here); a key
-- parked behind a scoped limit is retried at its retry time instead (the
-- promotion above).  Only the limits P:stale scores at or before the cutoff
-- can have such a slot or waiter, so a read looks at those alone (up to
-- promote_limit of them; the next read goes on), however many limits have
-- waiters.
local stale_before = tonumber(now) - tonumber(idle) / 1000
if redis.call('EXISTS', P .. ':waiting') == 1 then
  -- the set of waiting limits an older docket kept: each is looked at now
  for _, limit in ipairs(redis.call('SMEMBERS', P .. ':waiting')) do
    redis.call('ZADD', P .. ':stale', 'NX', 0, limit)
  end
  redis.call('DEL', P .. ':waiting')
end
local due_limits = redis.call('ZRANGEBYSCORE', P .. ':stale', '-inf', stale_before,
                              'LIMIT', 0, ARGV[7])
for _, limit in ipairs(due_limits) do
  local slots = P .. ':slots:' .. limit
  local freed = redis.call('ZREMRANGEBYSCORE', slots, '-inf', stale_before)
  for _ = 1, freed do wake(limit, now) end
  local woken = tonumber(redis.call('HGET', P .. ':woken', limit) or '0')
  if redis.call('ZCARD', slots) == 0 and woken <= stale_before then wake(limit, now) end
  restale_waiting(P, limit)
end
local out = {}
local function take(entries, redelivered)
  for _, entry in ipairs(entries) do
    local id, fields = entry[1], entry[2]
    if not fields or fields[1] == 'wake' then
      acknowledge(id)
    else
      out[#out + 1] = {id, fields, redelivered}
    end
  end
end
if ARGV[8] == '1' then
  local ok, own = pcall(redis.call, 'XREADGROUP', 'GROUP', GROUP, worker, 'COUNT', 1000,
                        'STREAMS', Q, '0')
  if ok and own then take(own[1][2], 1) end
end
if ARGV[10] == '1' then wake_group(true) end
-- The scan for stale deliveries: XAUTOCLAIM looks at most 10 x COUNT pending
-- entries, so a scan resumes where the last one stopped (P:scan 'cursor'),
-- and stale deliveries behind many live ones are reached too.  A scan that
-- went through ('0-0') starts again only scan_every_ms after it began (P:scan
-- 'at'; also when that time is ahead of this reader's clock): a stale
-- delivery waits that much longer at most, and a busy docket's reads skip it
local created, scan = 0, true
local every = tonumber(ARGV[9]) or 0
local ok_scan, last = pcall(redis.call, 'HMGET', P .. ':scan', 'at', 'cursor')
if not ok_scan then
  -- not a hash (not ours): made again by this scan
  redis.call('DEL', P .. ':scan')
  last = {}
end
local cursor = last[2]
if not (cursor and string.find(cursor, '^%d+%-%d+$')) then cursor = '0-0' end
if every > 0 and cursor == '0-0' then
  local since = (tonumber(now) - (tonumber(last[1]) or -math.huge)) * 1000
  scan = not (since >= 0 and since < every)
end
local function no_group(reply)
  if not string.find(tostring(reply), 'NOGROUP') then return false end
  redis.call('XGROUP', 'CREATE', Q, GROUP, '0', 'MKSTREAM')
  wake_group(true)
  created = 1
  return true
end
if scan then
  local began = cursor == '0-0' and now or (last[1] or now)
  local ok, claimed = pcall(redis.call, 'XAUTOCLAIM', Q, GROUP, worker, idle, cursor,
                            'COUNT', count)
  if ok then
    take(claimed[2], 1)
    cursor = claimed[1]
  elseif no_group(claimed) then
    cursor = '0-0'
  else
    return redis.error_reply(tostring(claimed))
  end
  redis.call('HSET', P .. ':scan', 'at', began, 'cursor', cursor)
end
if #out < count and ARGV[11] ~= '1' then
  local ok, fresh = pcall(redis.call, 'XREADGROUP', 'GROUP', GROUP, worker, 'COUNT',
                          count - #out, 'STREAMS', Q, '>')
  if not ok then
    if not no_group(fresh) then return redis.error_reply(tostring(fresh)) end
    fresh = false
  end
  if fresh then take(fresh[1][2], 0) end
end
local head = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
return {out, head[2] or '', cursor, created}
