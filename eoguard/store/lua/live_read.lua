-- live_read: the instances whose liveness lease has not lapsed, with Redis's clock.
--
-- KEYS[1] = live set (sorted set: instance id -> lease deadline, epoch ms, Redis time)
-- returns = {now_ms, id_1, deadline_1, id_2, deadline_2, ...} for deadlines after now
--
-- Read-only. Redis's clock (not the caller's) decides lapse, so producers on machines with
-- skewed clocks agree on who is live.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now}
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live do out[#out + 1] = live[i] end
return out
