-- Claim: ARGV = prefix, group, memo header, request number, worker, now,
-- renew ('1': renew the claimed deliveries' leases to now; '0': the read
-- that handed them out was recent, and their leases count from it), then
-- (id, key, generation) triples.  Returns one verdict per item: claimed,
-- superseded, cancelled or lost.  A running record a cancel marked (its
-- worker died before recording the run's end) concludes cancelled instead
-- of running again.  A resend answers its first verdicts, except
-- that a claimed delivery another worker holds by now is lost (and one still
-- held has its lease renewed to the resend's now).
local seq, worker, now, renew = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
if (#ARGV - 7) % 3 ~= 0 then error('docket: claim takes (id, key, generation) triples') end
if renew ~= '1' and renew ~= '0' then error('docket: claim takes renew 1 or 0') end
open_memo(ARGV[3])
local first = recall(seq)
if first then
  for i, verdict in ipairs(first) do
    if verdict == 'claimed' then
      local id = ARGV[5 + 3 * i]
      if holder_of(id) ~= worker then
        first[i] = 'lost'
      else
        redis.call('XCLAIM', Q, GROUP, worker, 0, id, 'JUSTID')
      end
    end
  end
  return first
end
-- which deliveries the worker holds, read at once; their leases are renewed
-- (XCLAIM) and the others acknowledged at the end, each in one command (a
-- delivery acknowledged earlier in the call is no longer held)
local ids = {}
for i = 8, #ARGV, 3 do ids[#ids + 1] = ARGV[i] end
local held = held_by(worker, ids)
local verdicts, claimed, acked, gone, head = {}, {}, {}, {}, nil
for i = 8, #ARGV, 3 do
  local id, key, gen = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local verdict
  if gone[id] or not (held[id] or holder_of(id) == worker) then
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
      claimed[#claimed + 1] = id
      head = head or running_head(worker, now)
      mark_running(run, key, worker, now, held[id] == 1, head)
    elseif id ~= '' then
      acked[#acked + 1] = id
      gone[id] = true
    end
  end
  verdicts[#verdicts + 1] = verdict
end
for i = 1, renew == '1' and #claimed or 0, 1000 do
  local renewal = {Q, GROUP, worker, 0}
  for j = i, math.min(i + 999, #claimed) do renewal[#renewal + 1] = claimed[j] end
  renewal[#renewal + 1] = 'JUSTID'
  redis.call('XCLAIM', unpack(renewal))
end
acknowledge_all(acked)
return remember(seq, verdicts)
