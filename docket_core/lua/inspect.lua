-- Inspect: ARGV = prefix, group, what, limit.  Read-only views:
--   'pending'  -> number of scheduled, queued, held and parked messages
--   'snapshot' -> {queued entries, pending {id, consumer, idle ms}, scheduled
--                  messages, parked records, workers with scores}
local what, limit = ARGV[3], tonumber(ARGV[4])
local function parked_keys()
  return redis.call('SMEMBERS', P .. ':parked')
end
if what == 'pending' then
  return redis.call('XLEN', Q) + redis.call('ZCARD', DUE) + redis.call('SCARD', P .. ':parked')
end
local entries = redis.call('XRANGE', Q, '-', '+', 'COUNT', limit)
local ok, pending = pcall(redis.call, 'XPENDING', Q, GROUP, '-', '+', limit)
if not ok then pending = {} end
local scheduled = {}
for _, key in ipairs(redis.call('ZRANGE', DUE, 0, limit - 1)) do
  scheduled[#scheduled + 1] = redis.call('HGETALL', msg_key(key))
end
local parked = {}
for _, key in ipairs(parked_keys()) do
  local r = redis.call('HMGET', run_key(key), 'f', 'p', 'w', 'a', 'g')
  if r[1] then parked[#parked + 1] = {'k', key, 'f', r[1], 'p', r[2], 'w', r[3], 'a', r[4], 'g', r[5]} end
end
local workers = redis.call('ZRANGE', P .. ':workers', 0, -1, 'WITHSCORES')
local infos = {}
for i = 1, #workers, 2 do
  infos[#infos + 1] = {workers[i], workers[i + 1],
                       redis.call('GET', P .. ':worker-tasks:' .. workers[i]) or '[]'}
end
return {entries, pending, scheduled, parked, infos}
