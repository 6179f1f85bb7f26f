-- dedup_done.lua: settle a batch's claims in ONE scope and ONE shard (one hash slot) and mark
-- the batch done, applying each handled message's Redis-side effects in the same atomic step
-- (the exactly-once path for Redis-transactional handlers). Fenced per key: only claim keys
-- still naming the token are touched.
--
-- The claims come in g groups, one per shard: on Redis Cluster g = 1 (a call touches one hash
-- slot); on a single node one call serves every shard of the batch.
-- KEYS[1..g]   = the batch record of (scope, token, shard) of each group: KeySpace.dedup_batch
-- KEYS[g+1..g+n] = the claim keys of every message the batch claimed, group after group
-- KEYS[g+n+1..]  = effect keys the messages' commands write (on Redis Cluster: the same hash
--                slot, which is why handlers build them with the claim key's hash tag); never
--                a dedup key (a claim key or batch record under KEYS[1]'s prefix, of any scope
--                or message): a command on one is refused (EFFECT_ERROR)
-- ARGV[1]      = token
-- ARGV[2]      = g
-- ARGV[3]      = n
-- ARGV[3+j]    = for group j = 1..g: its number of claims
-- ARGV[4+g]    = '1' when every message was handled and none has effects (the common case:
--                then one argument per message follows: its position); '0' otherwise, and
--                then for each message i = 1..n, in order: its position, handled ('1') or let
--                go ('0': failed, refused, dropped), command count c, and c commands, each:
--                NAME, index of its key in KEYS, argument count a, a arguments
--                (lib/effects.lua says which commands and options)
-- returns      = {codes, details}: codes is a string with one digit per message, in order;
--                details lists, for each EFFECT_ERROR and PARTIAL in order, the reason:
--                0 OK            handled and still ours: its effects applied, done with the batch
--                1 NOT_OWNED     the key names another token at another position (taken over),
--                                or the message was let go and another pass re-owned it: left alone
--                2 ALREADY_DONE  this batch was done before, or the key is PARTIAL: nothing applied
--                3 EFFECT_ERROR  a command would fail (wrong type, not an integer, overflow, bad
--                                arguments, a read of the check refused) or its first one did:
--                                nothing applied, the claim deleted (a retry claims anew)
--                4 ABSENT        no claim key (its TTL ran out, it was forgotten, a failover lost
--                                it): nothing applied; the caller claims again
--                5 PARTIAL       a later command failed although the check passed (an ACL, a case
--                                the check does not model): the ones before it ARE applied and
--                                Redis cannot roll them back, so the key is marked
--                                "p|<token>|<position>": done for every reader, never applied
--                                again; the caller dead-letters it instead of retrying
--                6 RELEASED      let go and still ours: the claim deleted (a retry claims anew)
--
-- A handled message whose key names another pass of the same position (this reader claimed
-- the record again: a rebalance, a rewind) that is not done is taken back, and settled as
-- this pass's: the first done mark of a record wins, the later ones find it ALREADY_DONE or
-- NOT_OWNED; without this, a pass that re-claimed the record and was then abandoned (its
-- partition lost, its connection timed out) would leave it never done, and lost.
--
-- A handled message without effects costs a read (one MGET per group): the batch record's
-- "d|<at>" is its done mark. The record is written last; if it is gone (its TTL, a failover) while claims still
-- name the token, it is written again with the latest TTL of those claims.

--!include now_ms
--!include dedup_values
--!include effects

local now = now_ms()
local token, groups, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local simple = ARGV[4 + groups] == '1'
local done = 'd|' .. string.format('%d', now)
local p = 5 + groups
local ours = 'c|' .. token .. '|'
local codes, details = {}, {}
local is_dedup_key, apply = nil, nil -- built for the first message with effects
local i = 0

for j = 1, groups do
  local record = redis.call('GET', KEYS[j])
  local was_done = record ~= false and string.sub(record, 1, 1) == 'd'
  local records = string.sub(KEYS[j], 1, #KEYS[j] - #token) -- this scope and shard's records
  local first, kept = i + 1, 0 -- kept: claim keys still naming the token, handled
  local size = tonumber(ARGV[3 + j])
  -- The group's claim keys read with one MGET per 1000 (a call per key costs more than the
  -- key: this is most of a done mark's work); unpack stays far below Lua's stack limit.
  local values = {}
  for from = 1, size, 1000 do
    local to = math.min(from + 999, size)
    local got = redis.call('MGET', unpack(KEYS, groups + first + from - 1, groups + first + to - 1))
    for k = 1, #got do values[from + k - 1] = got[k] end
  end
  for m = 1, size do
    i = i + 1
    local key = KEYS[groups + i]
    local mine, handled, commands = ARGV[p], true, nil
    p = p + 1
    if not simple then
      handled = ARGV[p] == '1'
      local count = tonumber(ARGV[p + 1])
      p = p + 2
      if count > 0 then
        commands = {}
        for c = 1, count do
          local nargs = tonumber(ARGV[p + 2])
          local args = {}
          for x = 1, nargs do
            args[x] = ARGV[p + 2 + x]
          end
          commands[c] = {ARGV[p], KEYS[tonumber(ARGV[p + 1])], args}
          p = p + 3 + nargs
        end
      end
    end
    local value = values[m]
    local code = 0
    if value == ours .. mine and handled and not commands and not was_done then
      kept = kept + 1 -- the common case: still ours, handled, no effects
    elseif not value then
      code = 4
    else
      local state, holder, position = parse_claim(value)
      if holder ~= token and state == 'c' and position == mine and handled and not was_done then
        if batch_state(redis.call('GET', records .. holder), now) == 'done' then
          code = 2 -- the other pass of this record was done first
        else -- taken back: this pass is done first
          redis.call('SET', key, 'c|' .. token .. '|' .. position, 'KEEPTTL')
          holder = token
        end
      end
      if code == 2 then -- nothing applied: the record's other pass settles it
        details = details
      elseif holder ~= token then
        code = 1
      elseif state == 'p' or was_done then
        code = 2
      elseif not handled then
        redis.call('DEL', key)
        code = 6
      elseif commands then
        if not apply then
          -- Every dedup key shares KEYS[1]'s prefix (which holds no ':') and its dc or db tag.
          local base = string.match(KEYS[1], '^[^:]*:')
          apply = effects_apply()
          is_dedup_key = function(name)
            local tag = string.sub(name, #base + 1, #base + 3)
            return string.sub(name, 1, #base) == base and (tag == 'dc:' or tag == 'db:')
          end
        end
        local reason
        code, reason = apply(commands, is_dedup_key, now)
        if code == 3 then
          redis.call('DEL', key)
        elseif code == 5 then
          redis.call('SET', key, 'p|' .. token .. '|' .. position, 'KEEPTTL')
        else
          kept = kept + 1
        end
        if reason then details[#details + 1] = reason end
      else
        kept = kept + 1
      end
    end
    codes[i] = code
  end
  if not was_done then
    if record then
      redis.call('SET', KEYS[j], done, 'KEEPTTL')
    elseif kept > 0 then -- the record is gone while claims name the token: written again
      local latest = 0
      for k = first, i do
        if codes[k] == 0 then
          local expire_at = redis.call('PEXPIRETIME', KEYS[groups + k])
          if expire_at > latest then latest = expire_at end
        end
      end
      redis.call('SET', KEYS[j], done, 'PXAT', latest)
    end
  end
end
return {table.concat(codes), details}
