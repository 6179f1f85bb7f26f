-- live_heartbeat: renew one instance's liveness lease and drop lapsed ones.
--
-- KEYS[1] = live_set: the leases (sorted set: instance id -> deadline, epoch ms, Redis time)
-- ARGV[1] = instance_id
-- ARGV[2] = lease_ms
-- returns = {now_ms, live_count}: live_count counts leases whose deadline is after now
--
-- The set's own expiry follows its latest lease, so it disappears when every lease lapsed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], deadline, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local exp = redis.call('PEXPIRETIME', KEYS[1])
if exp == -1 or exp < deadline then
  redis.call('PEXPIREAT', KEYS[1], deadline)
end
return {now, redis.call('ZCARD', KEYS[1])}
