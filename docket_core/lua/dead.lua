-- Dead letters: ARGV = prefix, group, what, count, the partition count of
-- the caller's layout (refuse_closed), ids...
--   'list'   -> {how many dead letters, the newest `count` as {id, fields}}
--   'replay' -> put the named dead letters ('*': the oldest `count`) back in
--               the queue as they were (their original fields) and remove
--               them; a key whose record the bury failed (same generation),
--               or that has no record any more, is queued again with it.
--               Returns how many
--   'drop'   -> remove the named dead letters ('*': all); returns how many
-- Every id is checked before the first write.
local what, count = ARGV[3], tonumber(ARGV[4])
local D = P .. ':dead'
if (what ~= 'list' and what ~= 'replay' and what ~= 'drop') or not count or count < 0 then
  error('docket: dead letters take list, replay or drop, and a count')
end
for i = 6, #ARGV do
  if not (ARGV[i] == '*' and #ARGV == 6) and not string.match(ARGV[i], '^%d+%-%d+$') then
    error('docket: not a dead letter id: ' .. ARGV[i])
  end
end
if what == 'list' then
  return {redis.call('XLEN', D), redis.call('XREVRANGE', D, '+', '-', 'COUNT', count)}
end
if what == 'replay' then refuse_closed(ARGV[5]) end
if ARGV[6] == '*' and what == 'drop' then
  local n = redis.call('XLEN', D)
  redis.call('DEL', D)
  return n
end
local ids = {}
if ARGV[6] == '*' then
  for _, entry in ipairs(redis.call('XRANGE', D, '-', '+', 'COUNT', count)) do
    ids[#ids + 1] = entry[1]
  end
else
  for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
end
-- the key's record runs the replayed message: revived when the bury failed
-- it (same generation), rebuilt when it is gone; otherwise it stays as it is
-- (the message is superseded, and its claim drops it)
local function revive(original, sid)
  local m = {}
  for j = 1, #original - 1, 2 do m[original[j]] = original[j + 1] end
  if not m.k or not m.g then return end
  local run = run_key(m.k)
  local r = redis.call('HMGET', run, 'state', 'g')
  if r[1] and not (r[1] == 'failed' and r[2] == m.g) then return end
  if not r[1] then
    for _, name in ipairs({'f', 'p', 'w', 'a', 'g'}) do
      if m[name] then redis.call('HSET', run, name, m[name]) end
    end
  end
  redis.call('HDEL', run, 'completed', 'error', 'result')
  redis.call('HSET', run, 'state', 'queued', 'sid', sid)
  redis.call('PERSIST', run)
  publish(m.k, {type = 'state', state = 'queued', when = tonumber(m.w or '')})
end
local n = 0
for _, id in ipairs(ids) do
  local entry = redis.call('XRANGE', D, id, id)[1]
  if entry then
    if what == 'replay' then
      local fields = entry[2]
      local packed = ''
      for j = 1, #fields, 2 do
        if fields[j] == 'raw' then packed = fields[j + 1] end
      end
      local original = unpack_fields(packed)
      if #original < 2 then original = {'replayed', id} end
      revive(original, redis.call('XADD', Q, '*', unpack(original)))
    end
    redis.call('XDEL', D, id)
    n = n + 1
  end
end
return n
