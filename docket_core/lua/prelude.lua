-- Shared by every docket script (prepended to each).  ARGV[1] is always the
-- key prefix (the docket's hash tag, "{name}"), ARGV[2] the consumer group.
-- Every key of a docket starts with the prefix, so all of them hash to one
-- cluster slot; per-task keys are derived here from the prefix.
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

local function run_key(key) return P .. ':run:' .. key end
local function msg_key(key) return P .. ':msg:' .. key end
local function prog_key(key) return P .. ':prog:' .. key end

-- Concurrency slots and waiters live in a namespace S: the docket's own
-- prefix, or "{scope}" for a limit whose scope dockets share.  A waiter entry
-- names its docket's prefix too, since a release in one docket may wake a
-- task of another: the fields prefix and key, packed as a batch's are.
local function wait_key(S, limit) return S .. ':wait:' .. limit end
local function waiter(prefix, key) return #prefix .. ':' .. prefix .. #key .. ':' .. key end
local function waiter_of(entry)
  local fields = unpack_fields(entry)
  return fields[1], fields[2]
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

-- p: the prefix of the docket the key belongs to (P unless given)
local function publish(key, event, p)
  event['key'] = key
  redis.call('PUBLISH', (p or P) .. ':events:' .. key, cjson.encode(event))
end

-- queue a message now: XADD it and remember its entry id on the record.  A
-- field missing (a hash that was not ours) is left out, never an error after
-- the caller's first write: the worker that reads the entry sets it aside
local function enqueue(key, fn, payload, when, attempt, gen, p)
  p = p or P
  local sid
  if fn and payload and when and attempt and gen then
    sid = redis.call('XADD', p .. ':q', '*', 'k', key, 'f', fn, 'p', payload,
                     'w', when, 'a', attempt, 'g', gen)
  else
    local fields, values = {'k', key}, {fn, payload, when, attempt, gen}
    for i, name in ipairs({'f', 'p', 'w', 'a', 'g'}) do
      if values[i] then
        fields[#fields + 1] = name
        fields[#fields + 1] = values[i]
      end
    end
    sid = redis.call('XADD', p .. ':q', '*', unpack(fields))
  end
  redis.call('HSET', p .. ':run:' .. key, 'state', 'queued', 'sid', sid)
  publish(key, {type = 'state', state = 'queued', when = tonumber(when or '')}, p)
  return sid
end

-- the consumer that holds a delivery, or false (also when the stream or its
-- group vanished: nobody holds anything then; the next read recreates them)
local function holder_of(id)
  local ok, pending = pcall(redis.call, 'XPENDING', Q, GROUP, id, id, 1)
  if ok and pending[1] then return pending[1][2] end
  return false
end

-- remove the key's scheduled or queued (not yet delivered) message
local function unqueue(key)
  local run = run_key(key)
  local sid = redis.call('HGET', run, 'sid')
  if sid then
    -- a message already handed to a worker (not yet claimed) stays with it:
    -- its claim answers cancelled or superseded and acknowledges it
    if not holder_of(sid) then redis.call('XDEL', Q, sid) end
    redis.call('HDEL', run, 'sid')
  end
  redis.call('ZREM', DUE, key)
  redis.call('DEL', msg_key(key))
  local parked = redis.call('HMGET', run, 'parked', 'pin')
  if parked[1] then
    redis.call('LREM', wait_key(parked[2] or P, parked[1]), 0, waiter(P, key))
    redis.call('HDEL', run, 'parked', 'pin')
    redis.call('SREM', P .. ':parked', key)
  end
end

local function acknowledge(id)
  if id and id ~= '' then
    redis.call('XACK', Q, GROUP, id)
    redis.call('XDEL', Q, id)
  end
end

-- whether another worker than the sender (WORKER) holds the delivery now:
-- its lease lapsed and was taken over, and the taker's run decides
local function taken_over(id)
  if not WORKER then return false end
  local holder = holder_of(id)
  return holder and holder ~= WORKER
end

local function conclude(key, ttl)
  local run = run_key(key)
  redis.call('DEL', prog_key(key))
  if tonumber(ttl) > 0 then
    redis.call('PEXPIRE', run, math.floor(tonumber(ttl) * 1000))
  else
    redis.call('DEL', run)
  end
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
  redis.call('HSET', run, 'g', gen, 'state', state, 'completed', now)
  redis.call('HDEL', run, 'cancel')
  local event = {type = 'state', state = state, completed_at = tonumber(now)}
  if err and err ~= '' then
    redis.call('HSET', run, 'error', err)
    event['error'] = err
  end
  conclude(key, ttl)
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

-- queue the oldest live waiter of limit in namespace S; returns 1 if one woke
local function wake(S, limit, now)
  local waiting = wait_key(S, limit)
  while true do
    local entry = redis.call('LPOP', waiting)
    if not entry then
      redis.call('ZREM', S .. ':stale', limit)
      redis.call('HDEL', S .. ':woken', limit)
      return 0
    end
    local p, key = waiter_of(entry)
    local run = p .. ':run:' .. key
    local r = redis.call('HMGET', run, 'state', 'parked', 'pin', 'f', 'p', 'w', 'a', 'g')
    if r[1] == 'scheduled' and r[2] == limit and r[3] == S then
      redis.call('HDEL', run, 'parked', 'pin')
      redis.call('SREM', p .. ':parked', key)
      local when = r[6]
      if (tonumber(when or '') or 0) > tonumber(now) then when = now end
      enqueue(key, r[4], r[5], when, r[7], r[8], p)
      if redis.call('LLEN', waiting) == 0 then
        redis.call('ZREM', S .. ':stale', limit)
        redis.call('HDEL', S .. ':woken', limit)
      else
        redis.call('HSET', S .. ':woken', limit, now)
        restale(S, limit)
      end
      return 1
    end
  end
end
