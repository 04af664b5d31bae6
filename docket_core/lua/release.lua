-- ReleaseSlot: ARGV = prefix, group, limit, holder, now.  Removes the holder's
-- slot and queues the oldest live waiter.  Returns how many woke (0 or 1).
local limit, holder, now = ARGV[3], ARGV[4], ARGV[5]
redis.call('ZREM', P .. ':slots:' .. limit, holder)
return wake(limit, now)
