-- ARGV: prefix, consumer, then id, count pairs. Settles the deliveries the consumer still holds
-- (ack and reject alike); a superseded delivery is left to its new holder. Returns how many.
local consumer = ARGV[2]
local ids, counts = {}, {}
for i = 3, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
  counts[#counts + 1] = ARGV[i + 1]
end
local owners = hmget(P .. 'owner', ids)
local mine, seen = {}, {}
for i, id in ipairs(ids) do
  local o, count = owners[i], counts[i]
  local holds = o and not seen[id] and ((count == '' and string.sub(o, 1, #consumer + 1) == consumer .. '\n')
    or o == consumer .. '\n' .. count)
  if holds then
    seen[id] = true
    mine[#mine + 1] = id
  end
end
if settle_all(mine) then signal() end
return #mine
