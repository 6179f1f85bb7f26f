-- lib/effects.lua: a Redis-transactional handler's writes, checked, then applied.
--
-- effects_apply() builds (on first use: the common no-effect path pays for none of these
-- closures and tables, which a script rebuilds at every call) and returns
-- apply(commands, is_dedup_key, now), where commands is a list of {NAME, key, args} and
-- is_dedup_key(key) tells a key eoguard's dedup state lives in (never an effect key).
--
-- NAME is one of SET INCRBY DECRBY HSET HINCRBY HDEL SADD SREM RPUSH LPUSH ZADD DEL EXPIRE
-- PEXPIRE PEXPIREAT (single-key commands; the Python side builds them). Refused: SET ... GET,
-- ZADD and EXPIRE options, DEL with more than its one key, over 7000 arguments in a command,
-- a dedup key as an effect key.
--
-- The message's commands are simulated in order before any write: the type (and, for string
-- and hash-field integers, the value) each key will hold after every earlier command, starting
-- from the current data, so commands that conflict with each other (SET k "x" then INCRBY k)
-- are refused as well. Each message is checked right before it is applied, so it sees what
-- the earlier messages of the call wrote. The check errs on the strict side where the outcome
-- depends on what it does not track (see need, expire_at and the HDEL/SREM note).

local function effects_apply()
  local BASE = 1000000000 -- an int64 is (hi, lo), value = hi * BASE + lo: exact in doubles
  local WINDOW_MS = 5000 -- an absolute expiry this close to TIME may or may not delete the key
  local MAX_ARGS = 7000 -- unpack() fails near 8000 values, which after a write would be fatal
  local ARITY = { -- command -> minimum argument count, whether they come in pairs
    SET = {1}, INCRBY = {1}, DECRBY = {1}, HSET = {2, true}, HINCRBY = {2}, HDEL = {1},
    SADD = {1}, SREM = {1}, RPUSH = {1}, LPUSH = {1}, ZADD = {2, true}, DEL = {0},
    EXPIRE = {1}, PEXPIRE = {1}, PEXPIREAT = {1},
  }
  local EXACT = {INCRBY = 1, DECRBY = 1, HINCRBY = 2, DEL = 0, EXPIRE = 1, PEXPIRE = 1,
                 PEXPIREAT = 1}
  local COLLECTION = {HSET = 'hash', HDEL = 'hash', SADD = 'set', SREM = 'set', RPUSH = 'list',
                      LPUSH = 'list', ZADD = 'zset'}

  local function in_range(hi, lo)
    if hi > 0 or (hi == 0 and lo >= 0) then
      return hi < 9223372036 or (hi == 9223372036 and lo <= 854775807)
    end
    return hi > -9223372036 or (hi == -9223372036 and lo >= -854775808)
  end

  -- Redis's string2ll: "0", or an optional '-' then digits without a leading zero, in int64.
  local function parse_int(s)
    if type(s) ~= 'string' then return nil end
    if s == '0' then return 0, 0 end
    local neg, digits = string.match(s, '^(%-?)([1-9]%d*)$')
    if not digits or #digits > 19 then return nil end
    local cut = #digits - 9
    local hi = cut > 0 and tonumber(string.sub(digits, 1, cut)) or 0
    local lo = tonumber(string.sub(digits, math.max(cut + 1, 1)))
    if neg == '-' then hi, lo = -hi, -lo end
    if not in_range(hi, lo) then return nil end
    return hi, lo
  end

  local function add(h1, l1, h2, l2)
    local hi, lo = h1 + h2, l1 + l2
    if lo >= BASE then
      hi, lo = hi + 1, lo - BASE
    elseif lo <= -BASE then
      hi, lo = hi - 1, lo + BASE
    end
    if hi > 0 and lo < 0 then -- one sign for both parts
      hi, lo = hi - 1, lo + BASE
    elseif hi < 0 and lo > 0 then
      hi, lo = hi + 1, lo - BASE
    end
    return hi, lo
  end

  local function format_int(hi, lo)
    if hi == 0 then return string.format('%d', lo) end
    return (hi < 0 and '-' or '') .. string.format('%d%09d', math.abs(hi), math.abs(lo))
  end

  -- An integer argument within [min, max] (bounds far inside int64, so no overflow), or nil.
  local function bounded(s, min, max)
    local hi, lo = parse_int(s)
    local v = hi and hi * BASE + lo
    return v and v >= min and v <= max and v or nil
  end

  -- A ZADD score as Redis's strtod takes it, stricter: no NaN, overflow, hex, blanks, "Infinity".
  local function is_score(s)
    if s == 'inf' or s == '+inf' or s == '-inf' then return true end
    local mantissa = string.match(s, '^([^eE]*)[eE][%+%-]?%d+$') or s
    if not string.match(mantissa, '^[%+%-]?%d*%.?%d*$') or not string.match(mantissa, '%d') then
      return false
    end
    local v = tonumber(s)
    return v ~= nil and v == v and v ~= math.huge and v ~= -math.huge
      and (v ~= 0 or not string.match(mantissa, '[1-9]')) -- 0 from digits: an underflow
  end

  -- The simulated state e of one key: t its type (nil: not read yet; '?': may have just
  -- expired), v its string value (nil: read it), fields the hash fields written (false:
  -- deleted), base whether what is not tracked is still the data's (false once replaced),
  -- shrunk whether HDEL/SREM may have emptied (so deleted) it.
  local function key_type(e, key)
    if e.t == nil then e.t = redis.call('TYPE', key)['ok'] end
    return e.t
  end

  local function gone(e, t)
    e.t, e.v, e.fields, e.base, e.shrunk = t, nil, {}, false, false
  end

  local function need(e, key, want)
    local have = key_type(e, key)
    if have == '?' then
      return 'the key may have just expired (an expiry within ' .. WINDOW_MS
        .. ' ms of now): only DEL or a plain SET may follow on it'
    end
    if have ~= 'none' and have ~= want then return 'key holds a ' .. have .. ', not a ' .. want end
    return nil
  end

  -- An absolute expiry at_ms set on an existing key: deleted, kept, or undecidable here (Redis
  -- compares with its own clock, not this script's TIME).
  local function expire_at(e, at_ms, now)
    if at_ms < now - WINDOW_MS then
      gone(e, 'none')
    elseif at_ms <= now + WINDOW_MS then
      gone(e, '?')
    end
  end

  local function sim_set(e, key, args, now)
    local cond, keep, expiry, at_ms = nil, false, false, nil
    local i = 2
    while i <= #args do
      local opt = string.upper(args[i])
      if (opt == 'NX' or opt == 'XX') and not cond then
        cond = opt
      elseif opt == 'KEEPTTL' and not keep and not expiry then
        keep = true
      elseif (opt == 'EX' or opt == 'PX' or opt == 'EXAT' or opt == 'PXAT') and not keep
          and not expiry then
        local ms = (opt == 'EX' or opt == 'EXAT') and 1000 or 1
        local v = bounded(args[i + 1], 1, 1e15 / ms)
        if not v then return 'invalid expire time' end
        expiry, i = true, i + 1
        if opt == 'EXAT' or opt == 'PXAT' then at_ms = v * ms end -- EX/PX > 0 never delete
      else
        return 'option ' .. opt .. ' is not supported or conflicts with another'
      end
      i = i + 1
    end
    local t = key_type(e, key)
    if (cond and (t == '?' or e.shrunk)) or (keep and t == '?') then
      return 'the key may have just been deleted, so SET ' .. (cond or 'KEEPTTL')
        .. ' is undecidable'
    end
    if (cond == 'NX' and t ~= 'none') or (cond == 'XX' and t == 'none') then
      return nil -- not set: a no-op, not an error
    end
    gone(e, 'string')
    e.v = args[1]
    if at_ms then expire_at(e, at_ms, now) end
    return nil
  end

  local function sim_incr(e, key, args, name, field)
    local by_hi, by_lo = parse_int(args[field and 2 or 1])
    if not by_hi then return 'increment is not an integer or out of range' end
    if name == 'DECRBY' then
      if by_hi == -9223372036 and by_lo == -854775808 then return 'decrement would overflow' end
      by_hi, by_lo = -by_hi, -by_lo
    end
    local err = need(e, key, field and 'hash' or 'string')
    if err then return err end
    local old = false
    if field then
      old = e.fields[field]
      if old == nil then old = e.t == 'hash' and e.base and redis.call('HGET', key, field) end
    elseif e.t == 'string' then
      if e.v == nil then e.v = redis.call('GET', key) end
      old = e.v
    end
    local hi, lo = 0, 0
    if old then
      hi, lo = parse_int(old)
      if not hi then
        return (field and 'hash ' or '') .. 'value is not an integer or out of range'
      end
    end
    hi, lo = add(hi, lo, by_hi, by_lo)
    if not in_range(hi, lo) then return 'increment or decrement would overflow' end
    if not field then
      gone(e, 'string')
      e.v = format_int(hi, lo)
    else
      if e.t == 'none' then gone(e, 'hash') end
      e.fields[field], e.shrunk = format_int(hi, lo), false
    end
    return nil
  end

  -- Why running name(key, args) after the message's earlier commands would fail, or nil; updates
  -- e, the simulated state of key.
  local function simulate(e, name, key, args, now)
    local arity = ARITY[name]
    if arity == nil then
      return 'command ' .. name .. ' is not allowed in a transactional handler'
    end
    if #args > MAX_ARGS then return 'more than ' .. MAX_ARGS .. ' arguments: split it' end
    if #args < arity[1] or (arity[2] and #args % 2 == 1)
        or (EXACT[name] and #args ~= EXACT[name]) then
      return 'wrong number of arguments (' .. #args .. ')'
    end
    if name == 'SET' then
      return sim_set(e, key, args, now)
    elseif name == 'DEL' then
      gone(e, 'none')
    elseif name == 'INCRBY' or name == 'DECRBY' then
      return sim_incr(e, key, args, name, nil)
    elseif name == 'HINCRBY' then
      return sim_incr(e, key, args, name, args[1])
    elseif COLLECTION[name] then
      local err = need(e, key, COLLECTION[name])
      if err then return err end
      for a = 1, name == 'ZADD' and #args or 0, 2 do
        if not is_score(args[a]) then
          return 'score ' .. args[a] .. ' is not a valid float (ZADD options are not supported)'
        end
      end
      if name == 'HDEL' or name == 'SREM' then
        -- The type is kept even if this empties the key: later commands are checked against
        -- both (stricter), and SET NX/XX, which depend on existence, are refused.
        e.shrunk = e.t ~= 'none'
        for a = 1, name == 'HDEL' and #args or 0 do e.fields[args[a]] = false end
      else
        if e.t == 'none' then gone(e, COLLECTION[name]) end
        e.shrunk = false -- it holds something now
        for a = 1, name == 'HSET' and #args or 0, 2 do e.fields[args[a]] = args[a + 1] end
      end
    else -- EXPIRE PEXPIRE PEXPIREAT
      local v = bounded(args[1], -1e15, 1e15)
      if not v or (name == 'EXPIRE' and math.abs(v) > 1e12) then return 'invalid expire time' end
      local t = key_type(e, key)
      if t == '?' then
        return 'the key may have just expired, so ' .. name .. ' is undecidable'
      elseif t ~= 'none' and name == 'PEXPIREAT' then
        expire_at(e, v, now)
      elseif t ~= 'none' and v <= 0 then
        gone(e, 'none') -- a relative expiry <= 0 deletes the key
      end -- on a missing key: a no-op
    end
    return nil
  end

  -- Why one of a message's commands would fail, or nil: each simulated after the ones before it.
  local function check(commands, is_dedup_key, now)
    local sim = {}
    for c = 1, #commands do
      local cmd = commands[c]
      local e = sim[cmd[2]]
      if not e then
        e = {fields = {}, base = true, shrunk = false}
        sim[cmd[2]] = e
      end
      local reason = is_dedup_key(cmd[2]) and 'a dedup key is not an effect key'
        or simulate(e, cmd[1], cmd[2], cmd[3], now)
      if reason then
        return cmd[1] .. ' ' .. cmd[2] .. ' (command ' .. c .. ' of ' .. #commands .. '): '
          .. reason
      end
    end
    return nil
  end

  -- Check then apply one message's commands: 0 all applied, 3 refused (nothing applied) or
  -- 5 partial (the commands before the failed one stay applied), and unless 0, why. The
  -- caller writes the claim key.
  local function apply(commands, is_dedup_key, now)
    local count = #commands
    -- A read the check makes can fail too (an ACL): that is a refusal, not a script error.
    local ok, reason = pcall(check, commands, is_dedup_key, now)
    if not ok then
      reason = 'checking the commands failed: ' .. tostring(type(reason) == 'table' and reason.err
                                                            or reason)
    end
    if reason then
      return 3, reason .. '; nothing applied'
    end
    for c = 1, count do
      local cmd = commands[c]
      local reply = redis.pcall(cmd[1], cmd[2], unpack(cmd[3]))
      if type(reply) == 'table' and reply['err'] then
        local failed = cmd[1] .. ' ' .. cmd[2] .. ' (command ' .. c .. ' of ' .. count
          .. ') failed: ' .. reply['err']
        if c == 1 then -- a failed command writes nothing
          return 3, failed .. '; nothing applied'
        end
        return 5, failed .. '; the ' .. (c - 1) .. ' before it stay applied; marked done'
      end
    end
    return 0, nil
  end

  return apply
end
