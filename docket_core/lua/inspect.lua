-- Inspect: ARGV = prefix, group, what, limit.  Read-only views:
--   'pending'  -> number of scheduled, queued, held and parked messages
--   'snapshot' -> {queued {id, fields} (not held by a worker), held {id,
--                  fields, consumer, idle ms}, scheduled messages, parked
--                  messages, workers {name, score, tasks}, counts {queued,
--                  held, scheduled, parked, dead letters}}; each list holds
--                  at most `limit`, the counts are the true totals
local what, limit = ARGV[3], tonumber(ARGV[4])
if what == 'pending' then
  return redis.call('XLEN', Q) + redis.call('ZCARD', DUE) + redis.call('SCARD', P .. ':parked')
end
if what ~= 'snapshot' or not limit or limit < 1 then error('docket: unknown inspection') end
local held_total, pending = 0, {}
local ok, summary = pcall(redis.call, 'XPENDING', Q, GROUP)
if ok then
  held_total = summary[1]
  pending = redis.call('XPENDING', Q, GROUP, '-', '+', limit)
end
local held, is_held = {}, {}
for _, p in ipairs(pending) do
  is_held[p[1]] = true
  local entry = redis.call('XRANGE', Q, p[1], p[1])[1]
  held[#held + 1] = {p[1], entry and entry[2] or {}, p[2], p[3]}
end
local queued, wakes, seen = {}, 0, {}
local function is_wake(fields) return not fields or #fields == 0 or fields[1] == 'wake' end
local entries = redis.call('XRANGE', Q, '-', '+', 'COUNT', limit + #held)
for _, entry in ipairs(entries) do
  local id = entry[1]
  seen[id] = true
  if is_wake(entry[2]) then
    wakes = wakes + 1
  elseif not (is_held[id] or (held_total > #held and holder_of(id))) and #queued < limit then
    queued[#queued + 1] = entry
  end
end
-- wake-up entries are not tasks: a queue longer than the page has them at
-- its tail (readers acknowledge them at once), so look there too
if #entries == limit + #held then
  for _, entry in ipairs(redis.call('XREVRANGE', Q, '+', '-', 'COUNT', 16)) do
    if not seen[entry[1]] and is_wake(entry[2]) then wakes = wakes + 1 end
  end
end
local scheduled = {}
for _, key in ipairs(redis.call('ZRANGE', DUE, 0, limit - 1)) do
  local fields = redis.call('HGETALL', msg_key(key))
  table.insert(fields, 1, key)
  table.insert(fields, 1, 'k')
  scheduled[#scheduled + 1] = fields
end
local parked = {}
local scan = redis.call('SSCAN', P .. ':parked', 0, 'COUNT', limit)
for _, key in ipairs(scan[2]) do
  if #parked >= limit then break end
  local r = redis.call('HMGET', run_key(key), 'f', 'p', 'w', 'a', 'g')
  local fields = {'k', key}
  for i, name in ipairs({'f', 'p', 'w', 'a', 'g'}) do
    if r[i] then
      fields[#fields + 1] = name
      fields[#fields + 1] = r[i]
    end
  end
  parked[#parked + 1] = fields
end
local workers = redis.call('ZRANGE', P .. ':workers', 0, -1, 'WITHSCORES')
local infos = {}
for i = 1, #workers, 2 do
  infos[#infos + 1] = {workers[i], workers[i + 1],
                       redis.call('GET', P .. ':worker-tasks:' .. workers[i]) or '[]'}
end
local counts = {math.max(redis.call('XLEN', Q) - held_total - wakes, 0), held_total,
                redis.call('ZCARD', DUE), redis.call('SCARD', P .. ':parked'),
                redis.call('XLEN', P .. ':dead')}
return {queued, held, scheduled, parked, infos, counts}
