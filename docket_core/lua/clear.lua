-- Clear: ARGV = prefix, group, now, ttl, budget, cursor.  Cancels up to
-- about `budget` scheduled, parked and queued (undelivered) messages, in that
-- order, so one call never blocks the server for long; the caller calls again
-- until done.  `cursor` is where the last call's queue scan stopped ('-' to
-- start).  Returns {how many were cancelled, 1 when done else 0, cursor}.
local now, ttl, budget, cursor = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
if not tonumber(now) or not tonumber(ttl) or not budget or budget < 1 or not cursor then
  error('docket: clear takes a now, a ttl, a budget and a cursor')
end
local count = 0
local function cancel(key)
  if redis.call('EXISTS', run_key(key)) == 1 then
    cancel_key(key, now, ttl)
  else
    unqueue(key)  -- a message without a record
  end
  count = count + 1
end
for _, key in ipairs(redis.call('ZRANGE', DUE, 0, budget - 1)) do cancel(key) end
if count < budget then
  for _, key in ipairs(redis.call('SRANDMEMBER', P .. ':parked', budget - count)) do
    cancel(key)
    redis.call('SREM', P .. ':parked', key)
  end
end
if count >= budget then return {count, 0, cursor} end
local wanted = budget - count
local start = cursor == '-' and '-' or '(' .. cursor
local entries = redis.call('XRANGE', Q, start, '+', 'COUNT', wanted)
for _, entry in ipairs(entries) do
  local id, fields = entry[1], entry[2]
  cursor = id
  if not holder_of(id) then
    if fields[1] == 'k' then cancel(fields[2]) end
    redis.call('XDEL', Q, id)
  end
end
local done = #entries < wanted and redis.call('ZCARD', DUE) == 0
             and redis.call('SCARD', P .. ':parked') == 0
return {count, done and 1 or 0, cursor}
