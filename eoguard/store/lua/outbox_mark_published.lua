-- outbox_mark_published: Kafka acknowledged these messages (acks=all); ONE shard.
--
-- KEYS[1]   = outbox index of the shard (sorted set: message id -> next-resend time)
-- KEYS[1+i] = outbox record (hash) of message ARGV[i]
-- ARGV[i]   = message id
-- returns   = {kept, deleted, missing}: records moved to state=published and kept for the
--             consumer's end-to-end ack (keep=consumed), records deleted (keep=published),
--             records not found (already acked by the consumer, or expired)
--
-- Publication is evidence whoever published: the owner is not checked. The index entry is
-- removed in every case, so a published record is never resent. A missing record is never
-- recreated (an HSET on it would leave a key without TTL).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kept, deleted, missing = 0, 0, 0
for j = 1, #ARGV, 1000 do  -- unpack in slices: Lua's C stack is limited
  redis.call('ZREM', KEYS[1], unpack(ARGV, j, math.min(j + 999, #ARGV)))
end
for i = 1, #ARGV do
  local rec = KEYS[1 + i]
  local f = redis.call('HMGET', rec, 'state', 'keep')
  if not f[1] then
    missing = missing + 1
  elseif f[2] == 'published' then
    redis.call('DEL', rec)
    deleted = deleted + 1
  elseif f[1] == 'pending' then
    redis.call('HSET', rec, 'state', 'published', 'published_at', now)
    kept = kept + 1
  else
    kept = kept + 1
  end
end
return {kept, deleted, missing}
