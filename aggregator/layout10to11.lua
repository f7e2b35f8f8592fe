-- What converting an aggregate from state layout 10 to 11 takes (aggregator/migrate.go), shared by
-- the conversion (convert.lua) and by the batches that reach an aggregate while it is converted
-- (apply.lua): prepended to both, after packed_records.lua. layout10to11(spack, sunpack) makes the
-- functions, only in a call that needs them (Redis runs a script's body on every call).
--
-- While an aggregate is converted its head's first byte is 12 (layout 10, converting): layout 10
-- stays what calls read and write, and its records are copied, as layout 11 stores them, into the
-- packed store (KEYS[3]) with an id index of fingerprint prefixes beside layout 10's (fields
-- j<group> and j<group>.<k>, the format of layout 11's i<group>, each record listed under the
-- groups of its winner and its horizon); field M holds the packed store's shape ("L,p,n"). A
-- batch's call mirrors every record it writes there; garbage collection waits, so that no record
-- leaves layout 10 meanwhile and the packed store holds all of them once it holds as many.
local function layout10to11(spack, sunpack)
  local X = {}
  local byte, sub, char, match, fmt, concat = string.byte, string.sub, string.char, string.match, string.format, table.concat
  local HOUR, CHUNKBYTES = 3600000000, 480
  local CLASS = {C = 1, P = 2, U = 3}
  -- RLEN is layout 11's record length by its tag (aggregator/record.go).
  X.RLEN = {[1] = 15, [2] = 15, [3] = 15, [17] = 22, [18] = 22, [19] = 22, [33] = 22, [34] = 22,
    [35] = 22, [49] = 29, [50] = 29, [51] = 29}

  -- record returns layout 10's record text as layout 11 stores it (a tag: the class, 0x10 a seq
  -- follows, 0x20 a horizon; then occurred, assessed, seq and horizon in 7 bytes each), and the
  -- index groups (of span gspan) of its winner and its horizon.
  X.record = function(field, text, gspan)
    local c, o, a, s, z = match(text, '^(%a)(%x+),(%x+),?(%x*);?(%x*)$')
    if not c or not CLASS[c] then error('record ' .. field .. ' is no record of layout 10') end
    o = tonumber(o, 16)
    local parts = {char(CLASS[c] + (s ~= '' and 16 or 0) + (z ~= '' and 32 or 0)), spack('<I7I7', o, tonumber(a, 16))}
    if s ~= '' then parts[#parts + 1] = spack('<I7', tonumber(s, 16)) end
    local h = o
    if z ~= '' then h = tonumber(z, 16); parts[#parts + 1] = spack('<I7', h) end
    return concat(parts), math.floor(o / gspan), math.floor(h / gspan)
  end

  -- shadow appends entries (a list of {group, fingerprint}) to the index beside layout 10's,
  -- reading its open chunks of state hash st now and adding the writes to sets (a flat list of
  -- field, value pairs) for later.
  X.shadow = function(st, entries, sets)
    local byGroup, groups = {}, {}
    for _, e in ipairs(entries) do
      local d = e[1]
      local list = byGroup[-d]
      if not list then list = {}; byGroup[-d] = list; groups[#groups + 1] = d end
      list[#list + 1] = sub(e[2], 1, 4)
    end
    if #groups == 0 then return end
    local fs = {}
    for i, d in ipairs(groups) do fs[i] = fmt('j%d', d) end
    local got = redis.call('HMGET', st, unpack(fs))
    for i, d in ipairs(groups) do
      local v, k, n, cur = got[i], 0, 0, ''
      if v then
        if #v < 16 or byte(v, 1) ~= 0 then error('state field ' .. fs[i] .. ' is no index group of this layout') end
        k, n = sunpack('<I5I5', v, 2)
        cur = sub(v, 17)
      end
      local parts, size = {cur}, #cur
      for _, p in ipairs(byGroup[-d]) do
        if size + 4 > CHUNKBYTES then
          k = k + 1
          sets[#sets + 1] = fs[i] .. '.' .. fmt('%d', k); sets[#sets + 1] = concat(parts)
          parts, size = {}, 0
        end
        parts[#parts + 1] = p; size = size + 4; n = n + 1
      end
      sets[#sets + 1] = fs[i]; sets[#sets + 1] = spack('<BI5I5I5', 0, k, n, 0) .. concat(parts)
    end
  end

  -- shape reads field M of state hash st: the shape of packed store key packed while the aggregate
  -- converts. A store that holds records by its shape but is gone (it expired: nothing else
  -- deletes it) starts again empty, so that its records are copied again rather than counted as
  -- copied.
  X.shape = function(st, packed)
    local m = redis.call('HGET', st, 'M')
    local L, p, n = match(m or '', '^(%d+),(%d+),(%d+)$')
    if not L then error('state field M is no conversion of this layout') end
    L, p, n = tonumber(L), tonumber(p), tonumber(n)
    if n > 0 and redis.call('EXISTS', packed) == 0 then return 0, 0, 0 end
    return L, p, n
  end
  X.HOUR = HOUR
  return X
end
