-- Admit: ARGV = prefix, group, memo header, then the fields of one or more
-- admissions packed into one argument (unpack_fields), 12 each: delivery
-- id, task key, generation, function, payload, attempt, now, stale_after,
-- ttl, controls, own, request number.  ``controls`` packs 6 fields a
-- control, in gate order: kind ('debounce', 'cooldown' or 'ratelimit'),
-- namespace (where its state lives: it must be this call's prefix P), key,
-- then for a debounce its settle, for a cooldown its window, for a rate
-- limit its limit, per and drop ('1' or '0'); unused fields are ''.  The
-- consecutive admissions of a flush in one namespace go in one call.
--
-- The call runs in the namespace of its controls: P is the docket's prefix
-- ("{name}") when ``own`` is '1', else a scope's ("{scope}"), and the script
-- touches only keys of P.  Judges each admission as
-- docket_core/sansio/admission_state.py ``decide`` does (the reference: the
-- same rules, comparisons and arithmetic, so both stores answer alike to the
-- last bit) and writes what the ruling changes.  In the docket's own
-- namespace only: an admission whose sender no longer holds the delivery
-- (another worker does, or nobody) answers 'lost' and changes nothing, and
-- a delivery not admitted is settled in the same step, as
-- admission.settlement says: dropped, its key is recorded cancelled (as
-- finish.lua does); rescheduled, its message is scheduled again at ``at``
-- (as schedule.lua replaces with an expected generation); either way it is
-- acknowledged.  In a scope's namespace the core settles it in the docket
-- next.  Returns one {verdict, at, blocker, repeat} per admission: verdict
-- 'admit', 'reschedule', 'drop' or 'lost'; at, the time to come back
-- ('%.17g', or ''); blocker, the 1-based index of the deciding control
-- ('0': none); repeat, '1' when an admitted execution had been admitted
-- before.  Every input is checked before the first write.  A resend answers
-- its first outcome (memo in P:did:<origin>), except that an 'admit' in the
-- docket's own namespace becomes 'lost' when the sender no longer holds the
-- delivery.
--
-- State, per control:
--   P:debounce:<key>   hash  seen, expires, due, winner?, ran? and displaced? (packed lists)
--   P:cooldown:<key>   hash  holder, until
--   P:ratelimit:<key>  zset  execution -> start
-- A state counts as absent from its end (expires, until, the last start +
-- 2 * per); the key's TTL runs a minute past that end (clocks disagree).

local GRACE = 60

-- a number as text that reads back as the same double
local function fmt(x) return string.format('%.17g', x) end

local function number_at_least(text, low, what)
  local x = tonumber(text)
  if not x or x ~= x or x == math.huge or x == -math.huge or x < low then
    error('docket: admit: malformed ' .. what .. ': ' .. tostring(text))
  end
  return x
end

-- the TTL of a state key: a minute past the state's end
local function keep(k, ends, now)
  local ms = math.ceil((ends - now + GRACE) * 1000)
  if ms < 1 then ms = 1 end
  redis.call('PEXPIRE', k, string.format('%d', ms))
end

local function state_key(c) return c.ns .. ':' .. c.kind .. ':' .. c.key end

-- judgements: {verdict=, state=, at=, rep=, newcomer=}

-- -- debounce ------------------------------------------------------------------

-- DEBOUNCE_MEMORY and REMEMBERED (admission_state.py)
local DEBOUNCE_MEMORY = 86400.0
local REMEMBERED = 8

local function pack_list(list)
  local packed = {}
  for _, item in ipairs(list) do packed[#packed + 1] = #item .. ':' .. item end
  return table.concat(packed)
end

-- list with item appended, the latest REMEMBERED kept
local function appended(list, item)
  local out = {}
  for _, value in ipairs(list) do out[#out + 1] = value end
  out[#out + 1] = item
  while #out > REMEMBERED do table.remove(out, 1) end
  return out
end

local function remember_until(a, b, c)
  local latest = math.max(a, b)
  if c then latest = math.max(latest, c) end
  return latest + DEBOUNCE_MEMORY
end

local function contains(list, item)
  for _, value in ipairs(list) do
    if value == item then return true end
  end
  return false
end

local function judge_debounce(c, a)
  local h = redis.call('HMGET', state_key(c), 'seen', 'expires', 'due', 'winner', 'ran',
                       'displaced')
  local now = a.now
  local st = false
  if h[1] then
    st = {seen = tonumber(h[1]), expires = tonumber(h[2]), due = tonumber(h[3]),
          winner = h[4], ran = unpack_fields(h[5] or ''),
          displaced = unpack_fields(h[6] or '')}
    if st.expires <= now then st = false end
  end
  if not st then
    return {verdict = 'reschedule', state = st, at = now + c.settle, newcomer = true}
  end
  if contains(st.ran, a.execution) then return {verdict = 'admit', state = st, rep = true} end
  if st.winner == a.key then
    local ready = st.seen + c.settle
    if now >= ready then return {verdict = 'admit', state = st} end
    return {verdict = 'reschedule', state = st, at = ready}
  end
  -- a winner taken for lost, back after all: its period is another's now
  if contains(st.displaced, a.key) then return {verdict = 'drop', state = st} end
  local seen = math.max(st.seen, now)
  if not st.winner then
    return {verdict = 'reschedule', state = st, at = seen + c.settle, newcomer = true}
  end
  if now >= st.due + a.stale then
    -- the winner overstayed its return: it was lost; this one takes over
    return {verdict = 'reschedule', state = st, at = seen + c.settle, newcomer = true}
  end
  return {verdict = 'drop', state = st, loser = true}
end

local function write_debounce(c, st, now)
  local k = state_key(c)
  redis.call('DEL', k)
  if not st then return end
  local fields = {'seen', fmt(st.seen), 'expires', fmt(st.expires), 'due', fmt(st.due)}
  if st.winner then
    fields[#fields + 1] = 'winner'
    fields[#fields + 1] = st.winner
  end
  if #st.ran > 0 then
    fields[#fields + 1] = 'ran'
    fields[#fields + 1] = pack_list(st.ran)
  end
  if #st.displaced > 0 then
    fields[#fields + 1] = 'displaced'
    fields[#fields + 1] = pack_list(st.displaced)
  end
  redis.call('HSET', k, unpack(fields))
  keep(k, st.expires, now)
end

local function settle_debounce(c, j, ruling, a)
  local st, now = j.state, a.now
  if j.rep then
    write_debounce(c, st, now)
    return
  end
  if j.verdict == 'drop' and not j.loser then
    -- a lost winner back after all, dropped once: its key is free again
    local kept = {}
    for _, k in ipairs(st.displaced) do
      if k ~= a.key then kept[#kept + 1] = k end
    end
    write_debounce(c, {seen = st.seen, expires = st.expires, due = st.due, winner = st.winner,
                       ran = st.ran, displaced = kept}, now)
    return
  end
  if j.verdict == 'drop' then
    local seen = math.max(st.seen, now)
    write_debounce(c, {seen = seen, expires = remember_until(st.due, seen + c.settle, now),
                       due = st.due, winner = st.winner, ran = st.ran,
                       displaced = st.displaced}, now)
    return
  end
  if j.verdict == 'reschedule' then
    local seen, ran, displaced = now, {}, {}
    if st and j.newcomer then
      seen, ran, displaced = math.max(st.seen, now), st.ran, st.displaced
      -- a takeover: the lost winner is remembered (the latest few)
      if st.winner then displaced = appended(displaced, st.winner) end
    elseif st then
      seen, ran, displaced = st.seen, st.ran, st.displaced
    end
    write_debounce(c, {seen = seen, expires = remember_until(j.at, seen + c.settle, now),
                       due = j.at, winner = a.key, ran = ran, displaced = displaced}, now)
    return
  end
  -- the winner, settled: the ruling may still be a later control's
  if ruling.verdict == 'reschedule' then
    write_debounce(c, {seen = st.seen, due = ruling.at, winner = st.winner, ran = st.ran,
                       displaced = st.displaced,
                       expires = remember_until(ruling.at, st.seen + c.settle, now)}, now)
    return
  end
  local ran = st.ran
  if ruling.verdict == 'admit' then ran = appended(ran, a.execution) end
  write_debounce(c, {seen = st.seen, due = 0.0, winner = false, ran = ran,
                     displaced = st.displaced,
                     expires = remember_until(st.seen + c.settle, now)}, now)
end

-- -- cooldown ------------------------------------------------------------------

local function judge_cooldown(c, a)
  local h = redis.call('HMGET', state_key(c), 'holder', 'until')
  local st = false
  if h[1] then
    st = {holder = h[1], ['until'] = tonumber(h[2])}
    if st['until'] <= a.now then st = false end
  end
  if not st then return {verdict = 'admit', state = st} end
  if st.holder == a.execution then return {verdict = 'admit', state = st, rep = true} end
  return {verdict = 'drop', state = st}
end

local function settle_cooldown(c, j, ruling, a)
  local k, now = state_key(c), a.now
  local st = j.state
  if j.verdict == 'admit' and not j.rep and ruling.verdict == 'admit' then
    local ends = now + c.window
    st = false
    if ends > now then st = {holder = a.execution, ['until'] = ends} end
  end
  redis.call('DEL', k)
  if st then
    redis.call('HSET', k, 'holder', st.holder, 'until', fmt(st['until']))
    keep(k, st['until'], now)
  end
end

-- -- rate limit ----------------------------------------------------------------

-- whether a start at now leaves every window (x - per, x] that contains it
-- with at most limit starts; window: the sorted starts in (now - per, now + per)
local function fits(window, now, per, limit)
  local size, entered, left = #window, 0, 0
  local points = {now}
  for _, s in ipairs(window) do
    if s > now then points[#points + 1] = s end
  end
  for _, x in ipairs(points) do
    while entered < size and window[entered + 1] <= x do entered = entered + 1 end
    while left < size and window[left + 1] + per <= x do left = left + 1 end
    if entered - left >= limit then return false end
  end
  return true
end

-- the starts of k whose score lies in [low, high] (a band a margin wide)
local function band(k, low, high)
  local found = redis.call('ZRANGEBYSCORE', k, fmt(low), fmt(high), 'WITHSCORES')
  local starts = {}
  for i = 2, #found, 2 do starts[#starts + 1] = {found[i - 1], tonumber(found[i])} end
  return starts
end

-- The log is never walked: score ranges are counted (ZCOUNT) with a margin
-- far above the rounding of now +- per, and only the starts within a margin
-- of a bound are compared as the reference compares them.
local function judge_rate(c, a)
  local k, now, per, limit = state_key(c), a.now, c.per, c.limit
  local m = (math.abs(now) + 2 * per) * 1e-12
  -- starts are kept 2 * per (s + 2 * per > now)
  local edge = now - 2 * per
  redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. fmt(edge - m))
  for _, start in ipairs(band(k, edge - m, edge + m)) do
    if start[2] + 2 * per <= now then redis.call('ZREM', k, start[1]) end
  end
  if redis.call('ZSCORE', k, a.execution) then return {verdict = 'admit', rep = true} end
  -- the window: s + per > now and s < now + per; fewer than limit starts
  -- within a margin of it: no window can be full
  local low, high = now - per, now + per
  if redis.call('ZCOUNT', k, fmt(low - m), fmt(high + m)) < limit then
    return {verdict = 'admit'}
  end
  if high > now and redis.call('ZCOUNT', k, '(' .. fmt(now), '+inf') == 0 then
    -- no start after now (a faster clock's): fits counts the one window
    -- (now - per, now], whose limit-th latest start is the log's
    local inside = redis.call('ZCOUNT', k, '(' .. fmt(low + m), fmt(now))
    for _, start in ipairs(band(k, low - m, low + m)) do
      if start[2] + per > now then inside = inside + 1 end
    end
    if inside < limit then return {verdict = 'admit'} end
    if c.drop then return {verdict = 'drop'} end
    local nth = redis.call('ZRANGE', k, -limit, -limit, 'WITHSCORES')
    return {verdict = 'reschedule', at = tonumber(nth[2]) + per}
  end
  local window = {}
  for _, start in ipairs(band(k, low - m, high + m)) do
    local s = start[2]
    if s + per > now and s < high then window[#window + 1] = s end
  end
  if fits(window, now, per, limit) then return {verdict = 'admit'} end
  if c.drop then return {verdict = 'drop'} end
  return {verdict = 'reschedule', at = window[#window - limit + 1] + per}
end

local function settle_rate(c, j, ruling, a)
  if j.verdict == 'admit' and not j.rep and ruling.verdict == 'admit' then
    local k = state_key(c)
    redis.call('ZADD', k, a.now_text, a.execution)
    local last = redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')
    keep(k, tonumber(last[2]) + 2 * c.per, a.now)
  end
end

local JUDGE = {debounce = judge_debounce, cooldown = judge_cooldown, ratelimit = judge_rate}
local SETTLE = {debounce = settle_debounce, cooldown = settle_cooldown, ratelimit = settle_rate}

-- -- settling a blocked delivery ----------------------------------------------

-- the soonest due time before the first reschedule of this call, if any
local before = false

-- The two settlements repeat finish.lua (a cancelled end) and schedule.lua
-- (a replace with an expected generation and an acknowledgement): keep them
-- in step with those scripts.

-- dropped: acknowledged, and its key recorded cancelled unless superseded
local function drop(a)
  acknowledge(a.id)
  local run = run_key(a.key)
  if tonumber(redis.call('HGET', run, 'g') or '-1') ~= a.generation then return end
  redis.call('HSET', run, 'state', 'cancelled', 'completed', a.now_text)
  redis.call('HDEL', run, 'cancel')
  conclude(a.key, a.ttl)
  publish(a.key, {type = 'state', state = 'cancelled', completed_at = a.now})
end

-- rescheduled: acknowledged, and its message scheduled again at ``at`` as a
-- new generation, unless superseded (or cancelled meanwhile: it concludes)
local function reschedule(a, at)
  acknowledge(a.id)
  local run = run_key(a.key)
  local record = redis.call('HMGET', run, 'state', 'g', 'cancel')
  if not record[1] or tonumber(record[2]) ~= a.generation then return end
  if record[3] then
    cancel_key(a.key, a.now_text, record[3])
    return
  end
  unqueue(a.key)
  redis.call('HDEL', run, 'worker', 'started', 'completed', 'error', 'result', 'cancel',
             'slot', 'pin', 'prog')
  redis.call('PERSIST', run)
  redis.call('DEL', prog_key(a.key))
  local gen = next_generation()
  local when = fmt(at)
  redis.call('HSET', run, 'f', a.fn, 'p', a.payload, 'w', when, 'a', a.attempt, 'g', gen)
  if at <= a.now then
    enqueue(a.key, a.fn, a.payload, when, a.attempt, gen)
    return
  end
  redis.call('HSET', msg_key(a.key), 'k', a.key, 'f', a.fn, 'p', a.payload, 'w', when,
             'a', a.attempt, 'g', gen)
  if not before then before = redis.call('ZRANGE', DUE, 0, 0, 'WITHSCORES') end
  redis.call('ZADD', DUE, when, a.key)
  redis.call('HSET', run, 'state', 'scheduled')
  publish(a.key, {type = 'state', state = 'scheduled', when = at})
end

-- -- the step ------------------------------------------------------------------

local function admit(a)
  local judged = {}
  local verdict, at, blocker, rep = 'admit', false, 0, #a.controls > 0
  for index, c in ipairs(a.controls) do
    local j = JUDGE[c.kind](c, a)
    judged[#judged + 1] = {c, j}
    if j.verdict ~= 'admit' then
      verdict, at, blocker, rep = j.verdict, j.at or false, index, false
      break
    end
    if not j.rep then rep = false end
  end
  local ruling = {verdict = verdict, at = at}
  for _, cj in ipairs(judged) do SETTLE[cj[1].kind](cj[1], cj[2], ruling, a) end
  -- (in a scope's namespace the core settles a blocked delivery next)
  if a.own and verdict == 'drop' then drop(a) end
  if a.own and verdict == 'reschedule' then reschedule(a, at) end
  local at_text = ''
  if at then at_text = fmt(at) end
  local rep_text = '0'
  if rep then rep_text = '1' end
  return {verdict, at_text, tostring(blocker), rep_text}
end

-- whether the sender still holds the delivery (checked in the docket's own
-- namespace only: another worker's, or nobody's, is not admitted here)
local function sender_holds(a)
  return not a.own or not WORKER or holder_of(a.id) == WORKER
end

-- check every input before the first write
local f = unpack_fields(ARGV[4])
if #f % 12 ~= 0 then error('docket: admit takes 12 fields an admission') end
local admissions = {}
for i = 1, #f, 12 do
  local generation = number_at_least(f[i + 2], 0, 'generation')
  local a = {id = f[i], key = f[i + 1], generation = generation,
             execution = f[i + 1] .. '#' .. f[i + 2], fn = f[i + 3], payload = f[i + 4],
             attempt = f[i + 5], now_text = f[i + 6],
             now = number_at_least(f[i + 6], -math.huge, 'now'),
             stale = number_at_least(f[i + 7], 0, 'stale_after'),
             ttl = f[i + 8], own = f[i + 10] == '1', seq = f[i + 11], controls = {}}
  number_at_least(a.attempt, 1, 'attempt')
  number_at_least(a.ttl, 0, 'ttl')
  if f[i + 10] ~= '1' and f[i + 10] ~= '0' then error('docket: admit: malformed own flag') end
  local c = unpack_fields(f[i + 9])
  if #c % 6 ~= 0 then error('docket: admit takes 6 fields a control') end
  for j = 1, #c, 6 do
    local control = {kind = c[j], ns = c[j + 1], key = c[j + 2]}
    -- one slot a call: a control of another namespace goes in its own call
    if control.ns ~= P then
      error('docket: admit: a control of ' .. tostring(control.ns) .. ' in a call of ' .. P)
    end
    if control.kind == 'debounce' then
      control.settle = number_at_least(c[j + 3], 0, 'settle')
    elseif control.kind == 'cooldown' then
      control.window = number_at_least(c[j + 3], 0, 'window')
    elseif control.kind == 'ratelimit' then
      control.limit = number_at_least(c[j + 3], 1, 'limit')
      control.per = number_at_least(c[j + 4], 0, 'per')
      if control.limit ~= math.floor(control.limit) or control.per <= 0 then
        error('docket: admit: malformed rate limit')
      end
      control.drop = c[j + 5] == '1'
    else
      error('docket: admit: unknown control kind ' .. tostring(control.kind))
    end
    a.controls[#a.controls + 1] = control
  end
  admissions[#admissions + 1] = a
end
open_memo(ARGV[3])
local LOST = {'lost', '', '0', '0'}
local replies = {}
for _, a in ipairs(admissions) do
  local first = recall(a.seq)
  if first then
    if first[1] == 'admit' and not sender_holds(a) then first = LOST end
  elseif not sender_holds(a) then
    first = remember(a.seq, LOST)
  else
    first = remember(a.seq, admit(a))
  end
  replies[#replies + 1] = first
end
-- a new soonest message: wake one blocked reader so it re-arms its timer
-- (as schedule.lua does)
if before then rearm(before) end
return replies
