-- KEYS: stream, delayed zset. ARGV: group.
-- Undelivered + pending entries of the group, plus delayed entries.
local n = 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  n = -1
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local f = {}
    for j = 1, #g, 2 do f[g[j]] = g[j + 1] end
    if f['name'] == ARGV[1] then
      if type(f['lag']) == 'number' then
        n = f['pending'] + f['lag']
      else
        n = f['pending'] + #redis.call('XRANGE', KEYS[1], '(' .. f['last-delivered-id'], '+')
      end
    end
  end
  if n < 0 then n = redis.call('XLEN', KEYS[1]) end
end
return n + redis.call('ZCARD', KEYS[2])
