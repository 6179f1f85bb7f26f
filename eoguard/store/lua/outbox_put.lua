-- outbox_put: store a batch of outbox records of ONE shard as state=pending.
--
-- KEYS[1]   = outbox index of the shard (sorted set: message id -> next-resend time, epoch ms)
-- KEYS[1+i] = outbox record (hash) of the i-th message in ARGV
-- ARGV[1]   = owner: producer instance id that will publish these records
-- ARGV[2]   = resend_after_ms: a record not marked published by now + this is due for resend
-- ARGV[3]   = keep_until: "consumed" | "published"
-- ARGV[4..] = 8 values per message: id, topic, key ("" for no key, else "k" .. key, so an
--             empty key and no key differ), value (encoded envelope), headers (JSON of the
--             Kafka record headers, "" for none), attempt, created_at_ms, expires_at_ms
-- returns   = {now_ms, r_1, ..., r_n}: r_i = 1 stored, 0 already present (left untouched),
--             -1 already expired (not stored)
--
-- Record fields: id, topic, value, [key], [headers], state, owner, attempt, keep,
-- created_at, expires_at, owned_at, next_resend_at (also its score in the index). Every record gets PEXPIREAT =
-- its expires_at; the index's own expiry is pushed to the latest expires_at among its
-- members, so nothing outlives the messages it indexes.
local PER = 8
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner, keep = ARGV[1], ARGV[3]
local next_resend = now + tonumber(ARGV[2])
local n = (#ARGV - 3) / PER
local out = {now}
local max_exp = 0
local index_args = {}  -- score, member pairs: one ZADD for the batch
for i = 1, n do
  local a = 3 + (i - 1) * PER
  local rec = KEYS[1 + i]
  local expires_at = tonumber(ARGV[a + 8])
  if expires_at <= now then
    out[i + 1] = -1
  elseif redis.call('EXISTS', rec) == 1 then
    out[i + 1] = 0
  else
    -- One HSET per record (the optional key goes in the same call).
    local key = ARGV[a + 3]
    if key ~= '' then
      redis.call('HSET', rec, 'id', ARGV[a + 1], 'topic', ARGV[a + 2], 'value', ARGV[a + 4],
                 'state', 'pending', 'owner', owner, 'attempt', ARGV[a + 6], 'keep', keep,
                 'created_at', ARGV[a + 7], 'expires_at', ARGV[a + 8], 'owned_at', now,
                 'next_resend_at', next_resend, 'key', string.sub(key, 2))
    else
      redis.call('HSET', rec, 'id', ARGV[a + 1], 'topic', ARGV[a + 2], 'value', ARGV[a + 4],
                 'state', 'pending', 'owner', owner, 'attempt', ARGV[a + 6], 'keep', keep,
                 'created_at', ARGV[a + 7], 'expires_at', ARGV[a + 8], 'owned_at', now,
                 'next_resend_at', next_resend)
    end
    if ARGV[a + 5] ~= '' then redis.call('HSET', rec, 'headers', ARGV[a + 5]) end
    redis.call('PEXPIREAT', rec, expires_at)
    index_args[#index_args + 1] = next_resend
    index_args[#index_args + 1] = ARGV[a + 1]
    if expires_at > max_exp then max_exp = expires_at end
    out[i + 1] = 1
  end
end
for j = 1, #index_args, 1000 do  -- unpack in slices: Lua's C stack is limited
  redis.call('ZADD', KEYS[1], unpack(index_args, j, math.min(j + 999, #index_args)))
end
if max_exp > 0 then
  local idx_exp = redis.call('PEXPIRETIME', KEYS[1])
  if idx_exp == -1 or idx_exp < max_exp then
    redis.call('PEXPIREAT', KEYS[1], max_exp)
  end
end
return out
