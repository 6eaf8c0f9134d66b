-- Whether the pending entry `id` is delivered to `consumer` with delivery count `count`
-- ('' skips the count check). A superseded delivery (claimed by another consumer, or
-- redelivered to this one with a higher count) is not owned.
local function owned(key, group, id, consumer, count)
  local p = redis.call('XPENDING', key, group, id, id, 1)
  local e = p[1]
  if not e then return false end
  if e[2] ~= consumer then return false end
  if count ~= '' and tostring(e[4]) ~= count then return false end
  return true
end
