-- dedup_claim.lua: claim a batch's messages in ONE consumer scope under the batch's token
-- (dedup v2: the lease and the done mark are the batch's, one record per shard).
--
-- The claims come in g groups, one per shard: on Redis Cluster g = 1 (a call touches one hash
-- slot); on a single node one call serves every shard of the batch. n claims in all.
--
-- KEYS[1..g]       = record: the batch record of (scope, token, shard) of each group:
--                    KeySpace.dedup_batch
-- KEYS[1+g..2g]    = passed: the passed hash of (scope, token, shard) of each group:
--                    KeySpace.dedup_passed (position -> 1: claims an attempt of this token gave
--                    up as BUSY for good)
-- KEYS[1+2g..2g+n] = claim_key: the claim keys (KeySpace.dedup(scope, id)), group after group
-- KEYS[1+2g+n..]   = asked: undeclared keys this script asked for (see "need" below), if any
-- ARGV[1]          = token: unique per claim pass, no '|'
-- ARGV[2]          = lease_ms: lease length (the deadline is taken from the server clock: TIME)
-- ARGV[3]          = grace_ms: the claim key of a message expires at expires_at + grace
-- ARGV[4]          = max_ttl_ms: no key outlives now + max_ttl + grace, whatever a record says
-- ARGV[5]          = groups: g
-- ARGV[6]          = give_up_busy: '1' when the claims left BUSY are given up for good (a Spark
--                    task's last claim of a row: every later attempt of the token then finds it
--                    PASSED, so all attempts of a task agree on it); '0' otherwise
-- ARGV[4+3j]       = record_prefix: for group j = 1..g, the batch record key of its scope and
--                    shard without the token (the record of a token a claim key names is
--                    that .. token: same hash tag, same slot)
-- ARGV[5+3j]       = reowned_prefix: for group j, the re-owned hash key of its scope and shard
--                    without the token (KeySpace.dedup_reowned)
-- ARGV[6+3j]       = claims: for group j, its number of claims
-- ARGV[5+3g+2i]    = position: for claim i = 1..n, in KEYS order, its position (its record as
--                    this reader sees it: KeySpace.position)
-- ARGV[6+3g+2i]    = pxat: for claim i, its expires_at + grace, epoch ms (its key's PXAT,
--                    computed by the caller so this loop formats no number per key)
-- returns          = {codes, busy}: codes is a string with one digit per claim, in KEYS order;
--                    busy lists, for each BUSY claim in order, [busy: lease_ms, holder]: the
--                    lease left in ms and the token of the batch holding it:
--                    0 NEW         absent -> claimed; or held at another position by a batch
--                                  whose lease lapsed (or whose record is gone) -> taken over
--                    1 MINE        held at this same position (this reader reads this record
--                                  again) by a batch not done -> now under this token; the key
--                                  is noted in the holder's re-owned hash (claim key -> position),
--                                  so the holder's done marks take it back if they land first
--                    2 DONE_HERE   held at this same position by a done batch: handled already
--                                  (a consumer skips it; a Spark replay keeps its row)
--                    3 DUPLICATE   held at another position by a done batch, or PARTIAL there
--                    4 BUSY        held at another position by a batch whose lease is live
--                    5 EXPIRED     expires_at has passed by the server clock; nothing written
--                    6 PARTIAL     marked PARTIAL at this same position (its effects half applied
--                                  by an earlier attempt): dead-letter it, never handle it
--                    7 STALE       this token's batch is done: nothing is claimed under it
--                    8 PASSED      an attempt of this token gave this position up as BUSY for good
--                                  (give_up_busy): nothing written
--                  or {'?', key, ...}: nothing was written; call again with these keys declared
--                    (appended to KEYS).
--
-- Keys this script does not declare: the record and the re-owned hash of a token a claim key
-- names. Every one is read before the first write, and a missing one is not trusted unless
-- declared: during a slot migration it may be on the other node (docs/design.md §4, "Scripts
-- on Redis Cluster"). So an aborted call has written nothing, and a call that returns has
-- judged every holder by its real record.
--
-- A claim writes one key per message; each group's batch record ("o|<deadline>") is written
-- once per call, its TTL moved to the latest claim key (or passed position) it covers (later
-- only), so it outlives them.

--!include now_ms
--!include dedup_values
--!include undeclared

local now = now_ms()
local token, lease_ms, grace_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local limit = now + tonumber(ARGV[4]) + grace_ms
local groups = tonumber(ARGV[5])
local final = ARGV[6] == '1'
local open = 'o|' .. string.format('%d', now + lease_ms)
local claimed_by = 'c|' .. token .. '|'
local codes, busy = {}, {}
local writes = {} -- per claim index: 1 new, 2 taken over, 3 re-owned (MINE), 4 passed
local values, pxats = {}, {} -- per claim index: the value written, its PXAT (new) or pass TTL
local reowned_of = {} -- per MINE claim index: the holder's re-owned hash
local plans = {} -- per group: {own, latest, passed_at, passed_ttl}
local reown_at = {} -- re-owned hash -> {its PEXPIRETIME now, the latest claim it must outlive}
local i, a = 0, 7 + 3 * groups -- the claim (index into codes) and its first argument

-- Phase 1: reads only. ------------------------------------------------------------------------
for j = 1, groups do
  local records, reowned, count = ARGV[4 + 3 * j], ARGV[5 + 3 * j], tonumber(ARGV[6 + 3 * j])
  local own = redis.call('GET', KEYS[j])
  local stale = own ~= false and string.sub(own, 1, 1) == 'd'
  local passed = KEYS[groups + j]
  local passed_at = redis.call('PEXPIRETIME', passed) -- -2: no position passed yet
  local latest, passed_ttl = 0, 0
  local base = 2 * groups + i -- KEYS index before this group's first claim key
  local current = {} -- claim key -> its value once this call's earlier claims wrote it
  local found = {}
  for from = 1, count, 1000 do -- one MGET per 1000 keys; unpack stays below Lua's stack limit
    local got = redis.call('MGET', unpack(KEYS, base + from, base + math.min(from + 999, count)))
    for k = 1, #got do found[from + k - 1] = got[k] end
  end
  for m = 1, count do
    i = i + 1
    local key, position, pxat = KEYS[base + m], ARGV[a], ARGV[a + 1]
    a = a + 2
    local at = tonumber(pxat)
    local code, write = 0, 0
    if at - grace_ms <= now then
      code = 5
    elseif passed_at ~= -2 and redis.call('HEXISTS', passed, position) == 1 then
      code = 8
    else
      if at > limit then
        at = limit
        pxat = string.format('%d', limit)
      end
      local value = current[key]
      if value == nil then value = found[m] end
      if not value then
        if stale then
          code = 7 -- nothing may be claimed under a done token
        else
          write, pxats[i] = 1, pxat
          if at > latest then latest = at end
        end
      else
        local state, holder, held_at = parse_claim(value)
        if state == 'p' then
          code = held_at == position and 6 or 3
        else
          local batch, left = 'live', lease_ms -- our own batch: claiming now, so live
          if holder ~= token then
            batch, left = batch_state(undeclared_get(records .. holder), now)
          elseif stale then
            batch = 'done'
          end
          if batch == 'done' then
            code = held_at == position and 2 or 3
          elseif held_at ~= position and batch == 'live' then
            code = 4
            busy[#busy + 1] = left
            busy[#busy + 1] = holder
            if final and holder ~= token and not stale then -- given up: no later attempt takes it
              write, pxats[i] = 4, at
              if at > passed_ttl then passed_ttl = at end
              if at > latest then latest = at end
            end
          elseif stale then
            code = 7
          else -- MINE (same position), or taken over (lapsed): under this token now
            code = held_at == position and 1 or 0
            local expire_at = redis.call('PEXPIRETIME', key)
            if holder ~= token then
              write = code == 1 and 3 or 2
              if code == 1 then -- re-owned from a pass that may still be done first
                local taken = reowned .. holder
                reowned_of[i] = taken
                local plan = reown_at[taken]
                if plan == nil then
                  plan = {undeclared_expiry(taken), 0}
                  reown_at[taken] = plan
                end
                if expire_at > plan[2] then plan[2] = expire_at end
              end
            end
            if expire_at > latest then latest = expire_at end
          end
        end
      end
      if write ~= 0 and write ~= 4 then
        values[i] = claimed_by .. position
        current[key] = values[i]
      end
    end
    codes[i] = code
    writes[i] = write
  end
  plans[j] = {own, latest, passed_at, passed_ttl}
end

local asked = undeclared_asked()
if asked then return asked end

-- Phase 2: writes. ----------------------------------------------------------------------------
i, a = 0, 7 + 3 * groups
for j = 1, groups do
  local count = tonumber(ARGV[6 + 3 * j])
  local base = 2 * groups + i
  local own, latest, passed_at, passed_ttl = plans[j][1], plans[j][2], plans[j][3], plans[j][4]
  for m = 1, count do
    i = i + 1
    local write = writes[i]
    if write == 1 then
      redis.call('SET', KEYS[base + m], values[i], 'PXAT', pxats[i])
    elseif write == 2 or write == 3 then
      redis.call('SET', KEYS[base + m], values[i], 'KEEPTTL')
      if write == 3 then redis.call('HSET', reowned_of[i], KEYS[base + m], ARGV[a]) end
    elseif write == 4 then
      redis.call('HSET', KEYS[groups + j], ARGV[a], '1')
    end
    a = a + 2
  end
  if passed_ttl > passed_at then redis.call('PEXPIREAT', KEYS[groups + j], passed_ttl) end
  if latest > 0 then
    if own then
      redis.call('SET', KEYS[j], open, 'KEEPTTL')
      redis.call('PEXPIREAT', KEYS[j], latest, 'GT')
    else
      redis.call('SET', KEYS[j], open, 'PXAT', latest)
    end
  end
end
for taken, plan in pairs(reown_at) do
  if plan[1] < plan[2] then redis.call('PEXPIREAT', taken, plan[2]) end
end
return {table.concat(codes), busy}
