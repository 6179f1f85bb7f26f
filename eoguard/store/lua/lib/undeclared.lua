-- lib/undeclared.lua: reading keys a script does not declare in KEYS, safely on Redis Cluster.
--
-- Redis routes a script by its declared keys only. During a slot migration a key it did not
-- declare may be on the other node: on the migrating node, touching it fails the command (and
-- a write made before it stays); on the importing node it reads as missing. So a script reads
-- such keys before its first write (these functions), trusts a missing one only when the
-- caller declared it after all (Redis then ran the call where the key lives, or answered
-- TRYAGAIN), and otherwise asks the caller to call again with it declared: the script returns
-- undeclared_asked() before writing anything.

local undeclared_need, undeclared_seen, undeclared_keys = {}, {}, nil

local function undeclared_missing(name)
  if undeclared_keys == nil then -- built once, and only when a key is missing: rare
    undeclared_keys = {}
    for k = 1, #KEYS do undeclared_keys[KEYS[k]] = true end
  end
  if not undeclared_keys[name] then undeclared_need[#undeclared_need + 1] = name end
end

-- GET of an undeclared key: its value, or false (absent, or asked for)
local function undeclared_get(name)
  local value = undeclared_seen[name]
  if value == nil then
    value = redis.pcall('GET', name)
    if type(value) == 'table' then -- an error: the key lives on another node now
      undeclared_missing(name)
      value = false
    elseif not value then
      undeclared_missing(name)
    end
    undeclared_seen[name] = value
  end
  return value
end

-- PEXPIRETIME of an undeclared key: -2 when absent (or asked for)
local function undeclared_expiry(name)
  local at = redis.pcall('PEXPIRETIME', name)
  if type(at) == 'table' or at == -2 then
    undeclared_missing(name)
    return -2
  end
  return at
end

-- nil when every undeclared key read was found or declared; else the reply that asks for them
local function undeclared_asked()
  if #undeclared_need == 0 then return nil end
  local out = {'?'}
  for k = 1, #undeclared_need do out[k + 1] = undeclared_need[k] end
  return out
end
