-- Inspect: ARGV = prefix, group, what, limit (or now).  Read-only views:
--   'pending'  -> number of scheduled, queued, held and parked messages
--   'depths'   -> {queued, scheduled, held} at now (ARGV[4]): due and not yet
--                 handed out (in the queue, or scheduled and due), waiting
--                 for a later time or a slot (scheduled, parked), and handed
--                 to a worker and not yet acknowledged; their sum is 'pending'
--   'snapshot' -> {queued {id, fields} (not held by a worker), held {id,
--                  fields, consumer, idle ms}, scheduled messages, parked
--                  messages, workers {name, score, tasks}, counts {queued,
--                  held, scheduled, parked, dead letters}}; each list holds
--                  at most `limit`, the counts are the true totals
--   'progress' -> the progress hash of key ARGV[4] (HGETALL's fields), or,
--                 when its run has reported none and runs, current 0 and
--                 total 100 (DEFAULT_PROGRESS_TOTAL, docket_core/sansio/
--                 values.py), as a claim once wrote them (mark_running)
local what, limit = ARGV[3], tonumber(ARGV[4])
if what == 'pending' then
  return redis.call('XLEN', Q) + redis.call('ZCARD', DUE) + redis.call('SCARD', P .. ':parked')
end
-- how many queue entries workers hold (no consumer group: none)
local function held_count()
  if redis.call('EXISTS', Q) == 0 then return 0 end
  local ok, summary = pcall(redis.call, 'XPENDING', Q, GROUP)
  if ok then return summary[1] end
  return 0
end
if what == 'depths' then
  local now = ARGV[4]
  if not tonumber(now) then error('docket: depths takes a now') end
  local held = held_count()
  local due = redis.call('ZCOUNT', DUE, '-inf', now)
  local later = redis.call('ZCARD', DUE) - due + redis.call('SCARD', P .. ':parked')
  return {math.max(redis.call('XLEN', Q) - held, 0) + due, later, held}
end
if what == 'progress' then
  local key = ARGV[4]
  local fields = redis.call('HGETALL', prog_key(key))
  if #fields == 0 and redis.call('HGET', run_key(key), 'state') == 'running' then
    return {'current', '0', 'total', '100'}
  end
  return fields
end
if what ~= 'snapshot' or not limit or limit < 1 then error('docket: unknown inspection') end
local held_total, pending = held_count(), {}
if held_total > 0 then pending = redis.call('XPENDING', Q, GROUP, '-', '+', limit) end
local held, is_held = {}, {}
for _, p in ipairs(pending) do
  is_held[p[1]] = true
  local entry = redis.call('XRANGE', Q, p[1], p[1])[1]
  held[#held + 1] = {p[1], entry and entry[2] or {}, p[2], p[3]}
end
local queued = {}
for _, entry in ipairs(redis.call('XRANGE', Q, '-', '+', 'COUNT', limit + #held)) do
  local id = entry[1]
  if not (is_held[id] or (held_total > #held and holder_of(id))) and #queued < limit then
    queued[#queued + 1] = entry
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
local counts = {math.max(redis.call('XLEN', Q) - held_total, 0), held_total,
                redis.call('ZCARD', DUE), redis.call('SCARD', P .. ':parked'),
                redis.call('XLEN', P .. ':dead')}
return {queued, held, scheduled, parked, infos, counts}
