-- Heartbeat: ARGV = prefix, group, worker, now, leaving, ttl_ms, tasks (JSON list).
local worker, now, leaving, ttl, tasks = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local workers = P .. ':workers'
local info = P .. ':worker-tasks:' .. worker
if leaving == '1' then
  redis.call('ZREM', workers, worker)
  redis.call('DEL', info)
  -- forget the consumer too, unless it still holds deliveries (they must
  -- stay pending so another worker takes them over)
  local ok, held = pcall(redis.call, 'XPENDING', Q, GROUP, '-', '+', 1, worker)
  if ok and #held == 0 then
    redis.call('XGROUP', 'DELCONSUMER', Q, GROUP, worker)
  end
  -- and its consumer of the wake stream, with any wake-up it read and never
  -- acknowledged (stopped in the middle of a blocked read)
  if redis.call('EXISTS', WAKE) == 1 then
    pcall(redis.call, 'XGROUP', 'DELCONSUMER', WAKE, GROUP, worker)
  end
  return 0
end
redis.call('ZADD', workers, now, worker)
redis.call('SET', info, tasks, 'PX', ttl)
-- forget workers silent for an hour
redis.call('ZREMRANGEBYSCORE', workers, '-inf', tonumber(now) - 3600)
return 1
