-- RecordPartitions: ARGV = prefix, group, expected, new (whole numbers of at
-- least 1).  The docket's partition count lives in P:partitions (absent
-- means 1).  If it is `expected`, record `new` (1 deletes the key); either
-- way, return the count recorded before, as a string.
local expected, new = ARGV[3], ARGV[4]
if not string.match(expected or '', '^[1-9]%d*$') or not string.match(new or '', '^[1-9]%d*$') then
  error('docket: partition counts must be whole numbers of at least 1')
end
local key = P .. ':partitions'
local current = redis.call('GET', key) or '1'
if current == expected and current ~= new then
  if new == '1' then
    redis.call('DEL', key)
  else
    redis.call('SET', key, new)
  end
end
return current
