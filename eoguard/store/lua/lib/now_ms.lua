-- lib/now_ms.lua: the server clock in epoch ms (leases and expiries are judged by Redis's
-- clock, never a client's).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
