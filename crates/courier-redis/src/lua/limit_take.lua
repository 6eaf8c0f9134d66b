-- Takes up to `want` tokens of a GCRA rate-limit bucket (see courier_core::RateLimit).
-- KEYS[1]: the bucket, its `tat` in epoch microseconds of the server's clock (absent: full).
-- ARGV: emission interval E (us), burst * E (us), want, the key's TTL past `tat` (ms).
-- Returns {tat, granted, now}; the key expires once the bucket is full again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local e = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now) or now
local base = math.max(tat, now)
local granted = math.min(tonumber(ARGV[3]), math.max(0, math.floor((now + tolerance - base) / e)))
local new = base + granted * e
if granted > 0 then
  redis.call('SET', KEYS[1], string.format('%d', new), 'PX',
    math.floor((new - now) / 1000) + tonumber(ARGV[4]))
end
return {string.format('%d', new), granted, string.format('%d', now)}
