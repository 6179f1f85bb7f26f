-- dedup_claim.lua: claim a batch's messages in ONE consumer scope under the batch's token
-- (dedup v2: the lease and the done mark are the batch's, one record per shard).
--
-- The claims come in g groups, one per shard: on Redis Cluster g = 1 (a call touches one hash
-- slot); on a single node one call serves every shard of the batch.
-- KEYS[1..g]   = the batch record of (scope, token, shard) of each group: KeySpace.dedup_batch
-- KEYS[g+1..]  = the claim keys (KeySpace.dedup(scope, id)), group after group
-- ARGV[1]      = token: unique per claim pass, no '|'
-- ARGV[2]      = lease length in ms (the deadline is taken from the server clock: TIME)
-- ARGV[3]      = grace in ms: the claim key of a message expires at expires_at + grace
-- ARGV[4]      = max_ttl in ms: no key outlives now + max_ttl + grace, whatever a record says
-- ARGV[5]      = g
-- ARGV[3+3j]   = for group j = 1..g: the batch record key of its scope and shard without the
--                token (the record of a token a claim key names is that .. token: same hash
--                tag, same slot; with the next, the keys these scripts use that KEYS does not
--                list)
-- ARGV[4+3j]   = for group j: the re-owned hash key of its scope and shard without the token
--                (KeySpace.dedup_reowned)
-- ARGV[5+3j]   = for group j: its number of claims
-- then, for each claim i in KEYS order, two arguments: its position (its record as this
--                reader sees it: KeySpace.position) and its expires_at + grace, epoch ms (its
--                key's PXAT, computed by the caller so this loop formats no number per key)
-- returns      = {codes, busy}: codes is a string with one digit per claim, in KEYS order;
--                busy lists, for each BUSY claim in order, two items: the lease left in ms
--                and the token of the batch holding it:
--                0 NEW         absent -> claimed; or held at another position by a batch
--                              whose lease lapsed (or whose record is gone) -> taken over
--                1 MINE        held at this same position (this reader reads this record
--                              again) by a batch not done -> now under this token; the key
--                              is noted in the holder's re-owned hash (claim key -> position),
--                              so the holder's done marks take it back if they land first
--                2 DONE_HERE   held at this same position by a done batch: handled already
--                              (a consumer skips it; a Spark replay keeps its row)
--                3 DUPLICATE   held at another position by a done batch, or PARTIAL there
--                4 BUSY        held at another position by a batch whose lease is live
--                5 EXPIRED     expires_at has passed by the server clock; nothing written
--                6 PARTIAL     marked PARTIAL at this same position (its effects half applied
--                              by an earlier attempt): dead-letter it, never handle it
--                7 STALE       this token's batch is done: nothing is claimed under it
--
-- A claim writes one key per message; each group's batch record ("o|<deadline>") is written
-- once per call, its TTL moved to the latest claim key it covers (later only), so it outlives
-- them.

--!include now_ms
--!include dedup_values

local now = now_ms()
local token, lease_ms, grace_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local limit = now + tonumber(ARGV[4]) + grace_ms
local groups = tonumber(ARGV[5])
local open = 'o|' .. string.format('%d', now + lease_ms)
local claimed_by = 'c|' .. token .. '|'
local codes, busy = {}, {}
local i, a = 0, 6 + 3 * groups -- the claim (index into codes) and its first argument

for j = 1, groups do
  local records, reowned, count = ARGV[3 + 3 * j], ARGV[4 + 3 * j], tonumber(ARGV[5 + 3 * j])
  local own = redis.call('GET', KEYS[j])
  local stale = own ~= false and string.sub(own, 1, 1) == 'd'
  local latest = 0 -- the latest PXAT of a claim key written under the token in this group
  for _ = 1, count do
    i = i + 1
    local key, position, pxat = KEYS[groups + i], ARGV[a], ARGV[a + 1]
    a = a + 2
    local at = tonumber(pxat)
    local code = 0
    if at - grace_ms <= now then
      code = 5
    else
      if at > limit then
        at = limit
        pxat = string.format('%d', limit)
      end
      if not stale and redis.call('SET', key, claimed_by .. position, 'NX', 'PXAT', pxat) then
        if at > latest then latest = at end
      else
        local value = redis.call('GET', key)
        if not value then -- only when stale: absent, and nothing may be claimed under the token
          code = 7
        else
          local state, holder, held_at = parse_claim(value)
          if state == 'p' then
            code = held_at == position and 6 or 3
          else
            local batch, left = 'live', lease_ms -- our own batch: claiming now, so live
            if holder ~= token then
              batch, left = batch_state(redis.call('GET', records .. holder), now)
            elseif stale then
              batch = 'done'
            end
            if batch == 'done' then
              code = held_at == position and 2 or 3
            elseif held_at ~= position and batch == 'live' then
              code = 4
              busy[#busy + 1] = left
              busy[#busy + 1] = holder
            elseif stale then
              code = 7
            else -- MINE (same position), or taken over (lapsed): under this token now
              code = held_at == position and 1 or 0
              local expire_at = redis.call('PEXPIRETIME', key)
              if holder ~= token then
                redis.call('SET', key, claimed_by .. position, 'KEEPTTL')
                if code == 1 then -- re-owned from a pass that may still be done first
                  local taken = reowned .. holder
                  redis.call('HSET', taken, key, position)
                  if redis.call('PEXPIRETIME', taken) < expire_at then
                    redis.call('PEXPIREAT', taken, expire_at)
                  end
                end
              end
              if expire_at > latest then latest = expire_at end
            end
          end
        end
      end
    end
    codes[i] = code
  end
  if latest > 0 then
    if own then
      redis.call('SET', KEYS[j], open, 'KEEPTTL')
      redis.call('PEXPIREAT', KEYS[j], latest, 'GT')
    else
      redis.call('SET', KEYS[j], open, 'PXAT', latest)
    end
  end
end
return {table.concat(codes), busy}
