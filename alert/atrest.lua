-- Puts a record at rest once it is resolved or inactive and no sink's outbox holds anything:
-- it lingers, leaves the index and, resolved, is listed as recently resolved. Appended to the
-- scripts that empty outboxes (ack.lua, forgetting a sink), with their KEYS and ARGV:
-- KEYS: due sorted set, an outbox, record, index, the recently resolved, then every sink's outbox.
-- ARGV[3]: now (ms), ARGV[4]: linger (ms).
local state = redis.call('HGET', KEYS[3], 'state')
if state == 'inactive' or state == 'resolved' then
  for i = 6, #KEYS do
    if redis.call('LLEN', KEYS[i]) > 0 then
      return 1
    end
  end
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]))
  redis.call('SREM', KEYS[4], KEYS[3])
  if state == 'resolved' then
    redis.call('ZADD', KEYS[5], tonumber(ARGV[3]), KEYS[3])
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', '(' .. (tonumber(ARGV[3]) - tonumber(ARGV[4])))
end
return 1
