-- ARGV: prefix, consumer, id, count, new id, new key, delay ms, payload.
-- Settles the old delivery and stores the new message in one step; a delivery the consumer no
-- longer holds is left alone (its new holder handles it). Returns 1 or 0.
if not owned(ARGV[3], ARGV[2], ARGV[4]) then return 0 end
settle(ARGV[3])
add(ARGV[5], ARGV[6], ARGV[7], ARGV[8], now_ms())
signal()
return 1
