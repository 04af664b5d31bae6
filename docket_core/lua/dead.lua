-- Dead letters: ARGV = prefix, group, what, count, ids...
--   'list'   -> {how many dead letters, the newest `count` as {id, fields}}
--   'replay' -> put the named dead letters back in the queue as they were
--               (their original fields) and remove them; returns how many
--   'drop'   -> remove the named dead letters ('*': all); returns how many
local what, count = ARGV[3], tonumber(ARGV[4])
local D = P .. ':dead'
if what == 'list' then
  if not count then error('docket: list takes a count') end
  return {redis.call('XLEN', D), redis.call('XREVRANGE', D, '+', '-', 'COUNT', count)}
end
if what == 'drop' and ARGV[5] == '*' then
  local n = redis.call('XLEN', D)
  redis.call('DEL', D)
  return n
end
if what ~= 'drop' and what ~= 'replay' then error('docket: unknown dead-letter action') end
local n = 0
for i = 5, #ARGV do
  local entry = redis.call('XRANGE', D, ARGV[i], ARGV[i])[1]
  if entry then
    if what == 'replay' then
      local fields = entry[2]
      local packed = ''
      for j = 1, #fields, 2 do
        if fields[j] == 'raw' then packed = fields[j + 1] end
      end
      local original = unpack_fields(packed)
      if #original < 2 then original = {'replayed', ARGV[i]} end
      redis.call('XADD', Q, '*', unpack(original))
    end
    redis.call('XDEL', D, ARGV[i])
    n = n + 1
  end
end
return n
