-- ARGV: prefix, then id, key, delay ms, payload for each message. Returns how many were stored.
local now = now_ms()
local n = 0
for i = 2, #ARGV, 4 do
  add(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], now)
  n = n + 1
end
signal()
return n
