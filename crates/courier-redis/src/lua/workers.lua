-- The worker registry (shared by its scripts). KEYS: the workers hash (field = worker id, value =
-- its record as JSON), the stop set (ids asked to stop). Times are the server's, in epoch ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The record JSON without times (an object) with the two times appended.
local function with_times(json, started, beat)
  return string.sub(json, 1, -2) .. ',"started_at_ms":' .. string.format('%d', started)
    .. ',"last_heartbeat_ms":' .. string.format('%d', beat) .. '}'
end

-- A stored record's field as a number, or nil when the record does not decode.
local function field(value, name)
  local ok, record = pcall(cjson.decode, value)
  if ok and type(record) == 'table' then
    return tonumber(record[name])
  end
  return nil
end
