-- Merges graded runs into one suite's run hash, atomically. A run is replaced only by a strictly
-- newer assessment (assessed_us, then seq); running the same call twice changes nothing.
--
-- KEYS[1] hash  run field "<version>|<case>|<run_index>" -> "<result> <assessed_us> <seq> <rest…>"
-- KEYS[2] set   revived cases already announced; it expires with the hash, never before it (else
--               every revived case of an active suite would be announced again)
-- ARGV[1] key ttl in ms (0: none), then four per run: field, assessed_us, seq, value.
-- Returns one letter per run: N counted, R reassessed, D duplicate, S stale.
local runs, announced = KEYS[1], KEYS[2]
local out = {}
local n = (#ARGV - 1) / 4
for i = 0, n - 1 do
  local b = 1 + i * 4
  local field, asd, seq, value = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3]), ARGV[b + 4]
  local held = redis.call('HGET', runs, field)
  if not held then
    redis.call('HSET', runs, field, value)
    out[#out + 1] = 'N'
  else
    local ha, hs = string.match(held, '^%a (%d+) (%d+)')
    ha, hs = tonumber(ha), tonumber(hs)
    if asd > ha or (asd == ha and seq > hs) then
      redis.call('HSET', runs, field, value)
      out[#out + 1] = 'R'
    elseif asd == ha and seq == hs then
      out[#out + 1] = 'D'
    else
      out[#out + 1] = 'S'
    end
  end
end
local ttl = tonumber(ARGV[1])
if n > 0 and ttl > 0 then
  redis.call('PEXPIRE', runs, ttl)
  redis.call('PEXPIRE', announced, ttl) -- no-op while nothing was announced
end
return table.concat(out)
