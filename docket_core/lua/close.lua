-- Close: ARGV = prefix, group, op, count, epoch, lease ms, owner.  One
-- partition of a layout, closed to new tasks while the docket changes its
-- partition count to `count`, and after that to the producers of any other
-- count (sansio/layout_change.py).  P:closing is the set of the leases of
-- the changes under way ('<count>:<owner>', the change's id; it expires
-- after the lease ms of the last close): no add while it holds one.
-- P:closed holds 'sealed:<count>:<epoch>' (the count changed to <count>,
-- the docket's <epoch>th change): only that count's adds.  schedule.lua and
-- the dead letters' replay refuse the others (refuse_closed): a partition
-- the new layout has not takes no task, one both layouts share only the new
-- count's (whose lookups by key look there).
--   'close'  -> 1 after closing it under the owner's lease; 0, and no
--               write, while it holds a task (scheduled, queued, handed
--               out or parked)
--   'undo'   -> 1 after removing the owner's lease; else 0
--   'seal'   -> seals it for this count and removes every lease (a change
--               under way loses its compare-and-set: the count changed),
--               unless it holds a seal of this epoch or a later one; 1, or
--               0 when it holds a task and no lease of the owner (a task
--               came in: the lease ran out first)
--   'unseal' -> 1 after giving a seal of another count, of this epoch or an
--               earlier one (a change away that was undone since), to this
--               count; else 0
local op, count, epoch, lease, owner = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), ARGV[7]
local ops = {close = true, undo = true, seal = true, unseal = true}
if not ops[op] or not string.match(count or '', '^%d+$') or not string.match(epoch or '', '^%d+$')
    or not lease or lease < 1 or not string.match(owner or '', '^[%w%-]*$') then
  error('docket: close takes close, undo, seal or unseal, a partition count, an epoch, '
        .. 'a lease in ms and an owner')
end
epoch = tonumber(epoch)
local key, leases, mine = P .. ':closed', P .. ':closing', count .. ':' .. owner
local function empty()
  return redis.call('XLEN', Q) + redis.call('ZCARD', DUE) + redis.call('SCARD', P .. ':parked') == 0
end
if op == 'close' then
  if not empty() then return 0 end
  redis.call('SADD', leases, mine)
  redis.call('PEXPIRE', leases, math.floor(lease))
  return 1
end
if op == 'undo' then
  return redis.call('SREM', leases, mine)
end
local current = redis.call('GET', key)
local sealed_for, sealed_at = nil, nil
if current then
  sealed_for, sealed_at = string.match(current, '^sealed:(%d+):(%d+)$')
  sealed_at = tonumber(sealed_at or '0')
end
if op == 'seal' then
  if sealed_at and sealed_at >= epoch then return 1 end
  local held = redis.call('SREM', leases, mine) == 1  -- (all go below)
  redis.call('SET', key, 'sealed:' .. count .. ':' .. epoch)
  redis.call('DEL', leases)
  if held or empty() then return 1 end
  return 0
end
if sealed_for and sealed_for ~= count and sealed_at <= epoch then
  redis.call('SET', key, 'sealed:' .. count .. ':' .. epoch)
  return 1
end
return 0
