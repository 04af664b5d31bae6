-- Layout: ARGV = prefix, group, op, then the op's counts (whole numbers of
-- at least 1).  The docket's partition count lives in P:partitions (absent
-- means 1); after a change, P:leaving holds the count it left until that
-- count's partitions are sealed, and P:epoch counts the changes
-- (sansio/layout_change.py).
--   'record', expected, new[, epoch]: if the count is `expected`, no count
--       is leaving and (given) P:epoch is `epoch`, record `new` (1 deletes
--       the key) and, when it differs, `expected` as leaving, and count the
--       change in P:epoch (so a change that read the count before it went
--       away and came back records nothing)
--   'forget', old[, epoch]: forget the leaving count if it is `old` (and,
--       given, P:epoch is `epoch`: a late forget leaves a later change's)
-- Either way, return {count, leaving or '', epoch} as recorded before the call.
local op, first, second = ARGV[3], ARGV[4], ARGV[5]
local function count(value)
  return string.match(value or '', '^[1-9]%d*$') ~= nil
end
local wanted = ARGV[6]
if op == 'forget' then wanted = ARGV[5] end
if not ((op == 'record' and count(first) and count(second)) or (op == 'forget' and count(first)))
    or not (wanted == nil or string.match(wanted, '^%d+$')) then
  error('docket: layout takes record with two partition counts, or forget with one, '
        .. 'and an epoch')
end
local key, leaving_key = P .. ':partitions', P .. ':leaving'
local current = redis.call('GET', key) or '1'
local leaving = redis.call('GET', leaving_key) or ''
local epoch = redis.call('GET', P .. ':epoch') or '0'
local now_at = wanted == nil or tonumber(wanted) == tonumber(epoch)
if op == 'forget' then
  if leaving == first and now_at then
    redis.call('DEL', leaving_key)
  end
elseif current == first and leaving == '' and current ~= second and now_at then
  if second == '1' then
    redis.call('DEL', key)
  else
    redis.call('SET', key, second)
  end
  redis.call('SET', leaving_key, first)
  redis.call('INCR', P .. ':epoch')
end
return {current, leaving, epoch}
