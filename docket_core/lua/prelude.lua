-- Shared by every docket script (prepended to each).  ARGV[1] is always the
-- key prefix (the hash tag the call runs in: a docket's "{name}", or a
-- scope's "{scope}"), ARGV[2] the consumer group.  A script touches only
-- keys that start with its prefix, so all of them hash to one cluster slot;
-- per-task keys are derived here from the prefix.  Every call declares
-- KEYS = P:q, P:fence, and nothing ever writes P:fence: on a cluster, while
-- the slot moves, the server answers the whole call TRYAGAIN (or ASK), so
-- no script runs on half a slot.
local P = ARGV[1]
local GROUP = ARGV[2]
local Q = P .. ':q'
local DUE = P .. ':due'
-- wake-up entries for blocked readers live apart from the queue, so they
-- never count as messages nor against a read's count
local WAKE = P .. ':wake'
-- the dead-letter stream keeps about this many entries (the newest)
local DEAD_LETTER_LIMIT = 10000

-- the fields of a batch, sent as one argument: "<length>:<bytes>" each
local function unpack_fields(blob)
  local out, position, size = {}, 1, #blob
  while position <= size do
    local colon = string.find(blob, ':', position, true)
    local length = tonumber(string.sub(blob, position, colon - 1))
    out[#out + 1] = string.sub(blob, colon + 1, colon + length)
    position = colon + length + 1
  end
  return out
end
-- the items of a hot batch (finish, schedule), `per` fields an item, sent
-- as one argument in the faster form (protocol.pack_batch): each field its
-- length (4 bytes, little-endian) then its bytes, read by one struct.unpack
-- an item.  Returns the list of items, each the list of its fields; a
-- malformed batch is an error (before the caller's first write)
local function unpack_batch(blob, per)
  local format, items, position, size = '<' .. string.rep('I4c0', per), {}, 1, #blob
  while position <= size do
    local item = {struct.unpack(format, blob, position)}
    position = item[per + 1]
    item[per + 1] = nil
    items[#items + 1] = item
  end
  return items
end

-- Outcomes kept for resends (docket_core.sansio.effects.Request).  A script
-- that remembers takes ARGV[3] = floor, remember_ms, worker and origin packed
-- as a batch's fields are ('' for an effect nobody resends), and each
-- effect's request number with its fields.  The hash P:did:<origin> maps
-- request numbers to JSON outcomes; numbers below the floor (their replies
-- arrived) are dropped, and the whole hash expires remember_ms after the
-- origin's last remembered call.  WORKER is the sender's consumer name: an
-- effect on a delivery that another worker holds now changes nothing.
local MEMO, WORKER = false, false
local function open_memo(header)
  if header == '' then return end
  local h = unpack_fields(header)
  local floor, ttl, origin = tonumber(h[1]), tonumber(h[2]), h[4]
  if #h ~= 4 or not floor or not ttl or origin == '' then
    error('docket: malformed memo header')
  end
  WORKER = h[3]
  MEMO = P .. ':did:' .. origin
  local old = tonumber(redis.call('HGET', MEMO, '_floor') or floor)
  if floor - old > 10000 then
    redis.call('DEL', MEMO)
  elseif old < floor then
    local dead = {}
    for seq = old, floor - 1 do
      dead[#dead + 1] = seq
      if #dead == 500 or seq == floor - 1 then
        redis.call('HDEL', MEMO, unpack(dead))
        dead = {}
      end
    end
  end
  redis.call('HSET', MEMO, '_floor', floor)
  redis.call('PEXPIRE', MEMO, ttl)
end
-- the first outcome of request seq, or nil
local function recall(seq)
  if not MEMO or seq == '' then return nil end
  local first = redis.call('HGET', MEMO, seq)
  if first then return cjson.decode(first) end
  return nil
end
local function remember(seq, outcome)
  if MEMO and seq ~= '' then redis.call('HSET', MEMO, seq, cjson.encode(outcome)) end
  return outcome
end
-- A batch reads and writes its outcomes in one command each: recall_all
-- answers seq -> first outcome for the numbers of `seqs` remembered before
-- (the batch adds each outcome it decides, so a number it holds twice is
-- decided once), remember_later queues what remember writes, and
-- remember_all writes the queue
local function recall_all(seqs)
  local found, asked = {}, {}
  if not MEMO then return found end
  for _, seq in ipairs(seqs) do
    if seq ~= '' then asked[#asked + 1] = seq end
  end
  for i = 1, #asked, 1000 do
    local last = math.min(i + 999, #asked)
    local firsts = redis.call('HMGET', MEMO, unpack(asked, i, last))
    for j = i, last do
      local first = firsts[j - i + 1]
      if first then found[asked[j]] = cjson.decode(first) end
    end
  end
  return found
end
local LATER = {}
local function remember_later(seq, outcome)
  if MEMO and seq ~= '' then
    LATER[#LATER + 1] = seq
    LATER[#LATER + 1] = cjson.encode(outcome)
  end
  return outcome
end
local function remember_all()
  for i = 1, #LATER, 1000 do
    redis.call('HSET', MEMO, unpack(LATER, i, math.min(i + 999, #LATER)))
  end
  LATER = {}
end

-- refuse to add tasks to a partition closed by a change of the docket's
-- partition count (close.lua), before any write.  P:closing holds the
-- leases of the changes under way ('<count>:<owner>'): no add until one is
-- recorded and the partition sealed.  P:closed names the count it went to
-- ('sealed:<count>:<epoch>'): only its producers add (`count`: the
-- producer's, as a string).  (An older store kept 'lease:<count>' there.)
local function check_count(count)
  if not string.match(count or '', '^%d+$') then
    error('docket: an add names the partition count of its producer')
  end
end
local function refuse_closed(count)
  check_count(count)
  -- (one command when neither is there: every add pays for this)
  if redis.call('EXISTS', P .. ':closing', P .. ':closed') == 0 then return end
  local state, to = 'lease', nil
  local lease = redis.call('SRANDMEMBER', P .. ':closing')
  if lease then
    to = string.match(lease, '^(%d+):')
  else
    local closed = redis.call('GET', P .. ':closed')
    if not closed then return end
    state, to = string.match(closed, '^(%a+):(%d+)')
    if state == 'sealed' and to == count then return end
  end
  if state == 'sealed' then
    error('docket: ' .. P .. ' is closed: the docket has ' .. tostring(to)
          .. ' partitions now; open it with partitions=' .. tostring(to))
  end
  error('docket: ' .. P .. ' is closed while the docket changes to ' .. tostring(to)
        .. ' partitions; open it with partitions=' .. tostring(to))
end
local function run_key(key) return P .. ':run:' .. key end
local function msg_key(key) return P .. ':msg:' .. key end
local function prog_key(key) return P .. ':prog:' .. key end

-- Concurrency slots live in a namespace S: the docket's own prefix for a
-- limit without a scope (acquire.lua, release.lua: S is P), or "{scope}"
-- for a limit whose scope dockets share (the chain of take.lua, confirm.lua
-- or park.lua, release.lua, wake.lua, enlist.lua: each step in one slot).
-- A limit without a scope parks its keys in P:wait:<limit> (a list of
-- entries naming the docket's prefix and the key, packed as a batch's
-- fields are: an older docket also kept other dockets' keys there); a
-- scoped one in P:waiters:<S>|<limit> (zset key -> when it parked; not in
-- P:parked: its message waits in P:due at its retry time, and counts there),
-- and registers P among the limit's waiting dockets, S:stale:<limit>.
local function wait_key(S, limit) return S .. ':wait:' .. limit end
local function waiters_key(S, limit) return P .. ':waiters:' .. S .. '|' .. limit end
local function waiter(prefix, key) return #prefix .. ':' .. prefix .. #key .. ':' .. key end
local function waiter_of(entry)
  local fields = unpack_fields(entry)
  return fields[1], fields[2]
end
-- a slot set (and a scoped limit's waiting dockets) outlives its holders'
-- renewals by far (they renew every stale_after / 4), and at least a minute
local function slot_ttl_ms(stale_after)
  return math.floor(math.max(tonumber(stale_after) * 4, 60) * 1000)
end
-- pop the member of zset `key` with the lowest score (ties: the smallest
-- member), as ZPOPMIN does; returns the member and its score, or false
local function pop_oldest(key)
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if not oldest[1] then return false end
  redis.call('ZREM', key, oldest[1])
  return oldest[1], oldest[2]
end
-- take a parked key off its limit's waiters (its record's parked and pin:
-- the limit and its namespace); a key parked behind a limit of this
-- docket's own namespace may wait in either structure, one of another
-- namespace only in P:waiters (its S:wait is another slot's key)
local function unpark(key, run, limit, S)
  S = S or P
  if S == P then
    redis.call('LREM', wait_key(P, limit), 0, waiter(P, key))
    if redis.call('EXISTS', wait_key(P, limit)) == 0 then
      -- its last waiter: the limit leaves the index of waiting limits (a
      -- release with nobody waiting does not look there)
      redis.call('ZREM', P .. ':stale', limit)
      redis.call('HDEL', P .. ':woken', limit)
    end
  end
  redis.call('ZREM', waiters_key(S, limit), key)
  redis.call('HDEL', run, 'parked', 'pin')
  redis.call('SREM', P .. ':parked', key)
end

-- the wake stream and its consumer group (a blocked read names both streams);
-- with repair, also a group someone removed from a stream that is still there
local function wake_group(repair)
  if redis.call('EXISTS', WAKE) == 0 then
    redis.call('XGROUP', 'CREATE', WAKE, GROUP, '$', 'MKSTREAM')
  elseif repair then
    pcall(redis.call, 'XGROUP', 'CREATE', WAKE, GROUP, '$')
  end
end

local function publish(key, event)
  event['key'] = key
  redis.call('PUBLISH', P .. ':events:' .. key, cjson.encode(event))
end

-- The hot scripts (claim, finish) publish a state event a task, and cjson's
-- walk of a table costs more than the PUBLISH: they make the JSON by hand.
-- state_head(state, at, time) is an event's JSON up to its key: state, the
-- time field `at` (started_at, completed_at) and `time` written as cjson
-- writes a number (14 significant digits); nil when `time` is no number, for
-- publish to encode.  publish_head ends it with the key, or (head nil)
-- publishes `event` as publish does.
local STATE_JSON = {}
local function state_head(state, at, time, more)
  local number = tonumber(time)
  if not number or number ~= number or number == math.huge or number == -math.huge then
    return nil
  end
  local quoted = STATE_JSON[state]
  if not quoted then
    quoted = cjson.encode(state)
    STATE_JSON[state] = quoted
  end
  return '{"type":"state","state":' .. quoted .. (more or '') .. ',"' .. at .. '":'
    .. string.format('%.14g', number) .. ',"key":'
end
local function publish_head(key, head, event)
  if head then
    redis.call('PUBLISH', P .. ':events:' .. key, head .. cjson.encode(key) .. '}')
  else
    publish(key, event)
  end
end

-- queue a message now: XADD it and remember its entry id on the record.  A
-- field missing (a hash that was not ours) is left out, never an error after
-- the caller's first write: the worker that reads the entry sets it aside.
-- `also` (optional): more fields and values for the record, written with
-- its state in one command
local function enqueue(key, fn, payload, when, attempt, gen, also)
  local sid
  if fn and payload and when and attempt and gen then
    sid = redis.call('XADD', Q, '*', 'k', key, 'f', fn, 'p', payload,
                     'w', when, 'a', attempt, 'g', gen)
  else
    local fields, values = {'k', key}, {fn, payload, when, attempt, gen}
    for i, name in ipairs({'f', 'p', 'w', 'a', 'g'}) do
      if values[i] then
        fields[#fields + 1] = name
        fields[#fields + 1] = values[i]
      end
    end
    sid = redis.call('XADD', Q, '*', unpack(fields))
  end
  if also then
    also[#also + 1] = 'state'
    also[#also + 1] = 'queued'
    also[#also + 1] = 'sid'
    also[#also + 1] = sid
    redis.call('HSET', run_key(key), unpack(also))
  else
    redis.call('HSET', run_key(key), 'state', 'queued', 'sid', sid)
  end
  publish_head(key, state_head('queued', 'when', when or ''),
               {type = 'state', state = 'queued', when = tonumber(when or '')})
  return sid
end

-- the consumer that holds a delivery, or false (also when the stream or its
-- group vanished: nobody holds anything then; the next read recreates them)
local function holder_of(id)
  local ok, pending = pcall(redis.call, 'XPENDING', Q, GROUP, id, id, 1)
  if ok and pending[1] then return pending[1][2] end
  return false
end
-- a stream entry id as its two numbers (ms, seq), or nil
local function id_parts(id)
  local dash = string.find(id, '-', 1, true)
  local ms = dash and tonumber(string.sub(id, 1, dash - 1))
  local seq = dash and tonumber(string.sub(id, dash + 1))
  if ms and seq and ms < 2^53 and seq < 2^53 then return ms, seq end
  return nil
end
-- the ids of `ids` that consumer `worker` holds, each mapped to how many
-- times the store handed it out, from one read of its deliveries between
-- the lowest and the highest of them.  One it holds
-- may be missing (a read of at most #ids + 100 entries did not reach it, or
-- an id is malformed): callers ask holder_of about the ids the set lacks
local function held_by(worker, ids)
  local held, low, high, lows, highs = {}, nil, nil, nil, nil
  for _, id in ipairs(ids) do
    local ms, seq = id_parts(id)
    if ms then
      if not low or ms < low[1] or (ms == low[1] and seq < low[2]) then low, lows = {ms, seq}, id end
      if not high or ms > high[1] or (ms == high[1] and seq > high[2]) then
        high, highs = {ms, seq}, id
      end
    end
  end
  if not low then return held end
  local ok, pending = pcall(redis.call, 'XPENDING', Q, GROUP, lows, highs, #ids + 100, worker)
  if ok then
    for _, entry in ipairs(pending) do held[entry[1]] = tonumber(entry[4]) or 2 end
  end
  return held
end

-- a claimed delivery's record: running on `worker` since `now`, its
-- progress reset, and the state published (claim.lua, step.lua).  A run's
-- progress hash is made by its first report (progress.lua): until then a
-- running record reads as progress 0 of 100 (inspect.lua's 'progress'),
-- so a claim writes no progress, and a reset is a DEL.  `fresh`: the
-- delivery was handed out once (its key's progress was cleared when it was
-- queued), and its run may have started with the claim and reported
-- progress already: that progress stays.  (Making the hash at every claim
-- and deleting it at every end cost a no-op drain a quarter of its server
-- time.)
-- `head` (optional): running_head(worker, now), made once for a batch
local function running_head(worker, now)
  return state_head('running', 'started_at', now, ',"worker":' .. cjson.encode(worker))
end
-- The record keeps the id of the message claimed ('sid'), which a run's
-- end acknowledges: unqueue finds it held, or gone (one command a claim
-- fewer than an HDEL).
local function mark_running(run, key, worker, now, fresh, head)
  redis.call('HSET', run, 'state', 'running', 'worker', worker, 'started', now)
  if not fresh then redis.call('DEL', prog_key(key)) end
  head = head or running_head(worker, now)
  if head then
    publish_head(key, head)
  else
    publish(key, {type = 'state', state = 'running', worker = worker, started_at = tonumber(now)})
  end
end

-- remove the key's scheduled or queued (not yet delivered) message: one
-- handed to a worker stays with it (a claimed one's run acknowledges it; a
-- claim answers cancelled or superseded and acknowledges it); `acked`
-- (optional): an entry the caller acknowledged already
local function unqueue(key, acked)
  local run = run_key(key)
  local sid = redis.call('HGET', run, 'sid')
  if sid then
    if sid ~= acked and not holder_of(sid) then redis.call('XDEL', Q, sid) end
    redis.call('HDEL', run, 'sid')
  end
  redis.call('ZREM', DUE, key)
  redis.call('DEL', msg_key(key))
  local parked = redis.call('HMGET', run, 'parked', 'pin')
  if parked[1] then unpark(key, run, parked[1], parked[2]) end
end

local function acknowledge(id)
  if id and id ~= '' then
    redis.call('XACK', Q, GROUP, id)
    redis.call('XDEL', Q, id)
  end
end
-- The lowest entry the queue must keep, as (ms, seq), or nil (keep all):
-- the oldest delivery still pending.  Every entry below it was handed out
-- (the group hands entries out in order) and acknowledged, and docket
-- deletes every entry it acknowledges: a trim to it deletes nothing an XDEL
-- would not.  With none pending, nil: a trim would have to know which
-- entries the group has yet to hand out.
local function keep_from()
  -- (the oldest entry of the pending list: its summary form would walk
  -- every consumer the group ever had)
  local ok, oldest = pcall(redis.call, 'XPENDING', Q, GROUP, '-', '+', 1)
  if ok and oldest[1] then return id_parts(oldest[1][1]) end
  return nil
end
-- acknowledge several deliveries, a thousand a command.  They are deleted
-- by trimming the queue to the first entry it must keep (whole nodes of
-- the stream at a time), and those at or above it by XDEL (which looks each
-- id up in its node: several times a trim's cost an entry)
local function acknowledge_all(ids)
  if #ids == 0 then return end
  for i = 1, #ids, 1000 do
    redis.call('XACK', Q, GROUP, unpack(ids, i, math.min(i + 999, #ids)))
  end
  local keep_ms, keep_seq = keep_from()
  local rest = ids
  -- (an ACL from before docket trimmed, without XTRIM, deletes by XDEL alone)
  if keep_ms and pcall(redis.call, 'XTRIM', Q, 'MINID',
                       string.format('%d-%d', keep_ms, keep_seq)) then
    rest = {}
    for _, id in ipairs(ids) do
      local ms, seq = id_parts(id)
      if not ms or ms > keep_ms or (ms == keep_ms and seq >= keep_seq) then
        rest[#rest + 1] = id
      end
    end
  end
  for i = 1, #rest, 1000 do
    redis.call('XDEL', Q, unpack(rest, i, math.min(i + 999, #rest)))
  end
end

-- whether another worker than the sender (WORKER) holds the delivery now:
-- its lease lapsed and was taken over, and the taker's run decides
local function taken_over(id)
  if not WORKER then return false end
  local holder = holder_of(id)
  return holder and holder ~= WORKER
end

-- an ended record: its progress goes, and the scoped slot its run held
-- (ConfirmSlot's 'slot' and 'pin'); the record lives ttl seconds more.
-- `forget` (optional): one more field of the record to remove with those
-- `bare`: the caller knows the record has none of those fields, nor the
-- mark 'prog' (progress.lua's: the run reported progress), and so that the
-- key has no progress to delete
local function conclude(key, ttl, forget, bare)
  local run = run_key(key)
  if not bare then redis.call('DEL', prog_key(key)) end
  if tonumber(ttl) > 0 then
    if not bare then redis.call('HDEL', run, 'slot', 'pin', 'prog', forget or 'slot') end
    redis.call('PEXPIRE', run, math.floor(tonumber(ttl) * 1000))
  else
    redis.call('DEL', run)
  end
end

-- a run's end (finish.lua, step.lua): recorded only if generation `gen` is
-- still the record's; then its state, completion time, error and result are
-- written, the record concluded and the state published.  Returns 1
-- (recorded) or 0
local function record_end(key, gen, state, now, ttl, err, has_result, result)
  local run = run_key(key)
  local record = redis.call('HMGET', run, 'g', 'slot', 'pin', 'cancel', 'prog')
  if tonumber(record[1] or '-1') ~= gen then return 0 end
  if err ~= '' then
    if has_result == '1' then
      redis.call('HSET', run, 'state', state, 'completed', now, 'error', err, 'result', result)
    else
      redis.call('HSET', run, 'state', state, 'completed', now, 'error', err)
    end
  elseif has_result == '1' then
    redis.call('HSET', run, 'state', state, 'completed', now, 'result', result)
  else
    redis.call('HSET', run, 'state', state, 'completed', now)
  end
  conclude(key, ttl, 'cancel', not (record[2] or record[3] or record[4] or record[5]))
  local head = err == '' and state_head(state, 'completed_at', now) or nil
  if head then
    publish_head(key, head)
  else
    local event = {type = 'state', state = state, completed_at = tonumber(now)}
    if err ~= '' then event['error'] = err end
    publish(key, event)
  end
  return 1
end

local LIVE = {scheduled = true, queued = true, running = true}

-- generations come from one docket-wide counter: never reused, even after a
-- record was deleted (execution_ttl=0) or expired
local function next_generation()
  return redis.call('INCR', P .. ':generation')
end

-- conclude a key that has a record as `state` ('cancelled' unless given,
-- with `err` if any): remove its message, give it a new generation (no copy
-- in flight may start), record and publish the end; returns the new
-- generation.  A running record's 'cancel' field (the ttl a cancel gave
-- while it ran: its run records its own end, and nothing follows it) goes.
local function cancel_key(key, now, ttl, state, err)
  state = state or 'cancelled'
  unqueue(key)
  local run = run_key(key)
  local gen = next_generation()
  local event = {type = 'state', state = state, completed_at = tonumber(now)}
  if err and err ~= '' then
    redis.call('HSET', run, 'g', gen, 'state', state, 'completed', now, 'error', err)
    event['error'] = err
  else
    redis.call('HSET', run, 'g', gen, 'state', state, 'completed', now)
  end
  conclude(key, ttl, 'cancel')
  publish(key, event)
  return gen
end

-- S:stale holds the limits of S that have waiters, each scored with the time
-- its next stale slot is measured from: the oldest renewal of its slots or,
-- while nobody holds one, when its last waiter was woken (0: never).  A read
-- looks only at the limits scored at or before its cutoff (read.lua).  Every
-- change to a waiting limit's slots or woken time calls restale.
local function restale(S, limit)
  local oldest = redis.call('ZRANGE', S .. ':slots:' .. limit, 0, 0, 'WITHSCORES')[2]
  local at = oldest or redis.call('HGET', S .. ':woken', limit) or 0
  redis.call('ZADD', S .. ':stale', at, limit)
end
-- restale, if the limit has waiters
local function restale_waiting(S, limit)
  if redis.call('ZSCORE', S .. ':stale', limit) then restale(S, limit) end
end

-- renew the slots named by the (limit, holder) pairs of ARGV from index
-- `from` on, in this namespace, to now: each slot set (and the limit's
-- waiting dockets) then lives slot_ttl ms more.  Returns the holders whose
-- slots are gone (taken over as stale)
local function renew_slots(from, now, slot_ttl)
  local lost = {}
  for i = from, #ARGV, 2 do
    local limit, holder = ARGV[i], ARGV[i + 1]
    local slots = P .. ':slots:' .. limit
    if redis.call('ZSCORE', slots, holder) then
      redis.call('ZADD', slots, now, holder)
      redis.call('PEXPIRE', slots, slot_ttl)
      redis.call('PEXPIRE', P .. ':stale:' .. limit, slot_ttl)
      restale_waiting(P, limit)
    else
      lost[#lost + 1] = holder
    end
  end
  return lost
end

-- queue the oldest live waiter of a limit without a scope (its namespace is
-- P); returns 1 if one woke.  An entry of another docket (an older docket
-- parked scoped keys here) lives in another slot: it is dropped
local function wake(limit, now)
  local waiting = wait_key(P, limit)
  while true do
    local entry = redis.call('LPOP', waiting)
    if not entry then
      redis.call('ZREM', P .. ':stale', limit)
      redis.call('HDEL', P .. ':woken', limit)
      return 0
    end
    local p, key = waiter_of(entry)
    local run = p == P and run_key(key)
    local r = run and redis.call('HMGET', run, 'state', 'parked', 'pin', 'f', 'p', 'w', 'a', 'g')
    if r and r[1] == 'scheduled' and r[2] == limit and (r[3] or P) == P then
      redis.call('HDEL', run, 'parked', 'pin')
      redis.call('SREM', P .. ':parked', key)
      local when = r[6]
      if (tonumber(when or '') or 0) > tonumber(now) then when = now end
      enqueue(key, r[4], r[5], when, r[7], r[8])
      if redis.call('LLEN', waiting) == 0 then
        redis.call('ZREM', P .. ':stale', limit)
        redis.call('HDEL', P .. ':woken', limit)
      else
        redis.call('HSET', P .. ':woken', limit, now)
        restale(P, limit)
      end
      return 1
    end
  end
end

-- a new soonest scheduled message (the head of P:due was `before`: ZRANGE
-- 0 0 WITHSCORES): wake one blocked reader so it re-arms its timer (the wake
-- stream keeps one entry: a reader woken takes the soonest due time from its
-- next read, so wake-ups nobody has read yet add nothing)
local function rearm(before)
  local after = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  if after[1] and (not before[1] or after[1] ~= before[1] or after[2] ~= before[2]) then
    wake_group(false)
    redis.call('XADD', WAKE, 'MAXLEN', 1, '*', 'wake', '1')
  end
end

-- a resent slot acquisition (acquire, take) whose first answer was ``first``:
-- one that acquired (1) renews the slot to the resend's ``now`` if ``holder``
-- still holds it, else answers lost (2); any other answer stands
local function replay_slot(first, limit, holder, now)
  if first ~= 1 then return first end
  local slots = P .. ':slots:' .. limit
  if not redis.call('ZSCORE', slots, holder) then return 2 end
  redis.call('ZADD', slots, now, holder)
  restale_waiting(P, limit)
  return 1
end
