-- Close: ARGV = prefix, group, op, count, epoch, lease ms.  One partition of
-- a layout, closed to new tasks while the docket changes its partition
-- count to `count`, and after (sansio/layout_change.py).  P:closed holds
-- 'lease:<count>' (it expires after the lease: a change under way, or one
-- whose opener died) or 'sealed:<count>:<epoch>' (the count changed to
-- <count>, the docket's <epoch>th change).  schedule.lua and the dead
-- letters' replay refuse to add to a closed partition (refuse_closed).
--   'close'  -> 1 after closing it under a lease, or when it is sealed (the
--               seal stays: an undo must not open it); 0, and no write,
--               while it holds a task (scheduled, queued, handed out or
--               parked)
--   'undo'   -> 1 after removing this count's lease; else 0
--   'seal'   -> 1 after sealing it, if it holds this count's lease or no
--               task, or already holds a seal of this epoch or a later one;
--               else 0 (a task came in: the lease ran out first)
--   'unseal' -> 1 after removing a seal of this epoch or an earlier one (a
--               change away that was undone since); else 0
local op, count, epoch, lease = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6])
local ops = {close = true, undo = true, seal = true, unseal = true}
if not ops[op] or not string.match(count or '', '^%d+$') or not string.match(epoch or '', '^%d+$')
    or not lease or lease < 1 then
  error('docket: close takes close, undo, seal or unseal, a partition count, an epoch '
        .. 'and a lease in ms')
end
epoch = tonumber(epoch)
local key = P .. ':closed'
local current = redis.call('GET', key)
local sealed_at = nil
if current and string.sub(current, 1, 7) == 'sealed:' then
  sealed_at = tonumber(string.match(current, '^sealed:%d+:(%d+)$') or '0')
end
local function empty()
  return redis.call('XLEN', Q) + redis.call('ZCARD', DUE) + redis.call('SCARD', P .. ':parked') == 0
end
if op == 'close' then
  if sealed_at then return 1 end
  if not empty() then return 0 end
  redis.call('SET', key, 'lease:' .. count, 'PX', math.floor(lease))
  return 1
end
if op == 'undo' then
  if current ~= 'lease:' .. count then return 0 end
  redis.call('DEL', key)
  return 1
end
if op == 'seal' then
  if sealed_at and sealed_at >= epoch then return 1 end
  if current ~= 'lease:' .. count and not empty() then return 0 end
  redis.call('SET', key, 'sealed:' .. count .. ':' .. epoch)
  return 1
end
if sealed_at and sealed_at <= epoch then
  redis.call('DEL', key)
  return 1
end
return 0
