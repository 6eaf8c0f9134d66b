-- KEYS: stream. ARGV: group, consumer, delete (1/0), then id, count pairs.
-- Acks (and deletes) the entries this consumer still owns; others are left alone.
local ids = {}
for i = 4, #ARGV, 2 do
  if owned(KEYS[1], ARGV[1], ARGV[i], ARGV[2], ARGV[i + 1]) then ids[#ids + 1] = ARGV[i] end
end
if #ids > 0 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ids))
  if ARGV[3] == '1' then redis.call('XDEL', KEYS[1], unpack(ids)) end
end
return #ids
