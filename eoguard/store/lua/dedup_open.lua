-- dedup_open.lua: open the batch records of a fresh claim pass in ONE consumer scope, before
-- its new claims are written by plain `SET <claim key> c|<token>|<position> NX GET PXAT <pxat>`
-- in the same pipeline (DedupStore's claim of a fresh pass on a single node, docs/design.md
-- §4): a claim key never names a token whose record was not written first.
--
-- Sent as EVAL with its source, never EVALSHA: a server that lost its scripts (a restart with
-- the AOF) would answer NOSCRIPT and still run the SETs after it, leaving claims of a token
-- without a record, which another pass takes over as lapsed.
--
-- KEYS[1..g]    = record: the batch record of (scope, token, shard) of each group:
--                  KeySpace.dedup_batch
-- ARGV[1]        = lease_ms: lease length (the deadline is taken from the server clock: TIME)
-- ARGV[2]        = bound_ms: max_ttl + grace: no record expires later than now + this
-- ARGV[3..2+g]   = latest_pxat: per group, the latest PXAT of the claims the pass writes on it
-- returns        = {now_ms, opened}: the server clock in epoch ms; opened is 1 when every
--                  record was absent and is now "o|<now + lease_ms>" with PXAT
--                  min(latest_pxat, now + bound_ms), 0 when one exists already (the token is
--                  not fresh): then nothing is written. A group whose latest_pxat has passed
--                  gets no record: its claims are expired, and the caller deletes them.

--!include now_ms

local now = now_ms()
for j = 1, #KEYS do
  if redis.call('EXISTS', KEYS[j]) == 1 then return {now, 0} end
end
local open = 'o|' .. string.format('%d', now + tonumber(ARGV[1]))
local limit = now + tonumber(ARGV[2])
for j = 1, #KEYS do
  local at = tonumber(ARGV[2 + j])
  if at > limit then at = limit end
  if at > now then redis.call('SET', KEYS[j], open, 'PXAT', string.format('%d', at)) end
end
return {now, 1}
