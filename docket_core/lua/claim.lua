-- Claim: ARGV = prefix, group, memo header, request number, worker, now, then
-- (id, key, generation) triples.  Returns one verdict per item: claimed,
-- superseded, cancelled or lost.  A running record a cancel marked (its
-- worker died before recording the run's end) concludes cancelled instead
-- of running again.  A resend answers its first verdicts, except
-- that a claimed delivery another worker holds by now is lost (and one still
-- held has its lease renewed to the resend's now).
local seq, worker, now = ARGV[4], ARGV[5], ARGV[6]
if (#ARGV - 6) % 3 ~= 0 then error('docket: claim takes (id, key, generation) triples') end
open_memo(ARGV[3])
local first = recall(seq)
if first then
  for i, verdict in ipairs(first) do
    if verdict == 'claimed' then
      local id = ARGV[4 + 3 * i]
      if holder_of(id) ~= worker then
        first[i] = 'lost'
      else
        redis.call('XCLAIM', Q, GROUP, worker, 0, id, 'JUSTID')
      end
    end
  end
  return first
end
local verdicts = {}
for i = 7, #ARGV, 3 do
  local id, key, gen = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local verdict
  if holder_of(id) ~= worker then
    verdict = 'lost'
  else
    local run = run_key(key)
    local record = redis.call('HMGET', run, 'state', 'g', 'cancel')
    if record[1] == 'cancelled' then
      verdict = 'cancelled'
    elseif not record[1] or tonumber(record[2]) ~= gen or not LIVE[record[1]] then
      -- superseded, or this generation already ran to its end (an earlier copy)
      verdict = 'superseded'
    elseif record[3] then
      -- cancelled while it ran, and its worker never recorded the end
      verdict = 'cancelled'
      cancel_key(key, now, record[3])
    else
      verdict = 'claimed'
    end
    if verdict == 'claimed' then
      redis.call('XCLAIM', Q, GROUP, worker, 0, id, 'JUSTID')
      redis.call('HSET', run, 'state', 'running', 'worker', worker, 'started', now)
      redis.call('HDEL', run, 'sid')
      redis.call('DEL', prog_key(key))
      -- 100: DEFAULT_PROGRESS_TOTAL (docket_core/sansio/values.py)
      redis.call('HSET', prog_key(key), 'current', 0, 'total', 100)
      publish(key, {type = 'state', state = 'running', worker = worker,
                    started_at = tonumber(now)})
    else
      acknowledge(id)
    end
  end
  verdicts[#verdicts + 1] = verdict
end
return remember(seq, verdicts)
