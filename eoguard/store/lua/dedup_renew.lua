-- dedup_renew.lua: move the lease of open batches (or give them back); nothing else.
--
-- One write per batch record: every claim still naming the batch's token is renewed with it.
-- A record not written yet (its claim call not run yet), or gone, stays absent; a done one
-- stays done.
--
-- KEYS[1..n]   = record: the n batch records (KeySpace.dedup_batch); one hash slot on a cluster
-- ARGV[1]      = lease_ms: lease length in ms from now (Redis clock); 0 gives the batches
--                back: their open claims are free to take over at once
-- returns      = codes: a string with one digit per record, in KEYS order:
--                0 ABSENT        no record: nothing written
--                1 RENEWED       open: its deadline moved, TTL kept
--                2 DONE          done: nothing written

--!include now_ms

local open = 'o|' .. string.format('%d', now_ms() + tonumber(ARGV[1]))
local out = {}
for i = 1, #KEYS do
  local record = redis.call('GET', KEYS[i])
  local code = 0
  if record then
    if string.sub(record, 1, 1) == 'd' then
      code = 2
    else
      redis.call('SET', KEYS[i], open, 'KEEPTTL')
      code = 1
    end
  end
  out[i] = code
end
return table.concat(out)
