-- Converts one aggregate from state layout 10 to layout 11 (run after packed_records.lua and
-- layout10to11.lua) for an online migration (aggregator/migrate.go), in steps of bounded work
-- while batches keep reaching it (layout10to11.lua says how):
--   ARGV[1] 'begin': the head's byte 10 becomes 12 and an empty packed store is made (a head
--     already at 12 is a conversion resumed, kept as it is);
--   ARGV[1] 'copy', then n record fields and their n fingerprints (computed by the caller: the
--     secret stays out of Redis's scripts): the records of those fields that the record hash
--     holds are copied into the packed store and listed in the index beside layout 10's;
--   ARGV[1] 'finish': once the packed store holds as many records as the record hash (it holds
--     no other), the hours become day fields, the index beside layout 10's replaces it, the head
--     says 11 with the store's shape, and the record hash is deleted.
-- KEYS are apply.lua's: the record hash, the state hash, the packed store, the sorted set of index
-- groups. Returns {'begun'}, {'copied', records}, {'converted', records}, {'short', held, copied}
-- (finish found records not copied yet: copy them again), {'layout11'} when the head already says
-- 11, or {'absent'} when the aggregate has no head. A state layout 10 could not have written is
-- refused with an error, and nothing written.
local HEADLEN, CHUNK = 2 + 21 * 7, 4000
local opps, st, packed, listed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local call, byte, sub, char, fmt, match = redis.call, string.byte, string.sub, string.char, string.format, string.match
local min, max = math.min, math.max
local struct = rawget(_G, 'struct')
if not struct then error('convert needs the struct library of Redis') end
local spack, sunpack = struct.pack, struct.unpack
local X = layout10to11(spack, sunpack)
local op = ARGV[1]

local head = call('HGET', st, 'H')
if not head then return {'absent'} end
if byte(head, 1) == 11 then return {'layout11'} end
if #head ~= HEADLEN or (byte(head, 1) ~= 10 and byte(head, 1) ~= 12) then error('state field H is no head of layout 10') end
local gspan = byte(head, 2) * X.HOUR
local ttl = call('PTTL', st)

if op == 'begin' then
  if byte(head, 1) == 12 then return {'begun'} end
  call('DEL', packed)
  call('HSET', st, 'H', char(12) .. sub(head, 2), 'M', '0,0,0')
  return {'begun'}
end
if byte(head, 1) ~= 12 then error('aggregate is not being converted: begin first') end
local sL, sp, sn = X.shape(st, packed)

if op == 'copy' then
  local n = (#ARGV - 1) / 2
  if n == 0 then return {'copied', '0'} end
  local fields, fps = {}, {}
  for i = 1, n do fields[i] = ARGV[1 + i] end
  local got = call('HMGET', opps, unpack(fields))
  local store = newPackedRecords(packed, X.RLEN, sL, sp, sn)
  local recs, keep, entries = {}, {}, {}
  for i = 1, n do
    if got[i] then
      local rec, wd, zd = X.record(fields[i], got[i], gspan)
      local fp = ARGV[1 + n + i]
      keep[#keep + 1] = fp; recs[#recs + 1] = rec
      entries[#entries + 1] = {wd, fp}
      if zd ~= wd then entries[#entries + 1] = {zd, fp} end
    end
  end
  local sets = {}
  X.shadow(st, entries, sets)
  -- The writes, after every read and check.
  store.getAll(keep, 1, #keep, {})
  for i, fp in ipairs(keep) do store.put(fp, recs[i]) end
  store.flush()
  local L, p, m = store.shape()
  sets[#sets + 1] = 'M'; sets[#sets + 1] = fmt('%d,%d,%d', L, p, m)
  for i = 1, #sets, CHUNK do call('HSET', st, unpack(sets, i, min(i + CHUNK - 1, #sets))) end
  if ttl > 0 and m > 0 then call('PEXPIRE', packed, ttl) end
  return {'copied', fmt('%d', #keep)}
end

if op ~= 'finish' then error('convert: no operation ' .. tostring(op)) end
local held = call('HLEN', opps)
if held ~= sn then return {'short', fmt('%d', held), fmt('%d', sn)} end

-- Hours: h<hour> (the byte 1 or 2 for loose, then C,P,U,a,b in 5 bytes each) into d<day>, whose
-- entries are a byte (hour of the day, 32 when loose, 64 times the counts' width code), then C,P,U
-- in 1, 2, 3 or 5 bytes and a, b in 4, in hour order (apply.lua, dayOf). Index: layout 10's
-- groups and chunks go, the ones beside them take their names.
local HFMT = {[0] = '<I1I1I1I4I4', '<I2I2I2I4I4', '<I3I3I3I4I4', '<I5I5I5I4I4'}
local hourFields, oldIndex, newIndex, newGroups = {}, {}, {}, {}
for _, k in ipairs(call('HKEYS', st)) do
  if match(k, '^h%-?%d+$') then hourFields[#hourFields + 1] = k
  elseif match(k, '^i%-?%d+$') or match(k, '^i%-?%d+%.%d+$') then oldIndex[#oldIndex + 1] = k
  elseif match(k, '^j%-?%d+$') or match(k, '^j%-?%d+%.%d+$') then
    newIndex[#newIndex + 1] = k
    if not match(k, '%.') then newGroups[#newGroups + 1] = sub(k, 2) end
  elseif k ~= 'H' and k ~= 'v' and k ~= 'enc' and k ~= 'M' and not match(k, '^m%-?%d+$') then
    -- Nothing else is layout 10's or the conversion's: carried over, it could read as layout 11's.
    error('state field ' .. k .. ' is no field of layout 10')
  end
end
local function hmget(fs)
  local out = {}
  for i = 1, #fs, CHUNK do
    local got = call('HMGET', st, unpack(fs, i, min(i + CHUNK - 1, #fs)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end
local sets, dels = {}, {}
local days, dayList = {}, {}
for i, v in ipairs(hmget(hourFields)) do
  local f = hourFields[i]
  local h = tonumber(sub(f, 2))
  local kind = byte(v, 1)
  if #v ~= 26 or (kind ~= 1 and kind ~= 2) then error('state field ' .. f .. ' is no hour of layout 10') end
  local c, p, u, a, b = sunpack('<I5I5I5I5I5', v, 2)
  local top = max(c, p, u)
  if top == 0 or a > b or b >= X.HOUR then error('state field ' .. f .. ' is no hour of layout 10') end
  local code = top < 256 and 0 or top < 65536 and 1 or top < 16777216 and 2 or 3
  local d = (h - h % 24) / 24
  if not days[-d] then days[-d] = {}; dayList[#dayList + 1] = d end
  days[-d][#days[-d] + 1] = {h % 24, char(h % 24 + (kind == 2 and 32 or 0) + 64 * code) .. spack(HFMT[code], c, p, u, a, b)}
  dels[#dels + 1] = f
end
for _, d in ipairs(dayList) do
  local es = days[-d]
  table.sort(es, function(x, y) return x[1] < y[1] end)
  local parts = {}
  for j, e in ipairs(es) do parts[j] = e[2] end
  sets[#sets + 1] = fmt('d%d', d); sets[#sets + 1] = table.concat(parts)
end
local moved = hmget(newIndex)
local renamed = {}
for i, f in ipairs(newIndex) do
  local v = moved[i]
  if not match(f, '%.') and (#v < 16 or byte(v, 1) ~= 0) then error('state field ' .. f .. ' is no index group of this layout') end
  local to = 'i' .. sub(f, 2)
  renamed[to] = true
  sets[#sets + 1] = to; sets[#sets + 1] = moved[i]
  dels[#dels + 1] = f
end
for _, f in ipairs(oldIndex) do
  if not renamed[f] then dels[#dels + 1] = f end
end

-- The writes, after every read and check.
sets[#sets + 1] = 'H'; sets[#sets + 1] = char(11) .. sub(head, 2) .. spack('<I7I7I7I7', sL, sp, sn, 0)
dels[#dels + 1] = 'M'
for i = 1, #dels, CHUNK do call('HDEL', st, unpack(dels, i, min(i + CHUNK - 1, #dels))) end
for i = 1, #sets, CHUNK do call('HSET', st, unpack(sets, i, min(i + CHUNK - 1, #sets))) end
-- Every group the new index lists is in the sorted set, so that garbage collection visits it (a
-- record copied after its group was collected, whose horizon has expired, is found there).
local zs = {}
for _, g in ipairs(newGroups) do zs[#zs + 1] = g; zs[#zs + 1] = g end
for i = 1, #zs, CHUNK do call('ZADD', listed, unpack(zs, i, min(i + CHUNK - 1, #zs))) end
if ttl > 0 then
  if sn > 0 then call('PEXPIRE', packed, ttl) end
  if #zs > 0 and call('PTTL', listed) < 0 then call('PEXPIRE', listed, 2 * ttl) end
end
call('DEL', opps)
return {'converted', fmt('%d', sn)}
