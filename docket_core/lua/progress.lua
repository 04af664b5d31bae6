-- Progress: ARGV = prefix, group, key, now, current, increment, total, message,
-- clear_message, generation.  Empty strings mean "unchanged"; a generation
-- that is no longer the key's (a superseded run) changes nothing.
-- An empty message, like clear_message, clears it.
-- Returns {current, total, message, updated}.  A live record is marked
-- 'prog' (its end deletes the progress then).
local key, now = ARGV[3], ARGV[4]
local prog = prog_key(key)
-- '100' below: DEFAULT_PROGRESS_TOTAL (docket_core/sansio/values.py)
if ARGV[10] ~= '' and redis.call('HGET', run_key(key), 'g') ~= ARGV[10] then
  local r = redis.call('HMGET', prog, 'current', 'total', 'message', 'updated')
  return {r[1] or '0', r[2] or '100', r[3] or false, r[4] or false}
end
if ARGV[5] ~= '' then redis.call('HSET', prog, 'current', ARGV[5]) end
if ARGV[6] ~= '' then redis.call('HINCRBY', prog, 'current', ARGV[6]) end
if ARGV[7] ~= '' then redis.call('HSET', prog, 'total', ARGV[7]) end
if ARGV[8] ~= '' then redis.call('HSET', prog, 'message', ARGV[8]) end
if ARGV[9] == '1' then redis.call('HDEL', prog, 'message') end
redis.call('HSET', prog, 'updated', now)
if redis.call('TTL', run_key(key)) >= 0 or redis.call('EXISTS', run_key(key)) == 0 then
  -- no live record: keep stray progress from leaking
  redis.call('PEXPIRE', prog, 3600000)
else
  -- a live record: its end deletes the progress it finds this mark of
  -- (record_end; a run that reports none spares the server that DEL)
  redis.call('HSET', run_key(key), 'prog', '1')
end
local r = redis.call('HMGET', prog, 'current', 'total', 'message')
local current, total = tonumber(r[1] or '0'), tonumber(r[2] or '100')
local event = {type = 'progress', current = current, total = total,
               updated_at = tonumber(now)}
event['message'] = r[3] or cjson.null
publish(key, event)
return {tostring(current), tostring(total), r[3] or false, now}
