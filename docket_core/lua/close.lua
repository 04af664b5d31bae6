-- Close: ARGV = prefix, group, op, count, lease ms.  One partition of a
-- layout, closed to new tasks while the docket changes its partition count
-- to `count`, and after (partition_parts.settle_layout).  P:closed holds
-- 'lease:<count>' (it expires after the lease: a change under way, or one
-- whose opener died) or 'sealed:<count>' (the count changed to <count>).
-- schedule.lua and the dead letters' replay refuse to add to a closed
-- partition (refuse_closed).
--   'close' -> 1 after closing it under a lease; 0, and no write, while it
--              holds a task (scheduled, queued, handed out or parked)
--   'seal'  -> 1 after sealing it, if it holds this count's lease or no
--              task; else 0 (a task came in: the lease ran out first)
--   'open'  -> 1 after removing this count's lease, or with count '', a
--              seal (one an opener of the recorded count finds); else 0
local op, count, lease = ARGV[3], ARGV[4], tonumber(ARGV[5])
if (op ~= 'close' and op ~= 'seal' and op ~= 'open') or not string.match(count or '', '^%d*$')
    or not lease or lease < 1 or (count == '' and op ~= 'open') then
  error('docket: close takes close, seal or open, a partition count and a lease in ms')
end
local key = P .. ':closed'
local current = redis.call('GET', key)
local function empty()
  return redis.call('XLEN', Q) + redis.call('ZCARD', DUE) + redis.call('SCARD', P .. ':parked') == 0
end
if op == 'close' then
  if not empty() then return 0 end
  redis.call('SET', key, 'lease:' .. count, 'PX', math.floor(lease))
  return 1
end
if op == 'seal' then
  if current ~= 'lease:' .. count and not empty() then return 0 end
  redis.call('SET', key, 'sealed:' .. count)
  return 1
end
if current and (current == 'lease:' .. count
                or (count == '' and string.sub(current, 1, 7) == 'sealed:')) then
  redis.call('DEL', key)
  return 1
end
return 0
