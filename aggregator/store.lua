-- Stores one apply call the processor computed itself (aggregator/computed.go), or refuses it: it
-- writes only when every field the computation read still holds what was read (or is still
-- absent), so a call computed from state that another writer changed since, a processor of an
-- older release included, is refused and runs apply.lua instead. Every check comes before the
-- first write, so a refused call writes nothing. In layout 11 the last two record fields read are
-- 'wtoken', the token of the computed call that last wrote the buckets, and 'written', the
-- buckets' write stamp, read in the same command as the buckets: under a head that ends with the
-- store's write count they are the only ones, standing for the buckets. Every script that writes a
-- bucket makes the stamp new (apply.lua, and this one when that field was read: one more, or
-- Redis's clock in µs when greater), so the head a call leaves always has one; a computed call
-- that writes a bucket writes a new token among its record pairs, and a write Redis lost takes its
-- token with it, which a stamp running ahead of Redis's clock could not tell.
--
-- KEYS[1] the state hash, KEYS[2] layout 10's record hash (apply.lua's KEYS[2] and KEYS[1]).
-- ARGV[1] the key TTL in ms (0: none), ARGV[2] the head's TTL stamp (server time, s), ARGV[3] the
-- number s of state fields read, ARGV[4] the number r of record fields read, ARGV[5] and ARGV[6]
-- a byte per state and record field read ('1' present, '0' absent), then the s state fields, what
-- they held (empty when absent), the r record fields, what they held, the number of state pairs
-- to set, those pairs, the number of state fields to delete (the minutes a prune passed), those
-- fields, the number of record fields to delete (layout 11's buckets a split emptied), those
-- fields, and last the record pairs to set.
-- Returns 0 when refused; when stored, the buckets' new write stamp if it made one, 1 otherwise.
local call, byte, unpack, tonumber = redis.call, string.byte, unpack, tonumber
local ttl = tonumber(ARGV[1])
local s, r = tonumber(ARGV[3]), tonumber(ARGV[4])
-- Redis's clock, read once a call (every redis.call costs the script more than the command).
local now
-- apply.lua refreshes the stamp (and the index's TTL) every half TTL by the server's clock.
if ttl > 0 then
  now = call('TIME')
  if tonumber(now[1]) - tonumber(ARGV[2]) >= ttl / 2000 then return 0 end
end
local CHUNK = 4000 -- most arguments per command (Lua's unpack limit is 8000)
local function same(key, has, from, count)
  for c = 0, count - 1, CHUNK do
    local m = math.min(CHUNK, count - c)
    local got = call('HMGET', key, unpack(ARGV, from + c, from + c + m - 1))
    for j = 1, m do
      local v = got[j]
      if byte(has, c + j) == 49 then
        if v ~= ARGV[from + count + c + j - 1] then return false end
      elseif v then return false end
    end
  end
  return true
end
local i = 7
if not same(KEYS[1], ARGV[5], i, s) then return 0 end
i = i + 2 * s
if not same(KEYS[2], ARGV[6], i, r) then return 0 end
-- Layout 11: the stamp read (0 when absent); no layout-10 record field is named 'written'.
local stamped = r > 0 and ARGV[i + r - 1] == 'written' and (tonumber(ARGV[i + 2 * r - 1]) or 0)
i = i + 2 * r
-- CHUNK values (CHUNK / 2 pairs) a command: Redis's Lua refuses to unpack 8 000, and the embedded
-- server's registry overflows near 5 100. A failing HSET would keep the records written before it.
-- f, v: a pair set with the first command.
local function hset(key, from, to, f, v)
  for c = from, to, CHUNK do
    if f then
      call('HSET', key, f, v, unpack(ARGV, c, math.min(c + CHUNK - 1, to)))
      f = nil
    else
      call('HSET', key, unpack(ARGV, c, math.min(c + CHUNK - 1, to)))
    end
  end
end
local npairs = tonumber(ARGV[i])
local sd = i + 1 + 2 * npairs -- ARGV[sd]: the number of state fields to delete
local nsdels = tonumber(ARGV[sd])
local d = sd + 1 + nsdels -- ARGV[d]: the number of record fields to delete
local ndels = tonumber(ARGV[d])
local sets = d + 1 + ndels <= #ARGV
-- The buckets' new write stamp, when the call writes a bucket.
local written
if stamped and (ndels > 0 or sets) then
  now = now or call('TIME')
  written = string.format('%d', math.max(stamped + 1, tonumber(now[1]) * 1000000 + tonumber(now[2])))
end
for c = d + 1, d + ndels, CHUNK do call('HDEL', KEYS[2], unpack(ARGV, c, math.min(c + CHUNK - 1, d + ndels))) end
if sets then
  hset(KEYS[2], d + 1 + ndels, #ARGV, written and 'written', written)
elseif written then
  call('HSET', KEYS[2], 'written', written)
end
-- As apply.lua writes the state hash: its deletes, then its sets.
for c = sd + 1, sd + nsdels, CHUNK do call('HDEL', KEYS[1], unpack(ARGV, c, math.min(c + CHUNK - 1, sd + nsdels))) end
if npairs > 0 then hset(KEYS[1], i + 1, i + 2 * npairs) end
if ttl > 0 then call('PEXPIRE', KEYS[2], ARGV[1]); call('PEXPIRE', KEYS[1], ARGV[1]) end
return written or 1
