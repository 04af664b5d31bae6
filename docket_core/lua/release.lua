-- ReleaseSlot: ARGV = prefix, group, memo header, request number, limit,
-- holder, now, namespace.  Removes the holder's slot and queues the oldest
-- live waiter (of any docket sharing the namespace).  Returns how many woke
-- (0 or 1); a resend answers its first outcome and does nothing.
local seq, limit, holder, now, S = ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
open_memo(ARGV[3])
local first = recall(seq)
if first then return first end
-- a holder whose slot was taken over (it went stale) frees nothing
if redis.call('ZREM', S .. ':slots:' .. limit, holder) == 0 then return remember(seq, 0) end
return remember(seq, wake(S, limit, now))
