-- ARGV: prefix, consumer, then id, count pairs. Settles the deliveries the consumer still holds
-- (ack and reject alike); a superseded delivery is left to its new holder. Returns how many.
local n, wake = 0, false
for i = 3, #ARGV, 2 do
  if owned(ARGV[i], ARGV[2], ARGV[i + 1]) then
    if settle(ARGV[i]) then wake = true end
    n = n + 1
  end
end
if wake then signal() end
return n
