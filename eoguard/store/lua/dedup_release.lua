-- dedup_release.lua: give claims back (handler failure, partition revoked) - only if still ours.
--
-- KEYS[i]      = dedup key of message i (in one hash slot on a cluster)
-- ARGV[i]      = owner token of message i ("scope|reader|topic|partition|offset")
-- returns      = a string with one digit per key, in KEYS order:
--                0 OK            the claim was ours and is deleted
--                1 NOT_OWNED     absent, or claimed by another owner: nothing changed
--                2 ALREADY_DONE  the message is done (or PARTIAL): the key stays (it keeps catching
--                                duplicates)

local out = {}
for i = 1, #KEYS do
  local value = redis.call('GET', KEYS[i])
  local code = 1
  if value then
    local state = string.sub(value, 1, 1)
    local sep = string.find(value, '|', 3, true)
    if state == 'd' or state == 'p' then
      code = 2
    elseif string.sub(value, sep + 1) == ARGV[i] then
      redis.call('DEL', KEYS[i])
      code = 0
    end
  end
  out[i] = code
end
return table.concat(out)
