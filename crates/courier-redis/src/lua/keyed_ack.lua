-- ARGV: prefix, then id, key, delivery triples (the delivery: id, newline, delivery tag).
-- Settles the deliveries still leased (ack and reject alike): removing a delivery's lease tells
-- whether it was (once per batch, however often it is named); a superseded delivery is left to
-- its new holder. Returns how many.
local ids, keys = {}, {}
local leases = P .. 'leases'
for i = 2, #ARGV, 3 do
  if redis.call('ZREM', leases, ARGV[i + 2]) == 1 then
    ids[#ids + 1] = ARGV[i]
    keys[#keys + 1] = ARGV[i + 1]
  end
end
if settle_all(ids, keys) then signal() end
return #ids
