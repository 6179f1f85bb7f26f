-- outbox_write: mark acknowledged records published, and store new records as pending; any
-- number of shards, in one call (one AOF fsync for the lot).
--
-- A call has g groups, the mark groups then the put groups (g = mark_groups + put_groups), and
-- n messages to store in its put groups.
--
-- KEYS[1..]       = groups: group after group, [group: index, records...]: one shard's outbox
--                   index (sorted set: message id -> next-resend time, epoch ms), then the
--                   outbox record key (string) of each of its messages
-- ARGV[1]         = owner: producer instance id that will publish the stored records
-- ARGV[2]         = resend_after_ms: a record not marked published by now + this is due for
--                   resend
-- ARGV[3]         = keep_until: what becomes of the marked records: "published" (deleted) |
--                   "consumed" (kept as published for the consumer's end-to-end ack)
-- ARGV[4]         = mark_groups: the number of mark groups
-- ARGV[5]         = put_groups: the number of put groups
-- ARGV[6]         = max_ttl_ms: KeySpace.max_ttl_ms: no key this script writes expires after
--                   Redis's now + this, whatever a record's expires_at says (the outbox has no
--                   grace)
-- ARGV[7..6+g]    = count: per group, its number of messages
-- ARGV[7+g..6+2g] = prefix_length: per group, the length of its record keys before the message
--                   id (a record key is that prefix, then the id: the script takes the id from
--                   it)
-- ARGV[5+2g+2i]   = expires_at_ms: for stored message i = 1..n, in KEYS order, its expires_at,
--                   from the producer's clock
-- ARGV[6+2g+2i]   = body: for stored message i, its record's body (see below)
-- returns         = {now_ms, kept, deleted, missing, stored, refused...}: marked records kept
--                   as published, deleted, not found (acked by a consumer, or expired);
--                   records stored; then refused lists, for each message not stored,
--                   [refused: position, code], flat: position among the stored messages
--                   (1-based), code 0 already present (left untouched), -1 already expired
--                   (not stored): expires_at is not after Redis's now
--
-- Expiries are judged and bounded by Redis's clock (TIME), never the producer's: a record's
-- PXAT is its expires_at clamped to now + max_ttl, so a producer clock running ahead cannot
-- make a record, or the index that follows it, outlive max_ttl (docs/design.md §10, invariant
-- 6). The record keeps the expires_at it was written with (its envelope's): the TTL removes it
-- first.
--
-- Record value (one string, SET NX with PXAT = its clamped expires_at; see outbox_types.py):
--   <state>:<owned_at>:<next_resend_at>:<len(owner)>:<owner>   written here and by a claim;
--            state "0" pending, "1" published (a one-byte SETRANGE at offset 0)
--   <body> = <attempt>:<keep>:<created_at>:<expires_at>:<len(topic)>:<len(key), -1 = no key>:
--            <len(headers)>:<topic><key><headers JSON><value>   (built by the caller)
-- A pending record's id is in its shard's index with next_resend_at as score; marking removes
-- it in every case, so a published record is never resent. Publication is evidence whoever
-- published: the owner is not checked, and a missing record is never recreated (a SETRANGE
-- on it would leave a key without TTL). The index's own expiry is pushed (later only) to the
-- latest PXAT among the members it stores, so it outlives the records it indexes. On Redis
-- Cluster the caller sends one group per call (every key in one hash slot).

--!include now_ms

local now = now_ms()
local next_resend = now + tonumber(ARGV[2])
local limit = now + tonumber(ARGV[6])  -- the latest PXAT this call may write
local limit_text = string.format('%d', limit)
local delete = ARGV[3] == 'published'
local mark_groups, put_groups = tonumber(ARGV[4]), tonumber(ARGV[5])
local groups = mark_groups + put_groups
local key_at, arg_at = 1, 7 + 2 * groups
local kept, deleted, missing = 0, 0, 0
for g = 1, mark_groups do
  local n, id_at = tonumber(ARGV[6 + g]), tonumber(ARGV[6 + groups + g]) + 1
  local ids = {}
  for i = 1, n do
    local rec = KEYS[key_at + i]
    ids[i] = string.sub(rec, id_at)
    if not delete and redis.call('EXISTS', rec) == 1 then
      redis.call('SETRANGE', rec, 0, '1')
      kept = kept + 1
    end
  end
  for j = 1, n, 1000 do  -- in slices: Lua's C stack is limited
    local last = math.min(j + 999, n)
    if delete then
      deleted = deleted + redis.call('DEL', unpack(KEYS, key_at + j, key_at + last))
    end
    redis.call('ZREM', KEYS[key_at], unpack(ids, j, last))
  end
  missing = missing + n
  key_at = key_at + 1 + n
end
local out = {now, kept, deleted, missing - kept - deleted, 0}
local head = '0:' .. now .. ':' .. next_resend .. ':' .. #ARGV[1] .. ':' .. ARGV[1]
local stored, pos = 0, 0
for g = 1, put_groups do
  local index, n = KEYS[key_at], tonumber(ARGV[6 + mark_groups + g])
  local id_at = tonumber(ARGV[6 + groups + mark_groups + g]) + 1
  local max_exp = 0  -- the latest PXAT written in this group
  local members = {}  -- score, member pairs: one ZADD per group
  for i = 1, n do
    pos = pos + 1
    local rec, pxat = KEYS[key_at + i], ARGV[arg_at]
    local expires_at = tonumber(pxat)
    if expires_at <= now then
      out[#out + 1] = pos
      out[#out + 1] = -1
    else
      if expires_at > limit then  -- stamped by a clock ahead of Redis's
        expires_at, pxat = limit, limit_text
      end
      if redis.call('SET', rec, head .. ARGV[arg_at + 1], 'PXAT', pxat, 'NX') then
        members[#members + 1] = next_resend
        members[#members + 1] = string.sub(rec, id_at)
        if expires_at > max_exp then max_exp = expires_at end
        stored = stored + 1
      else
        out[#out + 1] = pos
        out[#out + 1] = 0
      end
    end
    arg_at = arg_at + 2
  end
  for j = 1, #members, 1000 do
    redis.call('ZADD', index, unpack(members, j, math.min(j + 999, #members)))
  end
  if max_exp > 0 then
    local idx_exp = redis.call('PEXPIRETIME', index)
    if idx_exp == -1 or idx_exp < max_exp then
      redis.call('PEXPIREAT', index, max_exp)
    end
  end
  key_at = key_at + 1 + n
end
out[5] = stored
return out
