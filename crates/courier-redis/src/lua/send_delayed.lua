-- KEYS: stream, delayed zset, delayed data hash. ARGV: delay ms, id, payload.
return add_delayed(KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3])
