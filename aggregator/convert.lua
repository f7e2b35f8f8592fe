-- Converts one aggregate from state layout 10 to layout 11 in one atomic call (run after
-- packed_records.lua), for an online migration (aggregator/migrate.go): its records move from the
-- record hash into the packed store, its hours into day fields, its id index entries become
-- fingerprint prefixes and its head says 11. Processors keep applying batches meanwhile; being one
-- call, a conversion falls wholly before or after each of theirs.
--
-- KEYS are apply.lua's: the record hash, the state hash, the packed store, the sorted set of index
-- groups. ARGV[1..n] are record fields of the record hash and ARGV[n+1..2n] their fingerprints,
-- which the caller computes (the secret never reaches Redis).
-- Returns {'converted', records}, {'layout11'} when the head already says 11, {'absent'} when the
-- aggregate has no head, or {'missing', field...}: fields the record hash holds and the caller gave
-- no fingerprint for (written since it read them), at most MISSING of them; nothing is written then.
-- A state it could not have been written by layout 10 is refused with an error, and nothing written.
local HOUR, HEADLEN, CHUNKBYTES, MISSING, CHUNK = 3600000000, 2 + 21 * 7, 480, 2000, 4000
local opps, st, packed = KEYS[1], KEYS[2], KEYS[3]
local call, byte, sub, char, fmt, match = redis.call, string.byte, string.sub, string.char, string.format, string.match
local concat, min, max = table.concat, math.min, math.max
local struct = rawget(_G, 'struct')
if not struct then error('convert needs the struct library of Redis') end
local spack, sunpack = struct.pack, struct.unpack
local n = #ARGV / 2

local head = call('HGET', st, 'H')
if not head then return {'absent'} end
if byte(head, 1) == 11 then return {'layout11'} end
if #head ~= HEADLEN or byte(head, 1) ~= 10 then error('state field H is no head of layout 10') end

-- Every record needs its fingerprint: any field the caller did not know of is returned instead.
local fpOf = {}
for i = 1, n do fpOf[ARGV[i]] = ARGV[n + i] end
local all = call('HGETALL', opps)
local missing = {'missing'}
for i = 1, #all, 2 do
  if not fpOf[all[i]] and #missing <= MISSING then missing[#missing + 1] = all[i] end
end
if #missing > 1 then return missing end

-- The records, as layout 11 stores them (aggregator/record.go): a tag (class, 0x10 seq, 0x20
-- horizon), then occurred, assessed, seq and horizon in 7 bytes each.
local CLASS = {C = 1, P = 2, U = 3}
local RLEN = {[1] = 15, [2] = 15, [3] = 15, [17] = 22, [18] = 22, [19] = 22, [33] = 22, [34] = 22,
  [35] = 22, [49] = 29, [50] = 29, [51] = 29}
local fps, recs = {}, {}
for i = 1, #all, 2 do
  local c, o, a, s, z = match(all[i + 1], '^(%a)(%x+),(%x+),?(%x*);?(%x*)$')
  if not c or not CLASS[c] then error('record ' .. all[i] .. ' is no record of layout 10') end
  local tag = CLASS[c] + (s ~= '' and 16 or 0) + (z ~= '' and 32 or 0)
  local parts = {char(tag), spack('<I7I7', tonumber(o, 16), tonumber(a, 16))}
  if s ~= '' then parts[#parts + 1] = spack('<I7', tonumber(s, 16)) end
  if z ~= '' then parts[#parts + 1] = spack('<I7', tonumber(z, 16)) end
  fps[#fps + 1] = fpOf[all[i]]
  recs[#recs + 1] = concat(parts)
end

-- The state hash's hours and index groups, read before anything is written.
local keys = call('HKEYS', st)
local hourFields, groupFields = {}, {}
for _, k in ipairs(keys) do
  if match(k, '^h%-?%d+$') then hourFields[#hourFields + 1] = k
  elseif match(k, '^i%-?%d+$') then groupFields[#groupFields + 1] = k end
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

-- Hours: h<hour> (the byte 1 or 2 for loose, then C,P,U,a,b in 5 bytes each) into d<day>, whose
-- entries are a byte (hour of the day, 32 when loose, 64 times the counts' width code), then C,P,U
-- in 1, 2, 3 or 5 bytes and a, b in 4, in hour order (apply.lua, dayOf).
local HFMT = {[0] = '<I1I1I1I4I4', '<I2I2I2I4I4', '<I3I3I3I4I4', '<I5I5I5I4I4'}
local days, dayList = {}, {}
for i, v in ipairs(hmget(hourFields)) do
  local f = hourFields[i]
  local h = tonumber(sub(f, 2))
  local kind = byte(v, 1)
  if #v ~= 26 or (kind ~= 1 and kind ~= 2) then error('state field ' .. f .. ' is no hour of layout 10') end
  local c, p, u, a, b = sunpack('<I5I5I5I5I5', v, 2)
  local top = max(c, p, u)
  if top == 0 or a > b or b >= HOUR then error('state field ' .. f .. ' is no hour of layout 10') end
  local code = top < 256 and 0 or top < 65536 and 1 or top < 16777216 and 2 or 3
  local d = (h - h % 24) / 24
  local hk = h % 24
  if not days[-d] then days[-d] = {}; dayList[#dayList + 1] = d end
  days[-d][#days[-d] + 1] = {hk, char(hk + (kind == 2 and 32 or 0) + 64 * code) .. spack(HFMT[code], c, p, u, a, b)}
  dels[#dels + 1] = f
end
for _, d in ipairs(dayList) do
  local es = days[-d]
  table.sort(es, function(x, y) return x[1] < y[1] end)
  local parts = {}
  for j, e in ipairs(es) do parts[j] = e[2] end
  sets[#sets + 1] = fmt('d%d', d); sets[#sets + 1] = concat(parts)
end

-- Index groups: each entry (a record field after its length in three hex digits) becomes the first
-- 4 bytes of its fingerprint; an entry whose record is gone finds nothing in either layout and is
-- dropped. Chunks are rewritten as apply.lua closes them.
for i, v in ipairs(hmget(groupFields)) do
  local f = groupFields[i]
  if #v < 16 or byte(v, 1) ~= 0 then error('state field ' .. f .. ' is no index group of layout 10') end
  local k, _, x = sunpack('<I5I5I5', v, 2)
  local chunks = {}
  for j = 1, k do chunks[j] = f .. '.' .. fmt('%d', j) end
  local vals = k > 0 and hmget(chunks) or {}
  vals[#vals + 1] = sub(v, 17)
  local ents, dropped = {}, 0
  for _, s in ipairs(vals) do
    if not s then error('state field ' .. f .. ' lists a chunk it does not have') end
    local pos, len = 1, #s
    while pos <= len do
      local e = pos + 2 + tonumber(sub(s, pos, pos + 2), 16)
      local fp = fpOf[sub(s, pos, e)]
      if fp then ents[#ents + 1] = sub(fp, 1, 4) else dropped = dropped + 1 end
      pos = e + 1
    end
  end
  local chunk, size, closed = {}, 0, 0
  for _, e in ipairs(ents) do
    if size + #e > CHUNKBYTES and size > 0 then
      closed = closed + 1
      sets[#sets + 1] = f .. '.' .. fmt('%d', closed); sets[#sets + 1] = concat(chunk)
      chunk, size = {}, 0
    end
    chunk[#chunk + 1] = e; size = size + #e
  end
  for j = closed + 1, k do dels[#dels + 1] = chunks[j] end
  sets[#sets + 1] = f
  sets[#sets + 1] = spack('<BI5I5I5', 0, closed, #ents, max(0, min(x - dropped, #ents))) .. concat(chunk)
end

-- The writes, after every read and check: the store, the state, the head, and the record hash gone.
call('DEL', packed)
local store = newPackedRecords(packed, RLEN, 0, 0, 0)
local absent = {}
store.getAll(fps, 1, #fps, absent)
for i, fp in ipairs(fps) do store.put(fp, recs[i]) end
store.flush()
local sL, sp, sn = store.shape()
sets[#sets + 1] = 'H'; sets[#sets + 1] = char(11) .. sub(head, 2) .. spack('<I7I7I7', sL, sp, sn)
for i = 1, #dels, CHUNK do call('HDEL', st, unpack(dels, i, min(i + CHUNK - 1, #dels))) end
for i = 1, #sets, CHUNK do call('HSET', st, unpack(sets, i, min(i + CHUNK - 1, #sets))) end
local ttl = call('PTTL', st)
if ttl > 0 and #fps > 0 then call('PEXPIRE', packed, ttl) end
call('DEL', opps)
return {'converted', fmt('%d', #fps)}
