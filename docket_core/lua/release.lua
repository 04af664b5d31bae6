-- ReleaseSlot: ARGV = prefix, group, limit, holder, now.  Removes the holder's
-- slot and queues the oldest live waiter.  Returns how many woke (0 or 1).
local limit, holder, now = ARGV[3], ARGV[4], ARGV[5]
-- a holder whose slot was taken over (it went stale) frees nothing
if redis.call('ZREM', P .. ':slots:' .. limit, holder) == 0 then return 0 end
return wake(limit, now)
