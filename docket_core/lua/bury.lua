-- Bury: ARGV = prefix, group, memo header, request number, entry id, reason,
-- now, ttl, key, has key ('1' or '0'), generation ('' when unknown), and the
-- entry's fields packed (unpack_fields).  Moves a malformed entry the sender
-- holds to the dead-letter stream P:dead (its id, reason, time, key and
-- fields) and acknowledges it; when the entry is its key's current message
-- (the record, queued or scheduled, names the entry or its generation),
-- records the key failed with the reason.  Returns 0 (the sender does not hold the entry:
-- nothing changed), 1 (moved) or 2 (moved, key failed); a resend answers its
-- first outcome and does nothing.
local id, reason, now, ttl = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local key, has_key, gen = ARGV[9], ARGV[10] == '1', ARGV[11]
if id == '' or not tonumber(now) or not tonumber(ttl) then
  error('docket: bury takes an entry id, a now and a ttl')
end
open_memo(ARGV[3])
local first = recall(ARGV[4])
if first then return first end
local function bury()
  if not WORKER or holder_of(id) ~= WORKER then return 0 end
  local letter = {'id', id, 'reason', reason, 'at', now, 'raw', ARGV[12]}
  if has_key then
    letter[#letter + 1] = 'key'
    letter[#letter + 1] = key
  end
  redis.call('XADD', P .. ':dead', 'MAXLEN', '~', DEAD_LETTER_LIMIT, '*', unpack(letter))
  acknowledge(id)
  if not has_key then return 1 end
  local run = run_key(key)
  local r = redis.call('HMGET', run, 'state', 'sid', 'g')
  -- a running record belongs to whoever claimed it: a copy never fails it
  local waiting = r[1] == 'queued' or r[1] == 'scheduled'
  if not waiting or not (r[2] == id or (gen ~= '' and r[3] == gen)) then return 1 end
  unqueue(key)
  redis.call('HSET', run, 'state', 'failed', 'completed', now, 'error', reason)
  conclude(key, ttl)
  publish(key, {type = 'state', state = 'failed', completed_at = tonumber(now), error = reason})
  return 2
end
return remember(ARGV[4], bury())
