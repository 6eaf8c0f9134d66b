-- ARGV: prefix, id, key, delivery, new id, new key, delay ms, payload.
-- Settles the old delivery and stores the new message in one step; a delivery no longer leased
-- is left alone (its new holder handles it). Returns 1 or 0.
if redis.call('ZREM', P .. 'leases', ARGV[4]) == 0 then return 0 end
settle_all({ARGV[2]}, {ARGV[3]})
add(ARGV[5], ARGV[6], ARGV[7], ARGV[8], now_ms())
signal()
return 1
