-- Layout: ARGV = prefix, group, op, then the op's counts (whole numbers of
-- at least 1).  The docket's partition count lives in P:partitions (absent
-- means 1); after a change, P:leaving holds the count it left until that
-- count's partitions are sealed, and P:epoch counts the changes
-- (sansio/layout_change.py).
--   'record', expected, new: if the count is `expected` and no count is
--       leaving, record `new` (1 deletes the key) and, when it differs,
--       `expected` as leaving, and count the change in P:epoch
--   'forget', old: forget the leaving count if it is `old`
-- Either way, return {count, leaving or '', epoch} as recorded before the call.
local op, first, second = ARGV[3], ARGV[4], ARGV[5]
local function count(value)
  return string.match(value or '', '^[1-9]%d*$') ~= nil
end
if not ((op == 'record' and count(first) and count(second)) or (op == 'forget' and count(first))) then
  error('docket: layout takes record with two partition counts, or forget with one')
end
local key, leaving_key = P .. ':partitions', P .. ':leaving'
local current = redis.call('GET', key) or '1'
local leaving = redis.call('GET', leaving_key) or ''
local epoch = redis.call('GET', P .. ':epoch') or '0'
if op == 'forget' then
  if leaving == first then
    redis.call('DEL', leaving_key)
  end
elseif current == first and leaving == '' and current ~= second then
  if second == '1' then
    redis.call('DEL', key)
  else
    redis.call('SET', key, second)
  end
  redis.call('SET', leaving_key, first)
  redis.call('INCR', P .. ':epoch')
end
return {current, leaving, epoch}
