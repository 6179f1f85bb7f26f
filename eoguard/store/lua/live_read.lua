-- live_read: the instances whose liveness lease has not lapsed, with Redis's clock.
--
-- KEYS[1] = live_set: the leases (sorted set: instance id -> deadline, epoch ms, Redis time)
-- returns = {read_at_ms, deadlines...}: read_at_ms is Redis's now; deadlines lists, for each
--           lease whose deadline is after now, [lease: id, deadline_ms], flat
--
-- Read-only. Redis's clock (not the caller's) decides lapse, so producers on machines with
-- skewed clocks agree on who is live.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live do out[#out + 1] = live[i] end
return out
