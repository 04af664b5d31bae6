-- AcquireSlot, for a limit without a scope (its slots and waiters live in
-- this docket's namespace, P; a scoped limit takes the chain of take.lua):
-- ARGV = prefix, group, memo header, then the fields of one or more
-- acquisitions packed into one argument (unpack_fields), 10 each: limit,
-- holder, max, now, stale_after, id, key, generation, namespace (P: the
-- prefix this call runs in), request number.  The
-- consecutive acquisitions of a flush go in one call.  Returns one 1
-- (acquired) or 0 (parked) per acquisition; a resend answers its first
-- outcome, except that an acquired slot is renewed to the resend's now, or
-- answers 2 (lost) if it was taken over meanwhile.  A delivery its sender
-- no longer holds answers 2 too.
local function acquire(limit, holder, max, now, stale_after, id, key, gen, now_text)
  -- a delivery another worker took over, or none holds (a send forgotten
  -- since parked and acknowledged it), is not admitted here
  if WORKER and holder_of(id) ~= WORKER then return 2 end
  local slots = P .. ':slots:' .. limit
  local function take()
    redis.call('ZADD', slots, now, holder)
    redis.call('PEXPIRE', slots, slot_ttl_ms(stale_after))
    restale_waiting(P, limit)
    return 1
  end
  if redis.call('ZSCORE', slots, holder) then return take() end
  if redis.call('ZCARD', slots) < max then return take() end
  local stale = redis.call('ZRANGEBYSCORE', slots, '-inf', now - stale_after, 'LIMIT', 0, 1)
  if stale[1] then
    redis.call('ZREM', slots, stale[1])
    return take()
  end
  -- park: the delivery is acknowledged and the key waits at the tail
  acknowledge(id)
  local run = run_key(key)
  local r = redis.call('HMGET', run, 'g', 'parked', 'pin', 'cancel')
  if tonumber(r[1] or '-1') == tonumber(gen) and r[4] then
    -- cancelled since its claim: it never waits, it concludes cancelled
    cancel_key(key, now_text, r[4])
  elseif tonumber(r[1] or '-1') == tonumber(gen) and not (r[2] == limit and r[3] == P) then
    redis.call('RPUSH', wait_key(P, limit), waiter(P, key))
    restale(P, limit)
    redis.call('SADD', P .. ':parked', key)
    redis.call('HSET', run, 'state', 'scheduled', 'parked', limit, 'pin', P)
    redis.call('HDEL', run, 'worker', 'started')
    redis.call('DEL', prog_key(key))
    publish(key, {type = 'state', state = 'scheduled'})
  end
  return 0
end
local f = unpack_fields(ARGV[4])
if #f % 10 ~= 0 then error('docket: acquire takes 10 fields an acquisition') end
for i = 9, #f, 10 do
  if f[i] ~= P then error('docket: acquire takes limits of its own namespace only') end
end
open_memo(ARGV[3])
local acquired = {}
for i = 1, #f, 10 do
  local first = recall(f[i + 9])
  if first then
    acquired[#acquired + 1] = replay_slot(first, f[i], f[i + 1], tonumber(f[i + 3]))
  else
    acquired[#acquired + 1] = remember(f[i + 9], acquire(
      f[i], f[i + 1], tonumber(f[i + 2]), tonumber(f[i + 3]), tonumber(f[i + 4]), f[i + 5],
      f[i + 6], f[i + 7], f[i + 3]))
  end
end
return acquired
