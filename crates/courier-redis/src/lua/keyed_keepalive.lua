-- ARGV: prefix, lease ms, then deliveries (id, newline, delivery tag). Extends the leases still
-- held (a superseded delivery's is its new holder's); returns 1 or 0 per delivery.
local until_ms = tostring(now_ms() + tonumber(ARGV[2]))
local named, renew, out = {}, {}, {}
for i = 3, #ARGV do named[#named + 1] = ARGV[i] end
for j, lease in ipairs(read_chunks('ZMSCORE', P .. 'leases', named)) do
  if lease then
    renew[#renew + 1] = until_ms
    renew[#renew + 1] = named[j]
    out[j] = 1
  else
    out[j] = 0
  end
end
for i = 1, #renew, CHUNK do
  redis.call('ZADD', P .. 'leases', 'XX', unpack(renew, i, math.min(#renew, i + CHUNK - 1)))
end
return out
