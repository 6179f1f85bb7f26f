-- outbox_ack: the consumer scope's end-to-end acknowledgement; ONE shard.
--
-- KEYS[1]   = outbox index of the shard (sorted set: message id -> next-resend time)
-- KEYS[1+i] = outbox record of message ARGV[i]
-- ARGV[i]   = message id
-- returns   = number of outbox records deleted (an ack of an absent record is a no-op)
--
-- Deletes the record whatever its state: a consumer handled the message, so it must not be
-- resent even if the producer never saw Kafka's acknowledgement.
local deleted = 0
for i = 1, #ARGV do
  deleted = deleted + redis.call('DEL', KEYS[1 + i])
end
for j = 1, #ARGV, 1000 do  -- unpack in slices: Lua's C stack is limited
  redis.call('ZREM', KEYS[1], unpack(ARGV, j, math.min(j + 999, #ARGV)))
end
return deleted
