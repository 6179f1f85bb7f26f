-- dedup_claim.lua: claim a batch of message ids of ONE consumer scope (ONE hash slot on a cluster).
--
-- KEYS[i]      = dedup key of message i (KeySpace.dedup(scope, id)); in one hash slot on a cluster
-- ARGV[1]      = lease length in ms (the deadline is taken from the server clock: TIME)
-- ARGV[2]      = grace in ms: the key of message i expires at expires_at + grace
-- ARGV[1+2i]   = owner token of message i: its source position as its reader sees it,
--                "scope|reader|topic|partition|offset"
-- ARGV[2+2i]   = expires_at + grace of message i, epoch ms: its key's PXAT (computed by the
--                caller so this loop formats no number per key)
-- returns      = {codes, busy_ms}: codes is a string with one digit per key, in KEYS order;
--                busy_ms lists, for each BUSY key in order, the lease left in ms:
--                0 NEW         absent -> claimed by us
--                1 MINE        claimed by this same owner (a redelivery of this record) -> re-owned
--                2 DONE        already done: a duplicate, skip it
--                3 BUSY        claimed by another owner whose lease is live
--                4 TAKEN_OVER  claimed by another owner whose lease lapsed -> now ours
--                5 EXPIRED     expires_at has passed by the server clock; nothing written
--                6 PARTIAL     done with partially applied effects (dedup_done.lua), by this same
--                              owner: re-read before its dead letter was sent; to others DONE
--                7 REDELIVERED done by this same owner: the record was handled and is read again
--                              (its offset commit or the done reply was lost); to others DONE
--
-- Value layout (a compact string, owner last because the owner contains '|'):
--   "c|<lease_deadline_ms>|<owner>"   claimed
--   "d|<done_at_ms>|<owner>"          done
--   "p|<done_at_ms>|<owner>"          done, its effects partially applied (to dead-letter)
-- A new key gets PXAT expires_at + grace; later transitions keep the TTL (KEEPTTL).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_ms = tonumber(ARGV[1])
local grace_ms = tonumber(ARGV[2])
local deadline = now + lease_ms
local claimed_by = 'c|' .. string.format('%d', deadline) .. '|'
local codes, busy = {}, {}

for i = 1, #KEYS do
  local key = KEYS[i]
  local owner = ARGV[1 + 2 * i]
  local pxat = ARGV[2 + 2 * i]
  local claimed = claimed_by .. owner
  local code = 0
  if tonumber(pxat) - grace_ms <= now then
    code = 5
  elseif not redis.call('SET', key, claimed, 'NX', 'PXAT', pxat) then
    -- The key exists (a NEW claim is the one SET NX above, the common case).
    local value = redis.call('GET', key)
    local sep = string.find(value, '|', 3, true)
    local held_until = tonumber(string.sub(value, 3, sep - 1))
    local state = string.sub(value, 1, 1)
    if state == 'd' then
      code = string.sub(value, sep + 1) == owner and 7 or 2
    elseif state == 'p' then
      code = string.sub(value, sep + 1) == owner and 6 or 2
    elseif string.sub(value, sep + 1) == owner then
      redis.call('SET', key, claimed, 'KEEPTTL')
      code = 1
    elseif held_until > now then
      code = 3
      busy[#busy + 1] = held_until - now
    else
      redis.call('SET', key, claimed, 'KEEPTTL')
      code = 4
    end
  end
  codes[i] = code
end
return {table.concat(codes), busy}
