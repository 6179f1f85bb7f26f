-- dedup_release.lua: give claims of a batch back (records dropped on a revoke), only those
-- still naming its token; the batch itself goes on (its other claims are untouched).
--
-- The claims come in g groups, one per shard (g = 1 on Redis Cluster, as in dedup_claim.lua);
-- n claims in all.
--
-- KEYS[1..g]     = record: the batch record of (scope, token, shard) of each group:
--                  KeySpace.dedup_batch
-- KEYS[1+g..g+n] = claim_key: the claim keys, group after group
-- ARGV[1]        = token
-- ARGV[2]        = groups: g
-- ARGV[3..2+g]   = count: per group, its number of claims
-- returns        = codes: a string with one digit per claim key, in order:
--                  0 OK            the claim named the token and is deleted
--                  1 NOT_OWNED     absent, or naming another token: nothing changed
--                  2 ALREADY_DONE  the batch is done, or the key is PARTIAL: the key stays (it
--                                  keeps catching duplicates)

--!include dedup_values

local token, groups = ARGV[1], tonumber(ARGV[2])
local out = {}
local i = 0
for j = 1, groups do
  local record = redis.call('GET', KEYS[j])
  local done = record ~= false and string.sub(record, 1, 1) == 'd'
  for _ = 1, tonumber(ARGV[2 + j]) do
    i = i + 1
    local key = KEYS[groups + i]
    local value = redis.call('GET', key)
    local code = 1
    if value then
      local state, holder = parse_claim(value)
      if holder == token then
        if state == 'p' or done then
          code = 2
        else
          redis.call('DEL', key)
          code = 0
        end
      end
    end
    out[i] = code
  end
end
return table.concat(out)
