-- outbox_sweep: drop resend-index entries whose outbox record is gone; ONE shard.
--
-- KEYS[1]   = index: the outbox index of the shard (sorted set: message id -> next-resend time)
-- KEYS[2..] = record: the outbox record of each message, in the order of ids
-- ARGV[1]   = dry_run: "1": dry run (report only) | "0": remove the entries
-- ARGV[2..] = ids: the message ids
-- returns   = ids: the ids whose record is gone (expired by its TTL, or acknowledged by a
--             consumer), removed from the index unless this is a dry run
--
-- Check and removal are one atomic step, so an entry whose record is written meanwhile is
-- never dropped. EXISTS makes Redis expire a record whose PEXPIREAT has passed.
local dry = ARGV[1] == '1'
local out = {}
for i = 2, #KEYS do
  local id = ARGV[i]
  if redis.call('EXISTS', KEYS[i]) == 0 then
    if not dry then redis.call('ZREM', KEYS[1], id) end
    out[#out + 1] = id
  end
end
return out
