-- dedup_renew.lua: move the lease deadline of claims their owner still holds; nothing else.
--
-- For claims sent whose answer is not read yet (the consumer reads it a few polls later):
-- renewing those by claiming again could create, or take over, a key that their own answer
-- reports as held by another owner, and nobody would then hold it. This only extends a
-- claim that is already ours.
--
-- KEYS[i]      = dedup key of message i (in one hash slot on a cluster)
-- ARGV[1]      = lease length in ms (the deadline is taken from the server clock: TIME)
-- ARGV[1+i]    = owner token of message i ("scope|reader|topic|partition|offset")
-- returns      = a string with one digit per key, in KEYS order:
--                0 ABSENT        no key (not claimed yet, or gone): nothing written
--                1 RENEWED       claimed by this owner: the deadline moved, TTL kept
--                2 DONE          done (or PARTIAL): nothing written
--                3 OTHER_OWNER   claimed by another owner: nothing written

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local claimed_by = 'c|' .. string.format('%d', now + tonumber(ARGV[1])) .. '|'
local out = {}
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  local code = 0
  if value then
    local state = string.sub(value, 1, 1)
    if state == 'd' or state == 'p' then
      code = 2
    elseif string.sub(value, string.find(value, '|', 3, true) + 1) == ARGV[1 + i] then
      redis.call('SET', KEYS[i], claimed_by .. ARGV[1 + i], 'KEEPTTL')
      code = 1
    else
      code = 3
    end
  end
  out[i] = code
end
return table.concat(out)
