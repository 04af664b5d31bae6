-- Shared by every docket script (prepended to each).  ARGV[1] is always the
-- key prefix (the docket's hash tag, "{name}"), ARGV[2] the consumer group.
-- Every key of a docket starts with the prefix, so all of them hash to one
-- cluster slot; per-task keys are derived here from the prefix.
local P = ARGV[1]
local GROUP = ARGV[2]
local Q = P .. ':q'
local DUE = P .. ':due'

local function run_key(key) return P .. ':run:' .. key end
local function msg_key(key) return P .. ':msg:' .. key end
local function prog_key(key) return P .. ':prog:' .. key end
local function wait_key(limit) return P .. ':wait:' .. limit end

local function publish(key, event)
  event['key'] = key
  redis.call('PUBLISH', P .. ':events:' .. key, cjson.encode(event))
end

-- queue a message now: XADD it and remember its entry id on the record
local function enqueue(key, fn, payload, when, attempt, gen)
  local sid = redis.call('XADD', Q, '*', 'k', key, 'f', fn, 'p', payload,
                         'w', when, 'a', attempt, 'g', gen)
  redis.call('HSET', run_key(key), 'state', 'queued', 'sid', sid)
  publish(key, {type = 'state', state = 'queued', when = tonumber(when)})
  return sid
end

-- remove the key's scheduled or queued (not yet delivered) message
local function unqueue(key)
  local run = run_key(key)
  local sid = redis.call('HGET', run, 'sid')
  if sid then
    redis.call('XDEL', Q, sid)
    redis.call('HDEL', run, 'sid')
  end
  redis.call('ZREM', DUE, key)
  redis.call('DEL', msg_key(key))
  local parked = redis.call('HGET', run, 'parked')
  if parked then
    redis.call('LREM', wait_key(parked), 0, key)
    redis.call('HDEL', run, 'parked')
  end
end

local function acknowledge(id)
  if id and id ~= '' then
    redis.call('XACK', Q, GROUP, id)
    redis.call('XDEL', Q, id)
  end
end

-- the consumer that holds a delivery, or false
local function holder_of(id)
  local pending = redis.call('XPENDING', Q, GROUP, id, id, 1)
  if pending[1] then return pending[1][2] end
  return false
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

-- cancel a key that has a record: remove its message, give it a new
-- generation (no copy in flight may start), record and publish the
-- cancellation; returns the new generation
local function cancel_key(key, now, ttl)
  unqueue(key)
  local gen = next_generation()
  redis.call('HSET', run_key(key), 'g', gen, 'state', 'cancelled', 'completed', now)
  conclude(key, ttl)
  publish(key, {type = 'state', state = 'cancelled', completed_at = tonumber(now)})
  return gen
end

-- queue the oldest live waiter of a limit; returns 1 if one woke
local function wake(limit, now)
  local waiting = wait_key(limit)
  while true do
    local key = redis.call('LPOP', waiting)
    if not key then
      redis.call('SREM', P .. ':waiting', limit)
      redis.call('HDEL', P .. ':woken', limit)
      return 0
    end
    local run = run_key(key)
    local r = redis.call('HMGET', run, 'state', 'parked', 'f', 'p', 'w', 'a', 'g')
    if r[1] == 'scheduled' and r[2] == limit then
      redis.call('HDEL', run, 'parked')
      local when = r[5]
      if tonumber(when) > tonumber(now) then when = now end
      enqueue(key, r[3], r[4], when, r[6], r[7])
      if redis.call('LLEN', waiting) == 0 then
        redis.call('SREM', P .. ':waiting', limit)
        redis.call('HDEL', P .. ':woken', limit)
      else
        redis.call('HSET', P .. ':woken', limit, now)
      end
      return 1
    end
  end
end
