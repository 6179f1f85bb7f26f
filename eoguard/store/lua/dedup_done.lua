-- dedup_done.lua: mark claimed messages done, fenced, applying each message's Redis-side
-- effects in the same atomic step (the exactly-once path for Redis-transactional handlers).
--
-- KEYS[1..n]   = dedup keys of the n messages (all in one hash slot)
-- KEYS[n+1..]  = effect keys the messages' commands write (on Redis Cluster: the same hash slot,
--                which is why handlers build them with the dedup key's hash tag)
-- ARGV[1]      = n
-- ARGV[2]      = 0 when no message has effects: ARGV[3..n+2] are then the n owner tokens
--                ("scope|topic|partition|offset"), in order (the common case: one arg each);
--                1 otherwise, and then for each message i = 1..n, in order: owner token,
--                command count c, and c commands, each: NAME, index of its key in KEYS,
--                argument count a, a arguments
--   NAME is one of SET INCRBY DECRBY HSET HINCRBY HDEL SADD SREM RPUSH LPUSH ZADD DEL EXPIRE
--   PEXPIRE PEXPIREAT (single-key commands; the Python side builds them)
-- returns      = {codes, details}: codes is a string with one digit per message, in order;
--                details lists, for each EFFECT_ERROR in order, the reason:
--                0 OK            was claimed by this owner: effects applied, now done
--                1 NOT_OWNED     claimed by another owner: nothing applied
--                2 ALREADY_DONE  done before (by anyone): nothing applied (fencing)
--                3 EFFECT_ERROR  a command would fail (wrong type, not an integer): nothing of
--                                this message applied, claim kept
--                4 ABSENT        no dedup key (the claim's TTL ran out, it was forgotten, or a
--                                failover lost it): nothing applied; the caller claims again
--
-- The key becomes "d|<done_at_ms>|<owner>" with its TTL kept. Without effects that is one
-- SET ... XX KEEPTTL GET, put back at once (same script, so nobody sees it) when the old value
-- shows the claim was not ours. With effects the fence is checked first, then every command
-- against the current data, then they are applied: Redis scripts do not roll back, so the
-- check runs before any write; only commands of one message that conflict with each other
-- (SET k "x" then INCRBY k) can still fail midway, reported as EFFECT_ERROR.

local expected_type = {
  SET = false, DEL = false, EXPIRE = false, PEXPIRE = false, PEXPIREAT = false,
  INCRBY = 'string', DECRBY = 'string', HSET = 'hash', HINCRBY = 'hash', HDEL = 'hash',
  SADD = 'set', SREM = 'set', RPUSH = 'list', LPUSH = 'list', ZADD = 'zset',
}

local function is_integer(value)
  return value == false or value == nil
    or (string.len(value) < 20 and string.match(value, '^%-?%d+$') ~= nil)
end

local function check(name, key, args)
  local want = expected_type[name]
  if want == nil then
    return 'command ' .. name .. ' is not allowed in a transactional handler'
  end
  if want then
    local have = redis.call('TYPE', key)['ok']
    if have ~= 'none' and have ~= want then
      return name .. ' ' .. key .. ': key holds a ' .. have .. ', not a ' .. want
    end
  end
  if (name == 'INCRBY' or name == 'DECRBY') and not is_integer(redis.call('GET', key)) then
    return name .. ' ' .. key .. ': value is not an integer'
  end
  if name == 'HINCRBY' and not is_integer(redis.call('HGET', key, args[1])) then
    return 'HINCRBY ' .. key .. ' ' .. args[1] .. ': field is not an integer'
  end
  return nil
end

local function fence(value, owner)
  if not value then
    return 4
  end
  if string.sub(value, 1, 1) == 'd' then
    return 2
  end
  local sep = string.find(value, '|', 3, true)
  return string.sub(value, sep + 1) == owner and 0 or 1
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local done_by = 'd|' .. string.format('%d', now) .. '|'
local n = tonumber(ARGV[1])
local with_effects = ARGV[2] == '1'
local p = 3
local codes, details = {}, {}

for i = 1, n do
  local key = KEYS[i]
  local owner = ARGV[p]
  local count = 0
  if with_effects then
    count = tonumber(ARGV[p + 1])
    p = p + 2
  else
    p = p + 1
  end
  local done = done_by .. owner
  local code = 0
  if count == 0 then
    local old = redis.call('SET', key, done, 'XX', 'KEEPTTL', 'GET')
    code = fence(old, owner)
    if old and code ~= 0 then
      redis.call('SET', key, old, 'KEEPTTL')
    end
  else
    local commands = {}
    for c = 1, count do
      local nargs = tonumber(ARGV[p + 2])
      local args = {}
      for a = 1, nargs do
        args[a] = ARGV[p + 2 + a]
      end
      commands[c] = {ARGV[p], KEYS[tonumber(ARGV[p + 1])], args}
      p = p + 3 + nargs
    end
    code = fence(redis.call('GET', key), owner)
    local reason = nil
    if code == 0 then
      for c = 1, count do
        reason = check(commands[c][1], commands[c][2], commands[c][3])
        if reason then
          break
        end
      end
    end
    if code == 0 and not reason then
      for c = 1, count do
        local cmd = commands[c]
        local reply = redis.pcall(cmd[1], cmd[2], unpack(cmd[3]))
        if type(reply) == 'table' and reply['err'] then
          reason = 'partially applied: ' .. cmd[1] .. ' ' .. cmd[2] .. ': ' .. reply['err']
          break
        end
      end
    end
    if reason then
      code = 3
      details[#details + 1] = reason
    elseif code == 0 then
      redis.call('SET', key, done, 'KEEPTTL')
    end
  end
  codes[i] = code
end
return {table.concat(codes), details}
