-- outbox_ack: the consumer scope's end-to-end acknowledgement, for one shard or several (several
-- only on a single Redis node: on a Redis Cluster a call's keys share the hash slot of a shard).
--
-- KEYS[1..]    = groups: shard by shard, [group: index, records...]: the shard's outbox index
--                (sorted set: message id -> next-resend time), then the outbox records of its
--                ids, in the ids' order
-- ARGV[1]      = shards: n, the number of shards in the call
-- ARGV[2..1+n] = count: per shard, its number of ids
-- ARGV[2+n..]  = ids: the message ids, shard after shard
-- returns      = deleted: the number of outbox records deleted (an ack of an absent record is
--                a no-op)
--
-- Deletes the records whatever their state: a consumer handled the message, so it must not be
-- resent even if the producer never saw Kafka's acknowledgement. One DEL and one ZREM per 1000
-- ids of a shard (unpacked in slices: Lua's C stack is limited), so the AOF gets a few commands
-- per call, not one per record.
local n = tonumber(ARGV[1])
local deleted = 0
local k, a = 1, 2 + n  -- the shard's index in KEYS, its first id in ARGV
for s = 1, n do
  local count = tonumber(ARGV[1 + s])
  for j = 0, count - 1, 1000 do
    local last = math.min(j + 999, count - 1)
    deleted = deleted + redis.call('DEL', unpack(KEYS, k + 1 + j, k + 1 + last))
    redis.call('ZREM', KEYS[k], unpack(ARGV, a + j, a + last))
  end
  k = k + 1 + count
  a = a + count
end
return deleted
