-- outbox_claim_for_resend: take ownership of due records of ONE shard, atomically.
--
-- KEYS[1]      = index: the outbox index of the shard (sorted set: message id -> next-resend
--                time)
-- KEYS[2..]    = record: the outbox record (string, layout in outbox_write.lua) of each
--                candidate, in the order of ids
-- ARGV[1]      = claimer: producer instance id taking ownership
-- ARGV[2]      = resend_after_ms: the claimed record's next-resend time becomes now + this
-- ARGV[3]      = live_read_at_ms: Redis time at which the live producer set was read
-- ARGV[4]      = live_count: l, the number of live producer ids that follow
-- ARGV[5..4+l] = live: the live producer ids (owners whose lease had not lapsed)
-- ARGV[5+l..]  = ids: the candidate message ids, in the order of their records in KEYS
-- returns      = {now_ms, swept, expired, claimed...}: claimed lists, for each record claimed,
--                [claimed: id, previous_owner, record]: the record as rewritten (new owner,
--                owned_at = now, next_resend_at, attempt incremented)
--
-- A pending record is claimed when it is due (next-resend time, its score in the index,
-- passed: delivery failed or timed out) or when its owner's lease lapsed (owner not live, and it owned the record before the live set was read: an owner
-- registers before it writes, so a newer record belongs to a producer that may be live).
-- A claimer that leaves itself out of the live set takes its own records too: its delivery
-- of them failed (librdkafka retries nothing after that), or an operator resends them.
-- The claim is a compare-and-set inside this script: a second claimer sees the new owner,
-- live, with the next-resend time pushed, and skips. Index entries whose record is gone
-- (expired by TTL or acked) are swept; a record past expires_at is deleted, never resent; a
-- published record's stray entry is dropped. The rewrite keeps the record's TTL (KEEPTTL).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local claimer, resend_after = ARGV[1], tonumber(ARGV[2])
local live_read_at, n_live = tonumber(ARGV[3]), tonumber(ARGV[4])
local live = {}
for i = 1, n_live do live[ARGV[4 + i]] = true end
local next_resend = now + resend_after
local head = '0:' .. now .. ':' .. next_resend .. ':' .. #claimer .. ':' .. claimer
local first_id = 5 + n_live
local swept, expired = 0, 0
local out = {now, 0, 0}
for i = 2, #KEYS do
  local rec, id = KEYS[i], ARGV[first_id + i - 2]
  local record = redis.call('GET', rec)
  if not record then
    swept = swept + redis.call('ZREM', KEYS[1], id)
  elseif string.byte(record, 1) ~= 48 then  -- state "1": published, a stray index entry
    redis.call('ZREM', KEYS[1], id)
  else
    local owned_at, owner_len, at = string.match(record, '^0:(%d+):%d+:(%d+):()')
    local body = at + tonumber(owner_len)
    local owner = string.sub(record, at, body - 1)
    local attempt, rest, expires_at = string.match(record, '^(%d+)():%a+:%-?%d+:(%-?%d+):', body)
    if tonumber(expires_at) <= now then
      redis.call('DEL', rec)
      redis.call('ZREM', KEYS[1], id)
      expired = expired + 1
    else
      local score = redis.call('ZSCORE', KEYS[1], id)
      local due = (not score) or tonumber(score) <= now
      local lapsed = not live[owner] and tonumber(owned_at) < live_read_at
      if due or lapsed then
        local claimed = head .. (tonumber(attempt) + 1) .. string.sub(record, rest)
        redis.call('SET', rec, claimed, 'KEEPTTL')
        redis.call('ZADD', KEYS[1], next_resend, id)
        out[#out + 1] = {id, owner, claimed}
      end
    end
  end
end
out[2] = swept
out[3] = expired
return out
