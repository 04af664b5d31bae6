-- SlotStep (docket_core/sansio/local_slots.py), for limits of this docket's
-- own namespace P: ARGV = prefix, group, memo header, then the items of one
-- or more steps in one argument (unpack_batch), 21 fields an item, as
-- docket_core/lua/slot_steps.py lays them out: '1' (the first item of a
-- step) or '0' (the next take of the same step); the finish (id, key,
-- generation, state ('' without one), ttl, error, has_result, result); the
-- release (limit ('' without one), holder); a take (limit ('' without one),
-- holder, max, id, key, generation); stale_after, now, the request number,
-- renew ('1': a take that gets a slot has its delivery's lease renewed to
-- now; '0': a recent read handed it out, and its lease counts from that).
-- The consecutive steps of a flush go in one call.  Each
-- step, in order: records the run's end as finish.lua does; releases the
-- holder's slot as release.lua does (a holder whose slot was taken over
-- frees nothing; a freed slot queues the oldest live waiter of
-- P:wait:<limit>, else pops the docket that waited longest in
-- P:stale:<limit>), except that a freed slot nobody waits for in either is
-- left to the first take; then, for each take, claims its delivery as
-- claim.lua claims one (not the sender's: lost, nothing changed; a key
-- ended or at another generation: superseded, cancelled: cancelled; either
-- acknowledged) and, claimed, takes a slot for its holder as acquire.lua
-- does (its own, a free one, the one renewed longest ago if stale) and runs
-- the record on the sender, or parks the delivery as acquire.lua does; when
-- the release woke a waiter, the first take parks behind it.  Returns one {recorded, woken, wake, answer...} per
-- step: recorded -1 (no finish), 0 or 1 as finish.lua answers; woken and
-- wake as release.lua answers (0 and '' without a release); one answer a
-- take: 0 parked, 1 a slot, 2 lost, 3 superseded, 4 cancelled (TAKE_* in
-- local_slots.py).  Every input is checked before the first write.  A
-- resend answers its first outcome, except that a take that got a slot is
-- renewed to the resend's now with its delivery's lease, or answers lost
-- (2) if either was taken over meanwhile.  Which deliveries the sender
-- holds is read at once, and leases renewed and deliveries acknowledged at
-- the end, each in one command (as finish.lua and claim.lua do).

-- the deliveries this call settles (acknowledged at its end), and those
-- that took a slot (leases renewed at its end); held: the sender's
-- deliveries as read at the start
local acked, gone, taken, held = {}, {}, {}, {}

-- whether the sender holds delivery id (and this call did not settle it)
local function holds(id)
  if gone[id] then return false end
  return held[id] or holder_of(id) == WORKER
end

-- the run's end (as finish.lua's: record_end)
local function finish(f, now)
  local id, key, gen = f[1], f[2], f[3]
  -- a worker whose lease lapsed and was taken over leaves the run to the taker
  if WORKER and not held[id] and not gone[id] then
    local holder = holder_of(id)
    if holder and holder ~= WORKER then return 0 end
  end
  if id ~= '' and not gone[id] then
    acked[#acked + 1] = id
    gone[id] = true
  end
  return record_end(key, gen, f[4], now, f[5], f[6], f[7], f[8])
end

-- the holder's slot (keep in step with release.lua); hand_on: a take
-- follows, which takes a freed slot nobody else waits for.  Returns woken,
-- wake (as release.lua) and whether the slot went to a waiter
local function release(limit, holder, now)
  if redis.call('ZREM', P .. ':slots:' .. limit, holder) == 0 then return 0, '', false end
  local waiting = P .. ':stale:' .. limit
  if redis.call('EXISTS', wait_key(P, limit), waiting) == 0 then
    -- nobody waits (a list or a zset that exists is never empty)
    return 0, '', false
  end
  if wake(limit, now) == 1 then return 1, '', true end
  local docket = pop_oldest(waiting)
  if docket then return 0, docket, true end
  return 0, '', false
end

-- the running state event's JSON up to its key, made once a `now`
local heads = {}

-- whether a limit of P may have waiters (P:stale lists them): a take renews
-- a limit's stale time only then
local maybe_waiting = nil

-- claim the delivery of take t, then take a slot or park it (keep in step
-- with claim.lua and acquire.lua); returns its answer
local PARKED, SLOT, LOST, SUPERSEDED, CANCELLED = 0, 1, 2, 3, 4
local function claim_and_take(t, s, park)
  local limit, id, key, now = t.limit, t.id, t.key, s.now
  if not holds(id) then return LOST end
  local run = run_key(key)
  local r = redis.call('HMGET', run, 'state', 'g', 'cancel', 'parked', 'pin')
  local answer = nil
  if r[1] == 'cancelled' then
    answer = CANCELLED
  elseif not r[1] or tonumber(r[2]) ~= t.gen or not LIVE[r[1]] then
    -- superseded, or this generation already ran to its end (an earlier copy)
    answer = SUPERSEDED
  elseif r[3] then
    -- cancelled while it ran, and its worker never recorded the end
    cancel_key(key, now, r[3])
    answer = CANCELLED
  end
  if answer then
    acked[#acked + 1] = id
    gone[id] = true
    return answer
  end
  local slots, holder = P .. ':slots:' .. limit, t.holder
  local take = false
  if not park then
    take = redis.call('ZCARD', slots) < t.max or redis.call('ZSCORE', slots, holder)
    if not take then
      local cutoff = tonumber(now) - tonumber(s.stale)
      local stale = redis.call('ZRANGEBYSCORE', slots, '-inf', cutoff, 'LIMIT', 0, 1)
      if stale[1] then
        redis.call('ZREM', slots, stale[1])
        take = true
      end
    end
  end
  if take then
    redis.call('ZADD', slots, now, holder)
    redis.call('PEXPIRE', slots, slot_ttl_ms(s.stale))
    if maybe_waiting == nil then maybe_waiting = redis.call('EXISTS', P .. ':stale') == 1 end
    if maybe_waiting then restale_waiting(P, limit) end
    if s.renew then taken[#taken + 1] = id end
    local head = heads[now]
    if head == nil then
      head = running_head(WORKER, now)
      heads[now] = head
    end
    mark_running(run, key, WORKER, now, false, head)
    return SLOT
  end
  -- park: the delivery is acknowledged and the key waits at the tail
  acked[#acked + 1] = id
  gone[id] = true
  redis.call('HDEL', run, 'sid')
  if not (r[4] == limit and (r[5] or P) == P) then
    redis.call('RPUSH', wait_key(P, limit), waiter(P, key))
    restale(P, limit)
    maybe_waiting = true
    redis.call('SADD', P .. ':parked', key)
    redis.call('HSET', run, 'state', 'scheduled', 'parked', limit, 'pin', P)
    redis.call('HDEL', run, 'worker', 'started')
    redis.call('DEL', prog_key(key))
    publish(key, {type = 'state', state = 'scheduled'})
  end
  return PARKED
end

local function step(s)
  local now = s.now
  local reply = {-1, 0, ''}
  if s.finish then reply[1] = finish(s.finish, now) end
  local handed = false
  if s.release then reply[2], reply[3], handed = release(s.release[1], s.release[2], now) end
  for i, t in ipairs(s.takes) do reply[3 + i] = claim_and_take(t, s, i == 1 and handed) end
  return reply
end

-- a resent step whose first answer was first: a take that got a slot is
-- renewed with its delivery's lease, or lost
local function replay(s, first)
  for i, t in ipairs(s.takes) do
    if first[3 + i] == SLOT then
      if not holds(t.id) then
        first[3 + i] = LOST
      else
        taken[#taken + 1] = t.id
        first[3 + i] = replay_slot(1, t.limit, t.holder, s.now)
      end
    end
  end
  return first
end

-- check every input before the first write
local steps, ids, seqs = {}, {}, {}
for _, f in ipairs(unpack_batch(ARGV[4], 21)) do
  if f[1] == '1' or #steps == 0 then
    local s = {stale = f[18], now = f[19], seq = f[20], renew = f[21] == '1', takes = {}}
    if not (tonumber(s.now) and tonumber(s.stale)) then
      error('docket: step takes numbers for stale_after and now')
    end
    if f[21] ~= '1' and f[21] ~= '0' then error('docket: step takes renew 1 or 0') end
    if f[5] ~= '' then
      s.finish = {f[2], f[3], tonumber(f[4]), f[5], f[6], f[7], f[8], f[9]}
      if not (s.finish[3] and tonumber(f[6])) then error('docket: step: malformed finish') end
      ids[#ids + 1] = f[2]
    end
    if f[10] ~= '' then s.release = {f[10], f[11]} end
    steps[#steps + 1] = s
    seqs[#seqs + 1] = s.seq
  end
  if f[12] ~= '' then
    local t = {limit = f[12], holder = f[13], max = tonumber(f[14]), id = f[15], key = f[16],
               gen = tonumber(f[17])}
    if not (t.max and t.gen) then error('docket: step: malformed take') end
    -- (the sender, WORKER, comes with the memo header)
    if ARGV[3] == '' then error('docket: step: a take needs a request') end
    local takes = steps[#steps].takes
    takes[#takes + 1] = t
    ids[#ids + 1] = t.id
  end
end
open_memo(ARGV[3])
local firsts = recall_all(seqs)
if WORKER then held = held_by(WORKER, ids) end
local replies = {}
for i, s in ipairs(steps) do
  local first = firsts[s.seq]
  if first then
    first = replay(s, first)
  else
    first = remember_later(s.seq, step(s))
    if MEMO and s.seq ~= '' then firsts[s.seq] = first end
  end
  replies[i] = first
end
for i = 1, #taken, 1000 do
  local renew = {Q, GROUP, WORKER, 0}
  for j = i, math.min(i + 999, #taken) do renew[#renew + 1] = taken[j] end
  renew[#renew + 1] = 'JUSTID'
  redis.call('XCLAIM', unpack(renew))
end
acknowledge_all(acked)
remember_all()
return replies
