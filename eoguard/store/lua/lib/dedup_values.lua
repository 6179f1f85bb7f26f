-- lib/dedup_values.lua: reading the values of the dedup v2 keys (written by the scripts only).
--
-- Claim key:    "c|<token>|<position>"  claimed under <token>: its state is its batch record's
--               "p|<token>|<position>"  done with effects partially applied: done for every reader
-- <position> is the record as one reader sees it (KeySpace.position: reader, topic, partition,
-- offset, length-prefixed, so two positions are equal exactly when their strings are); a
-- token holds no '|', so the value splits at its second '|'.
-- Batch record: "o|<deadline_ms>"       open: the lease runs until <deadline_ms> (Redis clock)
--               "d|<done_at_ms>"        done: every claim still naming the token is done

-- state ('c' or 'p'), token, position of a claim key's value
local function parse_claim(value)
  local sep = string.find(value, '|', 3, true)
  return string.sub(value, 1, 1), string.sub(value, 3, sep - 1), string.sub(value, sep + 1)
end

-- 'done', 'live' or 'lapsed' (a missing record is lapsed: never done), and the lease left in ms
local function batch_state(record, now)
  if not record then return 'lapsed', 0 end
  if string.sub(record, 1, 1) == 'd' then return 'done', 0 end
  local left = tonumber(string.sub(record, 3)) - now
  if left > 0 then return 'live', left end
  return 'lapsed', 0
end
