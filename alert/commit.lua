-- Compare-and-set of one alert lifecycle record, and the queueing of its notification.
-- KEYS: record, index, then per sink: outbox list, due sorted set; last, the recently resolved
--       (a sorted set of records by when they came to rest resolved, in ms).
-- ARGV: expected rev, state, active_at, fired_at, last_true_at, resolved_at, last_sent_at (µs),
--       rule, subject, fields (JSON), linger (ms), now (ms), notification (JSON or ''),
--       is_resend (1/0), episode (JSON of the rule's kind, labels and annotations when the
--       alert fires, else ''), silent_since (µs, or '' for none), scored (the all-time scored
--       count at silent_since), then per sink: takes (1/0).
local rec = KEYS[1]
local rev = tonumber(redis.call('HGET', rec, 'rev') or '0')
if rev ~= tonumber(ARGV[1]) then
  return 0
end
redis.call('HSET', rec, 'rev', rev + 1, 'state', ARGV[2], 'active_at', ARGV[3], 'fired_at', ARGV[4],
  'last_true_at', ARGV[5], 'resolved_at', ARGV[6], 'last_sent_at', ARGV[7],
  'rule', ARGV[8], 'subject', ARGV[9], 'fields', ARGV[10])
if ARGV[15] ~= '' then
  redis.call('HSET', rec, 'episode', ARGV[15])
end
if ARGV[16] ~= '' then
  redis.call('HSET', rec, 'silent_since', ARGV[16], 'scored', ARGV[17])
end
redis.call('SADD', KEYS[2], rec)
local pending = false
local nsinks = (#KEYS - 3) / 2
for i = 1, nsinks do
  local ob, due = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  if ARGV[13] ~= '' and ARGV[17 + i] == '1' then
    -- A resend adds nothing while a notification is still waiting: that one carries the alert.
    if ARGV[14] ~= '1' or redis.call('LLEN', ob) == 0 then
      -- Bounded while the sink is down: the newest 64 transitions are kept (a receiver acts on
      -- the latest state; a flapping condition must not grow the list without end).
      if redis.call('RPUSH', ob, ARGV[13]) > 64 then
        redis.call('LTRIM', ob, -64, -1)
      end
      if not redis.call('ZSCORE', due, rec) then
        redis.call('ZADD', due, tonumber(ARGV[12]), rec)
      end
    end
  end
  if redis.call('LLEN', ob) > 0 then
    pending = true
  end
end
-- A record at rest (cleared or resolved and delivered) lingers, then expires; anything else stays.
if (ARGV[2] == 'inactive' or ARGV[2] == 'resolved') and not pending then
  redis.call('PEXPIRE', rec, tonumber(ARGV[11]))
  redis.call('SREM', KEYS[2], rec)
  local recent = KEYS[#KEYS]
  if ARGV[2] == 'resolved' then
    redis.call('ZADD', recent, tonumber(ARGV[12]), rec)
  else
    redis.call('ZREM', recent, rec)
  end
  redis.call('ZREMRANGEBYSCORE', recent, '-inf', '(' .. (tonumber(ARGV[12]) - tonumber(ARGV[11])))
else
  redis.call('PERSIST', rec)
end
return 1
