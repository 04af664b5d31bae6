-- Clear: ARGV = prefix, group, now, ttl.  Cancels every scheduled, parked and
-- queued (undelivered) message; returns how many.
local now, ttl = ARGV[3], ARGV[4]
local count = 0
local function cancel(key)
  if redis.call('EXISTS', run_key(key)) == 1 then
    cancel_key(key, now, ttl)
  else
    unqueue(key)  -- a message without a record
  end
  count = count + 1
end
for _, key in ipairs(redis.call('ZRANGE', DUE, 0, -1)) do cancel(key) end
for _, key in ipairs(redis.call('SMEMBERS', P .. ':parked')) do cancel(key) end
local ok, pending = pcall(redis.call, 'XPENDING', Q, GROUP, '-', '+', 100000)
local held = {}
if ok then for _, p in ipairs(pending) do held[p[1]] = true end end
for _, entry in ipairs(redis.call('XRANGE', Q, '-', '+')) do
  local id, fields = entry[1], entry[2]
  if not held[id] then
    if fields[1] == 'k' then cancel(fields[2]) else redis.call('XDEL', Q, id) end
  end
end
return count
