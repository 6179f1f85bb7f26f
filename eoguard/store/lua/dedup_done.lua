-- dedup_done.lua: settle a claim pass in ONE scope and mark its batch done, applying each
-- handled message's Redis-side effects in the same atomic step (the exactly-once path for
-- Redis-transactional handlers). Fenced per key: only claim keys still naming the token (or
-- taken back, below) are touched.
--
-- The claims come in g groups, one per shard: on Redis Cluster g = 1 (a call touches one hash
-- slot); on a single node one call serves every shard of the batch. n claim keys are passed
-- in all (none when the pass is simple, below), and e effect keys.
--
-- KEYS[1..g]           = record: the batch record of (scope, token, shard) of each group:
--                        KeySpace.dedup_batch
-- KEYS[1+g..2g]        = reowned: the re-owned hash of (scope, token, shard) of each group:
--                        KeySpace.dedup_reowned (claim key -> position, written by
--                        dedup_claim.lua)
-- KEYS[1+2g..2g+n]     = claim_key: the claim keys of every message the pass claimed, group
--                        after group; none when the pass is simple
-- KEYS[1+2g+n..2g+n+e] = effect_key: effect keys the messages' commands write (on Redis
--                        Cluster: the same hash slot, which is why handlers build them with the
--                        claim key's hash tag); never a dedup key (a claim key or batch record
--                        under KEYS[1]'s prefix, of any scope or message): a command on one is
--                        refused (EFFECT_ERROR)
-- KEYS[1+2g+n+e..]     = asked: undeclared keys this script asked for (see "or" below), if any
-- ARGV[1]              = token
-- ARGV[2]              = groups: g
-- ARGV[3]              = claims: n, the number of claim keys passed (0 when simple)
-- ARGV[4..3+g]         = count: per group, its number of claim keys passed
-- ARGV[4+g..3+2g]      = latest_pxat: per group, the latest PXAT of its claims (a lost record
--                        is written again with it), or 0 when unknown (then a lost record
--                        stays lost)
-- ARGV[4+2g]           = bound_ms: max_ttl + grace in ms: a lost record written again expires
--                        no later than Redis's now + this (the bound every claim key was
--                        clamped to)
-- ARGV[5+2g]           = simple: '1' when the pass is simple: every message handled and none
--                        with effects (the common case: nothing follows, and no claim key is
--                        read: the record's done mark covers every claim still naming the
--                        token); '0' otherwise
-- ARGV[6+2g..]         = messages: when not simple, for each message i = 1..n, in order, the
--                        row [message: position, handled, commands]: handled is '1', or '0'
--                        when let go (failed, refused, expired, dropped); then its commands,
--                        each [command: name, key, argc, args...]: key is the index of its key
--                        in KEYS, argc the number of args (lib/effects.lua says which commands
--                        and options)
-- returns              = {codes, details, reowned}: codes is a string with one digit per
--                        claim key passed, in order; details lists, for each EFFECT_ERROR and
--                        PARTIAL in order, the reason; reowned lists, for each key of the
--                        re-owned hashes this call did not settle as OK, [reowned: key, code]
--                        (code a digit), flat:
--                        0 OK            handled and ours: its effects applied, done with the
--                                        batch
--                        1 NOT_OWNED     the key names another token at another position
--                                        (taken over), or the message was let go and another
--                                        pass re-owned it: left alone
--                        2 ALREADY_DONE  this batch was done before, the key is PARTIAL, or the
--                                        pass that re-owned it was done first: nothing applied
--                        3 EFFECT_ERROR  a command would fail (wrong type, not an integer,
--                                        overflow, bad arguments, a read of the check refused)
--                                        or its first one did: nothing applied, the claim
--                                        deleted (a retry claims anew)
--                        4 ABSENT        no claim key (its TTL ran out, it was forgotten, a
--                                        failover lost it): nothing applied; the caller claims
--                                        again
--                        5 PARTIAL       a later command failed although the check passed (an
--                                        ACL, a case the check does not model): the ones before
--                                        it ARE applied and Redis cannot roll them back, so the
--                                        key is marked "p|<token>|<position>": done for every
--                                        reader, never applied again; the caller dead-letters
--                                        it instead of retrying
--                        6 RELEASED      let go and still ours: the claim deleted (a retry
--                                        claims anew)
--                      or {'?', key, ...}: nothing was written; call again with these keys
--                        declared.
--
-- A handled claim re-owned by another pass of the same position (this reader claimed the
-- record again: a rebalance, a rewind) that is not done is taken back, and settled as this
-- pass's: the first done mark of a record wins, the later ones find it ALREADY_DONE. Without
-- this, a pass that re-claimed the record and was then abandoned (its partition lost, its
-- connection timed out) would leave it never done, and lost. The claim script notes every such
-- re-own in the holder's re-owned hash, so a simple pass reads no claim key: its cost is a few
-- calls per group, whatever its size. The record is written last; if it is gone (its TTL, a
-- failover), it is written again with the group's latest claim PXAT.
--
-- Keys this script does not declare: the records of the tokens claim keys name, and (simple
-- pass) the claim keys listed in its re-owned hashes. Every one is read in the first phase,
-- before any write, and a missing one is not trusted unless declared (lib/undeclared.lua):
-- during a slot migration it may be on the other node. So an aborted call has written nothing
-- (its effects included), and the DEL of a re-owned hash never happens without its take-backs.

--!include now_ms
--!include dedup_values
--!include effects
--!include undeclared

local now = now_ms()
local token, groups, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local bound = now + tonumber(ARGV[4 + 2 * groups])
local simple = ARGV[5 + 2 * groups] == '1'
local done = 'd|' .. string.format('%d', now)
local p = 6 + 2 * groups
local ours = 'c|' .. token .. '|'
local codes, details, reowned_out = {}, {}, {}
local is_dedup_key, apply = nil, nil -- built for the first message with effects

-- Phase 1 decides, reading only; phase 2 writes what it decided.
local plans = {} -- per group: {record, was_done, taken (flat key, position), take_backs}
local todo = {} -- per claim index (non-simple): 'del', or its commands (a table), or nil
local take = {} -- per claim index: the position to take its claim back at (a SET), or nil
local held_at = {} -- per claim index with commands: the position its claim key names

-- Would this pass take back a handled claim re-owned by another pass of its position (unless
-- that pass is done)? The code of the key (OK, ALREADY_DONE, NOT_OWNED or ABSENT), and whether
-- it must be written (taken back) in phase 2.
local function take_back(value, position, records)
  if not value then return 4, false end
  local state, holder, held_at = parse_claim(value)
  if holder == token then return 0, false end
  if state ~= 'c' or held_at ~= position then return state == 'p' and 2 or 1, false end
  if batch_state(undeclared_get(records .. holder), now) == 'done' then return 2, false end
  return 0, true
end

local i = 0
for j = 1, groups do
  local record = redis.call('GET', KEYS[j])
  local was_done = record ~= false and string.sub(record, 1, 1) == 'd'
  local records = string.sub(KEYS[j], 1, #KEYS[j] - #token) -- this scope and shard's records
  local taken = redis.call('HGETALL', KEYS[groups + j]) -- re-owned claims: key, position, ...
  local size = tonumber(ARGV[3 + j])
  local backs = {} -- simple: per re-owned key, its code, and whether to take it back
  if simple then
    for t = 1, #taken, 2 do
      local code, write = 2, false
      if not was_done then code, write = take_back(undeclared_get(taken[t]), taken[t + 1], records) end
      backs[#backs + 1] = {code, write}
    end
  else
    local taken_at = {}
    for t = 1, #taken, 2 do taken_at[taken[t]] = taken[t + 1] end
    -- The group's claim keys read with one MGET per 1000 (a call per key costs more than the
    -- key); unpack stays far below Lua's stack limit.
    local first = i + 1
    local values = {}
    for from = 1, size, 1000 do
      local to = math.min(from + 999, size)
      local got = redis.call('MGET', unpack(KEYS, 2 * groups + first + from - 1,
                                            2 * groups + first + to - 1))
      for k = 1, #got do values[from + k - 1] = got[k] end
    end
    for m = 1, size do
      i = i + 1
      local key = KEYS[2 * groups + i]
      local mine, handled, commands = ARGV[p], ARGV[p + 1] == '1', nil
      local count = tonumber(ARGV[p + 2])
      p = p + 3
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
      local value, code, settled = values[m], 0, false
      if value and value ~= ours .. mine and handled and not was_done and taken_at[key] then
        local write
        code, write = take_back(value, mine, records)
        taken_at[key] = nil
        settled = code ~= 0
        if write then
          take[i] = mine
          value = ours .. mine
        end
      end
      if settled then -- by take_back (ALREADY_DONE, NOT_OWNED or ABSENT): done here
      elseif not value then
        code = 4
      else
        local state, holder, position = parse_claim(value)
        if holder ~= token then -- done first by another pass of this position, or not ours
          local first_done = position == mine
            and batch_state(undeclared_get(records .. holder), now) == 'done'
          code = first_done and 2 or 1
        elseif state == 'p' or was_done then
          code = 2
        elseif not handled then
          todo[i] = 'del'
          code = 6
        elseif commands then
          todo[i], held_at[i] = commands, position -- applied in phase 2: OK, EFFECT_ERROR or PARTIAL
        end
      end
      codes[i] = code
    end
  end
  plans[j] = {record, was_done, taken, backs}
end

local asked = undeclared_asked()
if asked then return asked end

i = 0
for j = 1, groups do
  local record, was_done, taken, backs = plans[j][1], plans[j][2], plans[j][3], plans[j][4]
  local size = tonumber(ARGV[3 + j])
  if #taken > 0 then redis.call('DEL', KEYS[groups + j]) end
  local kept = 0 -- claims of this group still naming the token, handled
  if simple then
    for t = 1, #taken, 2 do
      local code, write = backs[(t + 1) / 2][1], backs[(t + 1) / 2][2]
      if write then redis.call('SET', taken[t], ours .. taken[t + 1], 'KEEPTTL') end
      if code ~= 0 then
        reowned_out[#reowned_out + 1] = taken[t]
        reowned_out[#reowned_out + 1] = tostring(code)
      end
    end
    kept = 1 -- every claim handled: the record's done mark covers what still names the token
  else
    for _ = 1, size do
      i = i + 1
      local key = KEYS[2 * groups + i]
      if take[i] then redis.call('SET', key, ours .. take[i], 'KEEPTTL') end
      local work = todo[i]
      if work == 'del' then
        redis.call('DEL', key)
      elseif work then
        if not apply then
          -- Every dedup key shares KEYS[1]'s prefix (which holds no ':') and a dc, db, dr or
          -- dp tag.
          local base = string.match(KEYS[1], '^[^:]*:')
          apply = effects_apply()
          is_dedup_key = function(name)
            local tag = string.sub(name, #base + 1, #base + 3)
            return string.sub(name, 1, #base) == base
              and (tag == 'dc:' or tag == 'db:' or tag == 'dr:' or tag == 'dp:')
          end
        end
        local code, reason = apply(work, is_dedup_key, now)
        if code == 3 then
          redis.call('DEL', key)
        elseif code == 5 then
          redis.call('SET', key, 'p|' .. token .. '|' .. held_at[i], 'KEEPTTL')
        else
          kept = kept + 1
        end
        codes[i] = code
        if reason then details[#details + 1] = reason end
      elseif codes[i] == 0 then
        kept = kept + 1
      end
    end
  end
  if not was_done then
    if record then
      redis.call('SET', KEYS[j], done, 'KEEPTTL')
    elseif kept > 0 and ARGV[3 + groups + j] ~= '0' then -- gone while claims name the token
      local at = math.min(tonumber(ARGV[3 + groups + j]), bound)
      redis.call('SET', KEYS[j], done, 'PXAT', string.format('%d', at))
    end
  end
end
return {table.concat(codes), details, reowned_out}
