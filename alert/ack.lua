-- Acknowledges delivered notifications of one record for one sink.
-- KEYS: due sorted set, the sink's outbox, record, index, the recently resolved, then every
--       sink's outbox.
-- ARGV: delivered count, id of the first delivered, retry-at score (ms), linger (ms), id of the
--       last delivered.
local first = redis.call('LINDEX', KEYS[2], 0)
if first and cjson.decode(first).id == ARGV[2] then
  redis.call('LTRIM', KEYS[2], tonumber(ARGV[1]), -1)
elseif ARGV[5] ~= '' then
  -- The outbox was trimmed from the front while these were delivered (commit.lua keeps the
  -- newest 64): what is left of the delivered ones ends at the last delivered.
  local items = redis.call('LRANGE', KEYS[2], 0, -1)
  for i = 1, #items do
    if cjson.decode(items[i]).id == ARGV[5] then
      redis.call('LTRIM', KEYS[2], i, -1)
      break
    end
  end
end
if redis.call('LLEN', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[1], KEYS[3])
else
  redis.call('ZADD', KEYS[1], tonumber(ARGV[3]), KEYS[3])
end
-- atrest.lua follows: the record is put at rest once nothing is left to deliver.
