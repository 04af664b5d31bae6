-- Enlist, step 5 of a scoped limit, in its namespace S (ARGV[1]): ARGV =
-- prefix, group, limit, docket, since.  The docket still has keys parked
-- behind the limit: register it among the limit's waiting dockets again, as
-- of its oldest waiter (S:stale:<limit>, ZADD NX), living as long as the
-- limit's slot set (a minute at least).  Returns 1.  Idempotent: no memo.
local limit, docket, since = ARGV[3], ARGV[4], ARGV[5]
if not tonumber(since) then error('docket: enlist takes a since') end
local waiting = P .. ':stale:' .. limit
redis.call('ZADD', waiting, 'NX', since, docket)
local ttl = redis.call('TTL', P .. ':slots:' .. limit)
redis.call('PEXPIRE', waiting, math.max(ttl, 60) * 1000)
return 1
