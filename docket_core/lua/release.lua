-- ReleaseSlot: ARGV = prefix, group, limit, holder, now, namespace.  Removes
-- the holder's slot and queues the oldest live waiter (of any docket sharing
-- the namespace).  Returns how many woke (0 or 1).
local limit, holder, now, S = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
-- a holder whose slot was taken over (it went stale) frees nothing
if redis.call('ZREM', S .. ':slots:' .. limit, holder) == 0 then return 0 end
return wake(S, limit, now)
