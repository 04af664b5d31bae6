-- TakeSlot, step 1 of a scoped limit, in its namespace S (ARGV[1]): ARGV =
-- prefix, group, memo header, then the fields of one or more takes packed
-- into one argument (unpack_fields), 7 each: limit, holder, max, now,
-- stale_after, docket (the name of the delivery's docket), request number.
-- The consecutive takes of a flush in one scope go in one call.  For each:
-- keep (renewed) the holder's own slot, take a free one, or take over the
-- one whose holder renewed longest ago if that is stale_after or more ago;
-- when the limit is full, register the docket among the limit's waiting
-- dockets instead (S:stale:<limit>, docket -> when it first waited).  The
-- delivery is not looked at: the next step, in the docket's own slot, is.
-- Returns one 1 (acquired) or 0 (full) per take; a resend answers its first
-- outcome, except that an acquired slot is renewed to the resend's now, or
-- answers 2 (lost) when it was taken over meanwhile.
local function take(limit, holder, max, now, stale_after, docket)
  local slots = P .. ':slots:' .. limit
  local ttl = slot_ttl_ms(stale_after)
  local function hold()
    redis.call('ZADD', slots, now, holder)
    redis.call('PEXPIRE', slots, ttl)
    restale_waiting(P, limit)
    return 1
  end
  if redis.call('ZSCORE', slots, holder) then return hold() end
  if redis.call('ZCARD', slots) < tonumber(max) then return hold() end
  local cutoff = tonumber(now) - tonumber(stale_after)
  local stale = redis.call('ZRANGEBYSCORE', slots, '-inf', cutoff, 'LIMIT', 0, 1)
  if stale[1] then
    redis.call('ZREM', slots, stale[1])
    return hold()
  end
  local waiting = P .. ':stale:' .. limit
  redis.call('ZADD', waiting, 'NX', now, docket)
  redis.call('PEXPIRE', waiting, ttl)
  return 0
end
local f = unpack_fields(ARGV[4])
if #f % 7 ~= 0 then error('docket: take takes 7 fields a take') end
for i = 1, #f, 7 do  -- every input checked before the first write
  if not (tonumber(f[i + 2]) and tonumber(f[i + 3]) and tonumber(f[i + 4])) then
    error('docket: take takes numbers for max, now and stale_after')
  end
end
open_memo(ARGV[3])
local taken = {}
for i = 1, #f, 7 do
  local first = recall(f[i + 6])
  if first then
    taken[#taken + 1] = replay_slot(first, f[i], f[i + 1], f[i + 3])
  else
    taken[#taken + 1] = remember(f[i + 6], take(f[i], f[i + 1], f[i + 2], f[i + 3], f[i + 4],
                                                f[i + 5]))
  end
end
return taken
