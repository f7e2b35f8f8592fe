-- Applies a batch of observations to one aggregate, atomically. Running it twice with the same
-- arguments changes nothing the second time: every write is a max-merge on (assessed, seq), so a
-- retried call after a lost reply, or a redelivered batch, is recognised as duplicates.
--
-- It runs state layout 10, and layout 11 (docs/performance.md; a namespace created with
-- redis.state_layout 11) for a call whose records are binary or a read of an aggregate whose head
-- says 11. Layout 11 is layout 10 with each opportunity kept by a 16-byte keyed fingerprint of its
-- id (aggregator/fingerprint.go) and a binary record, packed into buckets in KEYS[3]
-- (packed_records.lua, prepended to this script), a day's hours in one field,
-- the store's shape in the head and an id index of 4-byte fingerprint prefixes; the notes marked
-- "Layout 11" below say where it differs.
--
-- KEYS[1] hash  record field -> "<class><occurred_us hex>,<assessed_us hex>[,<seq hex>][;<horizon_us hex>]":
--               the winning assessment, and its horizon (the greatest occurred_us of every assessment
--               applied while retained) when that is above the winner's occurred_us. A record field
--               is the opportunity id after its length in three hex digits ("014conv-0000001/turn-1"),
--               so that a run of them splits back into ids whatever bytes they hold.
-- KEYS[2] hash  the state, its numbers fixed-width binary (see Numbers below):
--               H     the head, the byte 10 (12 while a migration converts it: layout10to11.lua), the span G of an index group in hours (one byte), then
--                     21 numbers of 7 bytes: w,pm,f,l,cm,ch,rt,g,C,P,U,x1..x9,k, the newest
--                     occurred_us, minute buckets pruned up to, first and last retained
--                     occurred_us, the minute and hour the window sums x1..x9 (1h, 24h, 7d × C P U)
--                     are cached for, server time (s) of the last TTL refresh of KEYS[4], the lowest
--                     index group KEYS[4] lists, the retained counts, the first retained hour (the
--                     cut, which never moves back). The first eight and k are stored plus one, 0
--                     meaning absent (k is absent while the cut is below hour 0). G is an eighth of the retention, 1 to 255 hours,
--                     fixed when the aggregate is created (a later retention leaves it as it is).
--               v     the version, in decimal (see below; SeedVersion writes it too)
--               h<hour> the byte 1 or 2, then C,P,U,a,b in 5 bytes each: the hour's counts, and
--                     bounds of the occurred_us of its winners as offsets from the hour's start:
--                     with 1 their least and greatest, with 2 (loose: a winner at a bound left) a
--                     range that holds them, made exact only when the hour holds the first or last
--                     retained winner and that is needed (a move costs no read of the index). Only
--                     an hour that holds winners is stored. Layout 11: the hours of a day in one
--                     field, d<day>, their counts in as few bytes as they take (parseHour).
--               i<group> the byte 0, then k,n,x in 5 bytes each, then <entries>: the id index of
--                     index group <group> (hours group·G .. group·G + G - 1), the record fields
--                     whose winner or horizon entered it, so that a record can be found from the
--                     group of its winner (to make its hour's bounds exact) and
--                     from the group of its horizon (to delete it once the group has expired). k is
--                     the number of closed chunks (fields i<group>.1 .. i<group>.<k>), n the
--                     entries listed, x how many of them moves may have left without a reason to
--                     be there; <entries> is the open chunk. A chunk is closed once appending would
--                     take it past CHUNKBYTES, so an append costs a bounded copy. A batch reads and
--                     writes a group once however many of its events fall in it: a group rather
--                     than an hour, because events spread over many hours (a month of backfill)
--                     would otherwise cost an index read and write each.
--               m<minute> the byte 0 then C,P,U in 5 bytes each: counts of the last 70 minutes.
--               enc   a long value that keeps the hash a hash table (see below).
--               A minute whose counts are 0 and a group that lists nothing are deleted.
-- KEYS[3] unused by layout 10 (the id index lives in KEYS[2]); passed so that every key of the
--               aggregate is named. Layout 11: the packed record store, bucket fields of records end
--               to end, each a fingerprint and a record "<tag><occurred_us><assessed_us>[<seq>]
--               [<horizon_us>]" (aggregator/record.go: the tag's low 4 bits the class, 1 C, 2 P,
--               3 U; 0x10 a seq follows, 0x20 a horizon; every number 7 bytes little-endian), and
--               KEYS[1] is neither read nor written, so that a migration can move its records into
--               KEYS[3] while both exist. Its head is the byte 11 and 25 numbers, the 21 above, the
--               store's shape (level, split pointer, records), and the store's write count, raised
--               by every call that changes a bucket as the version is; and KEYS[3]'s field
--               'written' is the buckets' write stamp, which every such call makes new, so that
--               store.lua can check it in place of the buckets a call read. Its index entries are
--               the first 4 bytes of fingerprints (a prefix names a bucket, and in it the records
--               to check).
-- KEYS[4] sorted set of the index groups that list ids, scored by group: garbage collection visits
--               exactly those, however far apart (an event dated 1970 and one dated today make two
--               entries, not half a million hours to walk), and only once the head's lowest one has
--               wholly left retention.
-- ARGV[1] retention_us, ARGV[2] observation time at_us, ARGV[3] key ttl in ms (0: none),
-- then the n record fields (layout 11: fingerprints), then the n records as stored (encoded by the
-- caller, so a
-- byte-identical duplicate is recognised by one string comparison; the occurred time is read
-- from it).
-- Returns {outcomes, version, C, P, U, 1h C P U, 24h C P U, 7d C P U, first_us, last_us} where
-- outcomes has one letter per observation: N counted, R reassessed, D duplicate, S stale, E expired.
--
-- Retention is by whole hours: hour h is retained while h >= floor((w - retention) / 1h). When an
-- hour leaves, its bucket counts leave C P U at once. A record is kept while its horizon is retained
-- (docs/semantics.md#retention), so a redelivered older assessment still meets the identity; records
-- whose horizon expired are deleted a little per batch once their horizon's index group has wholly
-- expired (garbage collection from the id index), and until then they read as absent.
--
-- Cost: Redis work per call is a fixed handful of commands however many hours the batch touches
-- (docs/semantics.md#delivery: one script call per aggregate and batch): one HMGET of the records,
-- one HMGET of the head and of every hour, index group and recent minute the batch touches, one
-- HSET of the records, one HSET of the state, the expiries. Every write comes after every read
-- that could refuse a field, so a refused call writes nothing (Redis keeps a failed script's
-- writes).
-- Numbers: the state's are unsigned little-endian integers of fixed width (struct.pack and
-- struct.unpack, one C call per field instead of a pattern match and a conversion per number;
-- 7 bytes hold any time 1970..2200 in µs, 5 bytes any count a Redis could hold records for, and
-- every value is a non-negative integer, exact in Lua's doubles). The records' are hex, as the
-- caller encodes them. Each field name is formatted once, and no number is handed to redis.call
-- (Redis would format it with %.17g).
local MIN, HOUR = 60000000, 3600000000
local MKEEP = 70 -- minute buckets kept behind the newest event: the 1h window plus skew
local CHUNK = 4000 -- most arguments per command built in the script (Lua's unpack limit is 8000)
local CHUNKBYTES = 480 -- an index chunk is closed before it grows past this (a 512-byte allocation)

local opps, st, listed = KEYS[1], KEYS[2], KEYS[4]
-- Globals read once: a global is a table lookup by name on every use, a local a register.
local ARGV, tonumber, ipairs, unpack, type = ARGV, tonumber, ipairs, unpack, type
local min = math.min
-- A call of an online migration to layout 11 (aggregator/migrate.go) carries its observations both
-- ways, layout 10's record fields and records, then layout 11's fingerprints and records, then one
-- more argument: it applies the half its aggregate's head says (layout 11 for a new aggregate).
-- Any other call has 2n arguments after the first three. On an aggregate being converted (its
-- head's byte 12, layout10to11.lua) it applies layout 10 and mirrors what it writes: mirror maps
-- each record field to its fingerprint.
local mirror
if (#ARGV - 3) % 4 == 1 then
  local m = (#ARGV - 4) / 4
  local h = redis.call('HGET', KEYS[2], 'H')
  local hb = h and string.byte(h, 1)
  local from = (hb == 10 or hb == 12) and 4 or 4 + 2 * m
  if hb == 12 then
    mirror = {}
    for i = 1, m do mirror[ARGV[3 + i]] = ARGV[3 + 2 * m + i] end
  end
  local a = {ARGV[1], ARGV[2], ARGV[3]}
  for i = 0, 2 * m - 1 do a[4 + i] = ARGV[from + i] end
  ARGV = a
end
local ret = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local n = (#ARGV - 3) / 2
local floor, max = math.floor, math.max
local find, sub, fmt, match = string.find, string.sub, string.format, string.match
local concat = table.concat
local call = redis.call
local byte, char = string.byte, string.char
-- Layout 11: a call whose records are binary (a tag byte below 32, where layout 10's start with a
-- class letter); a read takes its aggregate's layout from the head.
local L11 = n > 0 and byte(ARGV[4 + n], 1) < 32
if L11 then opps = KEYS[3] end

-- spack and sunpack are struct.pack and struct.unpack for the formats the state uses ('<', then
-- B and I5 or I7); the embedded Redis of `repeatrate dev` (gopher-lua) has no struct library, so
-- there the same bytes are made and read in Lua.
local spack, sunpack
local struct = rawget(_G, 'struct') -- nil where absent (reading an absent global is an error)
if struct then
  spack, sunpack = struct.pack, struct.unpack
else
  local widths = {}
  local function widthsOf(f)
    local ws = widths[f]
    if not ws then
      ws = {}
      for c, d in string.gmatch(f, '([BI])(%d*)') do ws[#ws + 1] = c == 'B' and 1 or tonumber(d) end
      widths[f] = ws
    end
    return ws
  end
  spack = function(f, ...)
    local xs, out = {...}, {}
    for i, w in ipairs(widthsOf(f)) do
      local x = xs[i]
      for _ = 1, w do local b = x % 256; out[#out + 1] = char(b); x = (x - b) / 256 end
    end
    return concat(out)
  end
  sunpack = function(f, v, pos)
    pos = pos or 1
    local r = {}
    for i, w in ipairs(widthsOf(f)) do
      local x, m = 0, 1
      for j = 0, w - 1 do x = x + byte(v, pos + j) * m; m = m * 256 end
      r[i], pos = x, pos + w
    end
    r[#r + 1] = pos
    return unpack(r)
  end
end
-- The head is the byte 10, a span byte and 21 numbers of 7 bytes; a minute the byte 0 and 3 numbers
-- of 5 bytes. Their first bytes, like an hour's and a group's, are no hex digit: a field of an
-- older layout's text is refused (parseHour, parseGroup, parseMin, the head's check), not read as
-- numbers, and so is layout 8's binary (its head starts with 8, its hours have other sizes).
local HEADR, HEADW, HEADLEN = '<B' .. string.rep('I7', 21), '<BB' .. string.rep('I7', 21), 2 + 21 * 7
-- Layout 11: its head is the byte 11 and 25 numbers (HEADLEN11 + 7 bytes; a head written before
-- the 25th, the store's write count, has 24 and is read as if it were 0); RLEN is a record's length
-- (its tag included) by its tag (aggregator/record.go's recordLength); i7 reads the 7-byte number
-- of s at pos. Made only for a call of layout 11: what a call makes, every call of layout 10 would
-- pay for (Redis runs the script's body on every call).
local HEADLEN11, TAGSEQ, TAGHZN = 2 + 24 * 7, 16, 32
-- HWIDTH and HFMT are a day's hour entries' count widths by their code and the formats of an
-- entry after its first byte (parseHour); days caches the day fields a call read. layout11 makes
-- them, for a call of layout 11 or a read that finds its head is.
local RLEN, i7, HWIDTH, HFMT, days
local function layout11()
  L11 = true
  HWIDTH = {[0] = 1, 2, 3, 5}
  HFMT = {[0] = '<I1I1I1I4I4', '<I2I2I2I4I4', '<I3I3I3I4I4', '<I5I5I5I4I4'}
  days = {}
  RLEN = {[1] = 15, [2] = 15, [3] = 15, [17] = 22, [18] = 22, [19] = 22, [33] = 22, [34] = 22,
    [35] = 22, [49] = 29, [50] = 29, [51] = 29}
  i7 = function(s, pos)
    local a, b, c, d, e, f, g = byte(s, pos, pos + 6)
    return a + 256 * (b + 256 * (c + 256 * (d + 256 * (e + 256 * (f + 256 * g)))))
  end
end
if L11 then layout11() end

-- hmget reads fields of key in chunks, returning one value (or false) per field.
local function hmget(key, fields)
  if #fields <= CHUNK then return call('HMGET', key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, CHUNK do
    local got = call('HMGET', key, unpack(fields, i, min(i + CHUNK - 1, #fields)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end
local function hdel(key, fields)
  for i = 1, #fields, CHUNK do call('HDEL', key, unpack(fields, i, min(i + CHUNK - 1, #fields))) end
end
-- hset writes field, value pairs (a flat list).
local function hset(key, pairs)
  for i = 1, #pairs, CHUNK do call('HSET', key, unpack(pairs, i, min(i + CHUNK - 1, #pairs))) end
end

-- Hours, index groups and minutes the call touches, parsed once: hours[-h] = {s = field name, h
-- (the hour), c p u (counts), a b (bounds, exact as the batch inserts; false when it holds no
-- winner), lz (loose: a winner at a bound left, so a bound may lie beyond the winners), got (read),
-- dirty};
-- groups[-d] = {s, d (the group), k n x (closed chunks, entries, entries left behind), e (open
-- chunk), got, dirty, add (index entries to append: one id, or a list of them)}; mins[-m] = {s, c,
-- p, u, got, dirty}. Absent values are false.
-- Tables keyed by an hour, group or minute use its negative: the embedded Redis of `repeatrate dev`
-- (gopher-lua) keeps positive integer keys below 2^26 in an array part grown up to the key, so an
-- hour since 1970 (about 5·10^5) or a minute (3·10^7) would allocate that many slots per call.
local hours, hlist, mins, mlist, groups, glist = {}, {}, {}, {}, {}, {}
local nhl = 0 -- #hlist
local function hourOf(h)
  local t = hours[-h]
  if not t then
    -- Every field set at once: no rehash as they are set later.
    t = {s = L11 and fmt('d%d', (h - h % 24) / 24) or fmt('h%d', h), h = h, c = 0, p = 0, u = 0,
      got = false, a = false, b = false, dirty = false, lz = false}
    hours[-h] = t; nhl = nhl + 1; hlist[nhl] = h
  end
  return t
end
local function groupTable(d)
  local t = groups[-d]
  if not t then
    t = {s = fmt('i%d', d), d = d, k = 0, n = 0, x = 0, e = '', got = false, dirty = false, add = false}
    groups[-d] = t; glist[#glist + 1] = d
  end
  return t
end
local prunedTo -- minutes below it were pruned by this call (deleted at its end)
local function minOf(m)
  local t = mins[-m]
  if not t then
    t = {s = fmt('m%d', m), c = 0, p = 0, u = 0, got = prunedTo ~= nil and m < prunedTo, dirty = false}
    mins[-m] = t; mlist[#mlist + 1] = m
  end
  return t
end
-- Layout 11 keeps a day's hours in one field, d<day> (day = floor(hour / 24)): the entries of the
-- hours that hold winners, in hour order, each a byte E (the hour of the day in bits 0-4, loose
-- bounds in bit 5, the counts' width in bits 6-7: 1, 2, 3 or 5 bytes), then C,P,U in that width
-- and the bounds as offsets from the hour's start in 4 bytes each. A field of its own per hour
-- cost about 70 bytes with Redis's overhead, 10 bytes an opportunity where an aggregate holds 7 an
-- hour (30 days of the wide shape); a day's entries cost 12 to 24 bytes each. dayOf checks day
-- field s as read (false: absent) and returns {v = it, at = {[hour of the day] = its entry's
-- position}}, which days[-day] keeps: a day is parsed once a call however many of its hours
-- the call reads.
local function dayOf(s, v)
  local at = {}
  if v then
    local p, len, last = 1, #v, -1
    if len == 0 then error('state field ' .. s .. ' is no day of this layout') end
    while p <= len do
      local e = byte(v, p)
      local hk = e % 32
      if hk >= 24 or hk <= last then error('state field ' .. s .. ' is no day of this layout') end
      at[hk], last = p, hk
      p = p + 9 + 3 * HWIDTH[(e - e % 64) / 64]
    end
    if p ~= len + 1 then error('state field ' .. s .. ' is no day of this layout') end
  end
  return {v = v, at = at}
end
-- parseHour parses hour table t from its field as read (layout 11: from its day's).
local function parseHour(t, v)
  t.got = true
  if L11 then
    local h = t.h
    local d = (h - h % 24) / 24
    local dt = days[-d]
    if not dt then dt = dayOf(t.s, v); days[-d] = dt end
    local p = dt.at[h % 24]
    if not p then return end
    local e = byte(dt.v, p)
    local code, a, b = (e - e % 64) / 64
    t.c, t.p, t.u, a, b = sunpack(HFMT[code], dt.v, p + 1)
    -- What a write makes: an hour that holds winners, its counts in the fewest bytes that hold
    -- them, bounds within the hour and in order.
    local top = max(t.c, t.p, t.u)
    if top == 0 or code ~= (top < 256 and 0 or top < 65536 and 1 or top < 16777216 and 2 or 3) or a > b or b >= HOUR then
      error('state field ' .. t.s .. ' is no day of this layout')
    end
    t.lz = e % 64 >= 32
    local start = h * HOUR
    t.a, t.b = start + a, start + b
    return
  end
  if not v then return end
  local kind = byte(v, 1)
  if #v ~= 26 or (kind ~= 1 and kind ~= 2) then error('state field ' .. t.s .. ' is no hour of this layout') end
  t.lz = kind == 2
  local a, b
  t.c, t.p, t.u, a, b = sunpack('<I5I5I5I5I5', v, 2)
  local start = t.h * HOUR
  t.a, t.b = start + a, start + b
end
local function parseGroup(t, v)
  t.got = true
  if not v then return end
  if #v < 16 or byte(v, 1) ~= 0 then error('state field ' .. t.s .. ' is no index group of this layout') end
  t.k, t.n, t.x = sunpack('<I5I5I5', v, 2)
  t.e = sub(v, 17)
end
local function parseMin(t, v)
  t.got = true
  if not v then return end
  if #v ~= 16 or byte(v, 1) ~= 0 then error('state field ' .. t.s .. ' is no minute of this layout') end
  t.c, t.p, t.u = sunpack('<I5I5I5', v, 2)
end
-- load reads the hours, groups or minutes of list ts (tables from hourOf, groupTable or minOf) not read yet.
-- A field several of them share (layout 11's day of hours) is read once.
local function load(ts, parse)
  local miss, fs, idx, pos = {}, {}, {}, {}
  for _, t in ipairs(ts) do
    if not t.got then
      if parse == parseHour and L11 and days[-((t.h - t.h % 24) / 24)] then
        parseHour(t, nil) -- its day is read
      else
        local s = t.s
        local j = pos[s]
        if not j then j = #fs + 1; fs[j] = s; pos[s] = j end
        miss[#miss + 1] = t; idx[#miss] = j; t.got = true
      end
    end
  end
  if #fs == 0 then return end
  local got = hmget(st, fs)
  for i, t in ipairs(miss) do parse(t, got[idx[i]]) end
end
local function getHour(h)
  local t = hourOf(h)
  if not t.got then
    if L11 and days[-((h - h % 24) / 24)] then parseHour(t, nil) else parseHour(t, call('HGET', st, t.s)) end
  end
  return t
end
local function getGroup(d)
  local t = groupTable(d)
  if not t.got then parseGroup(t, call('HGET', st, t.s)) end
  return t
end
local function getMin(m)
  local t = minOf(m)
  if not t.got then parseMin(t, call('HGET', st, t.s)) end
  return t
end
local function loadHours(from, to)
  local ts = {}
  for h = from, to do ts[#ts + 1] = hourOf(h) end
  load(ts, parseHour)
end

-- Closed index chunks, read and written through a cache: cv[field] is its value, false when
-- absent or deleted, nil when not read yet.
local cv, cdirty = {}, {}
local function cget(fs)
  local miss = {}
  for _, f in ipairs(fs) do if cv[f] == nil then miss[#miss + 1] = f end end
  if #miss > 0 then
    local got = hmget(st, miss)
    for i, f in ipairs(miss) do cv[f] = got[i] end
  end
end
local function cset(f, v)
  if not cdirty[f] then cdirty[f] = true; cdirty[#cdirty + 1] = f end
  cv[f] = v
end

-- G: the hours an index group spans, fixed when the aggregate is created: an eighth of the
-- retention, at least 1 and at most 255 hours, so that a record outlives its horizon's expiry by at
-- most an eighth of the retention. The fields are read below with the G the retention gives; an
-- aggregate created under another retention names its own in the head, and its groups are then
-- read again.
local G = max(1, min(255, floor(ret / (8 * HOUR))))
local GSPAN = G * HOUR
local function groupOfHour(h) return (h - h % G) / G end
local function groupOf(us) return floor(us / GSPAN) end

-- The records of the batch (one HMGET), each observation's occurred time and hour, and the head,
-- the hours, index groups and recent minutes the batch touches (one HMGET). Layout 11 reads the
-- head first (it keeps the record store's shape), then the records' buckets.
local occs, hs, held = {}, {}, {}
local want, wantH, wantM, wantG, nwant = {'H', 'v'}, {}, {}, {}, 2
local wantDay, sameDay -- layout 11: the day fields wanted, the hours they hold read with another
if L11 then wantDay, sameDay = {}, {} end
if n > 0 then
  local got
  if not L11 then
    if n <= CHUNK then
      got = call('HMGET', opps, unpack(ARGV, 4, 3 + n))
    else
      local ids = {}
      for i = 1, n do ids[i] = ARGV[3 + i] end
      got = hmget(opps, ids)
    end
  end
  local recent = at - 2 * HOUR
  for i = 1, n do
    local id, value = ARGV[3 + i], ARGV[3 + n + i]
    local occ
    if L11 then
      local tag = byte(value, 1)
      if #id ~= 16 or not tag or tag >= TAGHZN or RLEN[tag] ~= #value then
        error('observation ' .. i .. ' is no fingerprint and record of layout 11')
      end
      occ = i7(value, 2)
    else
      occ = tonumber(sub(value, 2, find(value, ',', 3, true) - 1), 16)
    end
    local h = (occ - occ % HOUR) / HOUR -- floor(occ / HOUR) without a call
    occs[i], hs[i] = occ, h
    -- The first observation of an id that is byte for byte its stored record is a duplicate (or
    -- expired) and changes nothing: its hour and minute are not read for it. Any other reads them
    -- here, with the head; what the loop below reaches otherwise it reads on the way (getHour).
    -- Layout 11 reads the head before the records (the head keeps the store's shape), so it reads
    -- a duplicate's hour too.
    local first = true
    if not L11 then
      first = held[id] == nil
      if first then held[id] = got[i] end
    end
    if L11 or not first or got[i] ~= value then
      if not hours[-h] then
        local t = hourOf(h)
        t.got = true
        -- Layout 11: an hour whose day another hour read is parsed from that one's day.
        if not wantDay then
          nwant = nwant + 1; want[nwant] = t.s; wantH[nwant] = t
        elseif wantDay[t.s] then
          sameDay[#sameDay + 1] = t
        else
          wantDay[t.s] = true
          nwant = nwant + 1; want[nwant] = t.s; wantH[nwant] = t
        end
        local d = groupOfHour(h)
        if not groups[-d] then
          local td = groupTable(d)
          td.got = true
          nwant = nwant + 1; want[nwant] = td.s; wantG[nwant] = td
        end
      end
      if occ >= recent then
        local m = (occ - occ % MIN) / MIN
        if not mins[-m] then
          local t = minOf(m)
          t.got = true
          nwant = nwant + 1; want[nwant] = t.s; wantM[nwant] = t
        end
      end
    end
  end
end
local head, vgot
local v, w, pm, f, l, hcm, hch, rt, g, kc
local wc = 0 -- layout 11: the store's write count (a head of 24 numbers has none yet)
local C, P, U = 0, 0, 0
local hr, dy, wk = {0, 0, 0}, {0, 0, 0}, {0, 0, 0}
local store -- layout 11's packed record store (KEYS[3])
do
  local got = hmget(st, want)
  head, vgot = got[1], got[2]
  local own = G -- the head's G, when there is a head
  local sL, sp, sn = 0, 0, 0 -- layout 11: the store's shape
  if head then
    local x
    -- A read of layout 11 needs its head only: it touches no record.
    if n == 0 and byte(head, 1) == 11 then layout11() end
    -- A head of 12 is layout 10 being converted: read, or written by a call that mirrors.
    if not L11 and #head == HEADLEN and (byte(head, 1) == 10 or byte(head, 1) == 12 and (mirror or n == 0)) then
      x = {sunpack(HEADR, head, 2)}
    elseif L11 and (#head == HEADLEN11 or #head == HEADLEN11 + 7) and byte(head, 1) == 11 then
      x = {sunpack('<B' .. string.rep('I7', (#head - 2) / 7), head, 2)}
      sL, sp, sn = x[23], x[24], x[25]
      if #head > HEADLEN11 then wc = x[26] end
    else
      error('state field H is no head of this layout')
    end
    own = x[1]
    if own < 1 then error('state field H is no head of this layout') end
    for i = 2, 9 do if x[i] > 0 then x[i] = x[i] - 1 else x[i] = nil end end
    w, pm, f, l, hcm, hch, rt, g = x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9]
    C, P, U = x[10], x[11], x[12]
    hr[1], hr[2], hr[3], dy[1], dy[2], dy[3], wk[1], wk[2], wk[3] = x[13], x[14], x[15], x[16], x[17], x[18], x[19], x[20], x[21]
    if x[22] > 0 then kc = x[22] - 1 end
  end
  for i = 3, nwant do
    if wantH[i] then parseHour(wantH[i], got[i])
    elseif wantM[i] then parseMin(wantM[i], got[i])
    elseif own == G then parseGroup(wantG[i], got[i]) end
  end
  if sameDay then for _, t in ipairs(sameDay) do parseHour(t, nil) end end
  if own ~= G then
    -- Read under another retention's G: forget those groups, read the aggregate's own.
    G, GSPAN = own, own * HOUR
    for _, d in ipairs(glist) do groups[-d] = nil end
    glist = {}
    local ts = {}
    for _, h in ipairs(hlist) do
      local d = groupOfHour(h)
      if not groups[-d] then ts[#ts + 1] = groupTable(d) end
    end
    load(ts, parseGroup)
  end
  if L11 and n > 0 then
    store = newPackedRecords(opps, RLEN, sL, sp, sn)
    store.getAll(ARGV, 4, 3 + n, held)
  end
end
v = tonumber(vgot) or 0
-- The state hash is read and written a field at a time, so it must be a hash table: a small hash
-- (up to hash-max-listpack-entries, 128 to 512 fields) is stored as a listpack, where every field
-- lookup scans the whole hash. A value longer than hash-max-listpack-value (64 bytes by default)
-- makes Redis convert a hash to a hash table for good, so it is created with one.
local sets, dels = {}, {}
if not head and n > 0 then
  sets[1] = 'enc'
  sets[2] = 'a value longer than hash-max-listpack-value keeps this hash a hash table: field lookups in O(1)'
end
-- cutH: the first retained hour. It never moves back (docs/semantics.md#retention): the head keeps
-- it, so a retention raised between batches neither revives an identity whose horizon it passed
-- nor counts an hour whose counts left; a lowered one moves it up below, before the batch.
local cutH, mfloor -- first retained hour, first minute with a bucket
-- A head without it had its cut below hour 0, which holds nothing: -1 stands for any such cut.
if w then cutH, mfloor = kc or min(floor((w - ret) / HOUR), -1), floor(w / MIN) - MKEEP end
local changed = false
local fDirty, lDirty = false, false -- f or l may no longer be exact: recompute from the bounds at the end

-- Window sums at the observation time. They are cached per (minute, hour) of that time and kept
-- up to date by every bucket change, so a batch recomputes them from the buckets only when its
-- observation time enters a new minute (or buckets were dropped).
local M, H = floor(at / MIN), floor(at / HOUR)
local cached = hcm == M and hch == H
local cacheDirty = false
-- A batch whose observation time moved on by less than an hour of minutes and a day of hours
-- shifts the sums instead: it subtracts the minutes and hours that left the windows and adds
-- those that entered, as the buckets stand before this call, which is what the sums were kept for.
-- A recompute reads 60 minutes and 168 hours; every aggregate needs one when the minute turns,
-- which made that minute's first batch cost about five ordinary ones, and so did every read of an
-- aggregate whose last batch was in an earlier minute (a read changes nothing, so it never
-- stored its sums).
if not cached and hcm and hch and M > hcm and M - hcm < 60 and H >= hch and H - hch < 24 then
  local ts = {}
  for m = hcm - 59, M - 60 do ts[#ts + 1] = minOf(m) end
  for m = hcm + 1, M do ts[#ts + 1] = minOf(m) end
  load(ts, parseMin)
  local k = M - hcm
  for i, t in ipairs(ts) do
    local s = i <= k and -1 or 1
    hr[1], hr[2], hr[3] = hr[1] + s * t.c, hr[2] + s * t.p, hr[3] + s * t.u
  end
  if H > hch then
    local j = H - hch
    ts = {}
    for h = hch - 167, H - 168 do ts[#ts + 1] = hourOf(h) end
    for h = hch - 23, H - 24 do ts[#ts + 1] = hourOf(h) end
    for h = hch + 1, H do ts[#ts + 1] = hourOf(h) end
    load(ts, parseHour)
    for i = 1, j do
      local t, u = ts[i], ts[2 * j + i]
      wk[1], wk[2], wk[3] = wk[1] - t.c + u.c, wk[2] - t.p + u.p, wk[3] - t.u + u.u
      t = ts[j + i]
      dy[1], dy[2], dy[3] = dy[1] - t.c + u.c, dy[2] - t.p + u.p, dy[3] - t.u + u.u
    end
  end
  hcm, hch, cached, cacheDirty = M, H, true, true
  for i = 1, 3 do
    if hr[i] < 0 or dy[i] < 0 or wk[i] < 0 then cached = false end
  end
end

-- bump adds d to class j (1 C, 2 P, 3 U) at occurred time occ, of hour table t (read).
local function bump(j, occ, t, d)
  local h = t.h
  if j == 1 then C = C + d; t.c = t.c + d
  elseif j == 2 then P = P + d; t.p = t.p + d
  else j = 3; U = U + d; t.u = t.u + d end
  t.dirty = true
  if occ >= mfloor * MIN then
    local m = (occ - occ % MIN) / MIN
    local q = mins[-m] -- read with the head when the batch brought it (getMin otherwise)
    if not q or not q.got then q = getMin(m) end
    if j == 1 then q.c = q.c + d elseif j == 2 then q.p = q.p + d else q.u = q.u + d end
    q.dirty = true
    if cached and m <= M and m >= M - 59 then hr[j] = hr[j] + d; cacheDirty = true end
  end
  if cached and h <= H and h >= H - 167 then
    wk[j] = wk[j] + d
    if h >= H - 23 then dy[j] = dy[j] + d end
    cacheDirty = true
  end
end

-- parse returns class (1 C, 2 P, 3 U), occurred, assessed, seq and horizon of a record, and the
-- record without its horizon; withHorizon returns record base (no horizon) of an assessment that
-- occurred at occ, with horizon z.
local CLASS = {C = 1, P = 2, U = 3}
local parse, withHorizon
if not L11 then
  parse = function(rec)
    local base, c, o, a, s, z = match(rec, '^((%a)(%x+),(%x+),?(%x*));?(%x*)$')
    o = tonumber(o, 16)
    return CLASS[c], o, tonumber(a, 16), (s ~= '' and tonumber(s, 16)) or 0, (z ~= '' and tonumber(z, 16)) or o, base
  end
  withHorizon = function(base, occ, z)
    if z > occ then return base .. ';' .. fmt('%x', z) end
    return base
  end
else
  parse = function(rec)
    local tag = byte(rec, 1)
    local o = i7(rec, 2)
    local s, z, base = 0, o, rec
    if tag % TAGHZN >= TAGSEQ then s = i7(rec, 16) end
    if tag >= TAGHZN then
      z = i7(rec, #rec - 6)
      base = char(tag - TAGHZN) .. sub(rec, 2, #rec - 7)
    end
    return tag % 16, o, i7(rec, 9), s, z, base
  end
  withHorizon = function(base, occ, z)
    if z > occ then return char(byte(base, 1) + TAGHZN) .. sub(base, 2) .. spack('<I7', z) end
    return base
  end
end

local function pruneMinutes(from, to)
  local gone = {}
  if to - from <= 300 then
    for b = from, to - 1 do gone[#gone + 1] = fmt('m%d', b) end
  else
    for _, k in ipairs(call('HKEYS', st)) do
      if sub(k, 1, 1) == 'm' then
        local b = tonumber(sub(k, 2))
        if b and b < to then gone[#gone + 1] = k end
      end
    end
  end
  -- Deleted with the call's other writes, at its end: a call refused on the way writes nothing.
  -- Until then, a minute below the pruned point reads as empty without a read (minOf).
  for _, f in ipairs(gone) do dels[#dels + 1] = f end
  if not prunedTo or to > prunedTo then prunedTo = to end
  for _, m in ipairs(mlist) do
    if m < to then
      local t = mins[-m]
      t.c, t.p, t.u, t.got, t.dirty = 0, 0, 0, true, false
    end
  end
end

-- expireHours drops the hours below newCut: their counts leave C P U, their buckets and bounds
-- are deleted. Only hours between the first and last retained ones can hold anything.
local function expireHours(newCut)
  if not f then return end
  local lo, hi = max(cutH, floor(f / HOUR)), min(newCut - 1, floor(l / HOUR))
  if lo > hi then return end
  loadHours(lo, hi)
  local dropped = false
  for h = lo, hi do
    local t = hours[-h]
    if t.c + t.p + t.u > 0 then
      C, P, U = C - t.c, P - t.p, U - t.u
      changed = true
      -- Only an hour inside the week's window changes a window sum (with a retention of 30 days
      -- the hour that leaves is a month old).
      if h >= H - 167 then dropped = true end
      t.c, t.p, t.u, t.a, t.b, t.lz, t.dirty = 0, 0, 0, false, false, false, true
      if pm and (h + 1) * 60 > pm then -- a short retention: the hour still has minute buckets
        dropped = true
        for m = h * 60, h * 60 + 59 do
          local q = minOf(m)
          q.c, q.p, q.u, q.got, q.dirty = 0, 0, 0, true, true
        end
      end
    end
  end
  if dropped then cached = false end
  if l < newCut * HOUR then
    f, l, fDirty, lDirty = nil, nil, false, false
  elseif f < newCut * HOUR then
    fDirty = true
  end
end

-- raiseCut moves the cut up to what the watermark and the retention give, never back: the hours
-- it passes leave every count.
local function raiseCut()
  local nc = floor((w - ret) / HOUR)
  if cutH and nc > cutH then expireHours(nc) end
  if not cutH or nc > cutH then cutH = nc end
end

-- advance moves the watermark to occ: hours beyond retention leave every count, and minute buckets
-- no window can reach any more are dropped.
local function advance(occ)
  if w and occ <= w then return end
  w = occ
  raiseCut()
  local nm = max(floor(w / MIN) - MKEEP, 0)
  -- Minute buckets below the floor are never read or written again; deleting them is only
  -- garbage collection, done in steps of an hour of minutes to keep it cheap.
  if not pm then pm = nm end
  if nm - pm >= 60 then
    pruneMinutes(pm, nm)
    if nm > M - 59 then cached = false end -- a pruned minute was in the hour's window
    pm = nm
  end
  mfloor = floor(w / MIN) - MKEEP
end
-- A retention lowered since the last batch: the cut moves up to what it gives now (with a batch;
-- a read shows the state as the last batch left it).
if n > 0 and w then raiseCut() end

-- insertOcc and removeOcc keep the bounds of hour table t (read) as a winner that occurred at occ
-- enters or leaves it: exact, or loose (a bound may lie beyond the winners) once one left at a
-- bound. Loose bounds are made exact again from the group's index (scanHour) only when the hour
-- holds the first or last retained winner and that one is needed (see First and last below): a
-- move costs no scan of its own.
local function insertOcc(occ, t)
  if not t.a then
    t.a, t.b, t.dirty = occ, occ, true
  else
    if occ < t.a then t.a, t.dirty = occ, true end
    if occ > t.b then t.b, t.dirty = occ, true end
  end
  if not f or occ < f then f = occ end
  if not l or occ > l then l = occ end
end
local function removeOcc(occ, t)
  if t.c + t.p + t.u == 0 then t.a, t.b, t.lz = false, false, false
  elseif occ <= t.a or occ >= t.b then t.lz = true end
  if occ <= f then fDirty = true end
  if occ >= l then lDirty = true end
end

-- Records are written at the end of the loop (one HSET), index entries appended to their groups'
-- open chunks. pending[id] says that id is written and under which groups this batch listed it:
-- true (none yet), one group, or a set of them (keyed by the negative group).
local pending, pendIds, pushGroups = {}, {}, {}
local npend = 0 -- #pendIds
-- push lists record field id (already pending) under group once per batch, however often the batch
-- moves it there (layout 11: its fingerprint's first 4 bytes). A group's additions are one entry,
-- or a list once there are more.
local function push(id, grp)
  local p = pending[id]
  if p == grp then return end
  if p == true then
    pending[id] = grp
  else
    if type(p) ~= 'table' then p = {[-p] = true}; pending[id] = p end
    if p[-grp] then return end
    p[-grp] = true
  end
  local t = groupTable(grp)
  local e, x = t.add, id
  if L11 then x = sub(id, 1, 4) end
  if not e then
    t.add = x; pushGroups[#pushGroups + 1] = grp
  elseif type(e) == 'table' then
    e[#e + 1] = x
  else
    t.add = {e, x}
  end
end
-- write records value for id and lists id under each given group that is not nil.
-- records reads layout 10's records of ids, one written by this call as it will be written (the
-- record hash is written at the call's end).
local function records(ids)
  local recs = hmget(opps, ids)
  for j = 1, #recs do
    if pending[ids[j]] then recs[j] = held[ids[j]] end
  end
  return recs
end
local function write(id, value, d1, d2)
  if not pending[id] then pending[id] = true; npend = npend + 1; pendIds[npend] = id end
  held[id] = value
  if d1 then push(id, d1) end
  if d2 and d2 ~= d1 then push(id, d2) end
end
-- leave counts an entry of group d that may no longer be needed (its record's winner and horizon
-- moved to other groups); a group whose index lists at least as many such entries as others is
-- compacted at the end. Groups wholly expired are left to garbage collection.
local function leave(d)
  if d >= floor(cutH / G) then
    local t = getGroup(d)
    t.x, t.dirty = t.x + 1, true
  end
end

local out = {}
for i = 1, n do
  local id, value, occ = ARGV[3 + i], ARGV[3 + n + i], occs[i]
  if not w or occ > w then advance(occ) end
  local cut = cutH * HOUR
  local rec = held[id]
  if occ < cut then
    -- Changes nothing, even when newer than the held winner (docs/semantics.md#retention).
    out[i] = 'E'
  elseif rec == value then
    -- The same assessment, byte for byte, of a record whose winner (and so horizon) is retained.
    out[i] = 'D'
  else
    local oc, oo, oa, os, oz, obase
    if rec then
      oc, oo, oa, os, oz, obase = parse(rec)
      if oz < cut then -- its horizon expired: the record is garbage, its entries too
        rec = nil
      end
    end
    if not rec then
      local h = hs[i]
      local d = (h - h % G) / G -- groupOfHour(h), inline: this runs for every new opportunity
      if oo then -- garbage: its entries stay listed under its old winner's and horizon's groups
        local od, ozd = groupOf(oo), groupOf(oz)
        write(id, value, (d ~= od and d ~= ozd) and d or nil)
        if od ~= d then leave(od) end
        if ozd ~= d and ozd ~= od then leave(ozd) end
      else
        write(id, value, d)
      end
      local t = hours[-h] -- read with the head (getHour otherwise)
      if not t or not t.got then t = getHour(h) end
      insertOcc(occ, t)
      bump(L11 and byte(value, 1) % 16 or CLASS[sub(value, 1, 1)], occ, t, 1)
      changed = true
      out[i] = 'N'
    else
      local cls, _, asd, seq = parse(value)
      if asd > oa or (asd == oa and seq > os) then
        local z = max(oz, occ)
        local h, oh = hs[i], floor(oo / HOUR)
        local d, od, zd, ozd = groupOfHour(h), groupOf(oo), groupOf(z), groupOf(oz)
        local t, ot = getHour(h), oo >= cut and getHour(oh)
        if ot then bump(oc, oo, ot, -1) end
        bump(cls, occ, t, 1)
        -- The id is listed under its old winner's and old horizon's groups already.
        write(id, withHorizon(value, occ, z), (d ~= od and d ~= ozd) and d or nil,
          (zd ~= od and zd ~= ozd) and zd or nil)
        if od ~= d and od ~= zd then leave(od) end
        if ozd ~= od and ozd ~= d and ozd ~= zd then leave(ozd) end
        if oo < cut then
          insertOcc(occ, t)
        elseif occ ~= oo then
          removeOcc(oo, ot); insertOcc(occ, t)
        end
        changed = true
        out[i] = 'R'
      else
        if occ > oz then -- the horizon grows: list the id under its new group
          local zd, od, ozd = groupOf(occ), groupOf(oo), groupOf(oz)
          write(id, withHorizon(obase, oo, occ), (zd ~= od and zd ~= ozd) and zd or nil)
          if ozd ~= od and ozd ~= zd then leave(ozd) end
        end
        out[i] = (asd == oa and seq == os) and 'D' or 'S'
      end
    end
  end
end

if L11 then
  -- The records are put in the store (written when it is flushed, with the state, at the end).
  for _, id in ipairs(pendIds) do store.put(id, held[id]) end
end
-- Every write waits for the call's end, after every read that could refuse a field (an expiry,
-- a window recompute, garbage collection): Redis keeps what a failed script wrote, so a call
-- refused on the way must have written nothing. Layout 10's records, garbage collection's deletes
-- and the index's sorted set are written there, in this order, before the state.
local zadds, gcDels, gcDone = {}, {}, {}

-- entries appends to ids the entries of chunk s from position pos: record fields (each its length
-- in three hex digits and the id), or layout 11's 4-byte fingerprint prefixes.
local function entries(ids, s, pos)
  local len = #s
  if L11 then
    for q = pos, len - 3, 4 do ids[#ids + 1] = sub(s, q, q + 3) end
    return ids
  end
  while pos <= len do
    local e = pos + 2 + tonumber(sub(s, pos, pos + 2), 16)
    ids[#ids + 1] = sub(s, pos, e)
    pos = e + 1
  end
  return ids
end

-- Index appends: to the open chunk of each group, closing it whenever the next entry would take it
-- past CHUNKBYTES, so that however many entries a batch adds to a group, each is copied once and
-- every chunk stays small. Pushed groups were read with the head (or by leave), so they are loaded.
local newGroups = false
if #pushGroups > 0 then
  local zs = {}
  for _, grp in ipairs(pushGroups) do
    local t = getGroup(grp)
    local cur, add = t.e, t.add
    if cur == '' and t.k == 0 then zs[#zs + 1] = grp; zs[#zs + 1] = sub(t.s, 2) end
    if type(add) == 'string' and (#cur + #add <= CHUNKBYTES or cur == '') then
      t.e = cur .. add -- one id that fits: no list
      t.n = t.n + 1
    else
      if type(add) == 'string' then add = {add} end
      t.n = t.n + #add
      local parts, size = {cur}, #cur
      for _, id in ipairs(add) do
        if size + #id > CHUNKBYTES and size > 0 then -- close the open chunk
          t.k = t.k + 1
          cset(t.s .. '.' .. fmt('%d', t.k), concat(parts))
          parts, size = {}, 0
        end
        parts[#parts + 1] = id; size = size + #id
      end
      t.e = concat(parts)
    end
    t.dirty = true
  end
  if #zs > 0 then
    -- The index and the sorted set of its groups change together (expire together, see the end).
    zadds = zs
    for i = 1, #zs, 2 do if not g or zs[i] < g then g = zs[i] end end
    newGroups = true
  end
end

-- groupIds returns the entries listed under a loaded group table t.
local function groupIds(t)
  local ids = {}
  if t.k > 0 then
    local fs = {}
    for i = 1, t.k do fs[i] = t.s .. '.' .. fmt('%d', i) end
    cget(fs)
    for _, f in ipairs(fs) do
      if cv[f] then entries(ids, cv[f], 1) end
    end
  end
  return entries(ids, t.e, 1)
end
-- rewriteGroup replaces group table t's chunks by ents, a list of entries.
local function rewriteGroup(t, ents)
  local chunk, size, closed = {}, 0, 0
  for _, e in ipairs(ents) do
    if size + #e > CHUNKBYTES and size > 0 then
      closed = closed + 1
      cset(t.s .. '.' .. fmt('%d', closed), concat(chunk))
      chunk, size = {}, 0
    end
    chunk[#chunk + 1] = e; size = size + #e
  end
  for i = closed + 1, t.k do cset(t.s .. '.' .. fmt('%d', i), false) end
  t.k, t.e, t.dirty = closed, concat(chunk), true
end

-- scanGroup returns the winners' occurred times of the records listed under group d, read once per
-- call (the records are written by then; only garbage collection, later, deletes). An index that
-- holds more than twice the ids still listed there for a reason (their winner or their horizon
-- is in group d), plus some slack, is rewritten with those alone: each move of an opportunity
-- between groups leaves an entry behind, and the rewrite keeps a scan proportional to what the group
-- holds.
local scanned = {}
local function scanGroup(d)
  local occ = scanned[-d]
  if occ then return occ end
  local t = getGroup(d)
  local ids = groupIds(t)
  local keep, kept = {}, {}
  occ = {}
  if L11 then
    -- An entry is kept when a record it finds has its winner or horizon in group d. Each prefix
    -- is walked once, and only its own records begin with it, so each winner counts once.
    store.load(ids, 0)
    for j = 1, #ids do
      local e = ids[j]
      if kept[e] == nil then
        kept[e] = false
        store.each(e, function(_, rec)
          local _, o, _, _, z = parse(rec)
          if groupOf(o) == d or groupOf(z) == d then
            if not kept[e] then kept[e] = true; keep[#keep + 1] = e end
            occ[#occ + 1] = o
          end
        end)
      end
    end
  else
    local recs = #ids > 0 and records(ids) or {}
    for j = 1, #recs do
      if recs[j] and not kept[ids[j]] then
        local _, o, _, _, z = parse(recs[j])
        if groupOf(o) == d or groupOf(z) == d then
          kept[ids[j]] = true
          keep[#keep + 1] = ids[j]
          occ[#occ + 1] = o
        end
      end
    end
  end
  if #ids > 2 * #keep + 64 then rewriteGroup(t, keep); t.n, t.x = #keep, 0
  elseif t.n ~= #ids or t.x ~= #ids - #keep then t.n, t.x, t.dirty = #ids, #ids - #keep, true end
  scanned[-d] = occ
  return occ
end
-- scanHour returns the least and greatest occurred of hour h's winners, from its group's index.
local function scanHour(h)
  local lo, hi
  local from, to = h * HOUR, (h + 1) * HOUR
  for _, o in ipairs(scanGroup(groupOfHour(h))) do
    if o >= from and o < to then
      if not lo or o < lo then lo = o end
      if not hi or o > hi then hi = o end
    end
  end
  return lo, hi
end

-- Groups whose index lists at least as many entries left behind by moves as others are compacted.
for _, d in ipairs(glist) do
  local t = groups[-d]
  if t.dirty and 2 * t.x >= t.n + 64 then scanGroup(d) end
end

-- First and last: the least bound of the lowest retained hour with a winner, the greatest of the
-- highest, made exact from the group's index first when loose.
if (fDirty or lDirty) and w then
  local top = floor(w / HOUR)
  loadHours(cutH, top)
  f, l = nil, nil
  local function exact(h, t)
    if t.lz then t.a, t.b = scanHour(h); t.lz, t.dirty = false, true end
  end
  for h = cutH, top do
    local t = hours[-h]
    if t.c + t.p + t.u > 0 then exact(h, t); f = t.a; break end
  end
  for h = top, cutH, -1 do
    local t = hours[-h]
    if t.c + t.p + t.u > 0 then exact(h, t); l = t.b; break end
  end
end

-- Garbage collection: delete the records of wholly expired groups, a bounded number per batch (at
-- least twice what the batch can add), from the lowest listed group up, a chunk at a time. A record
-- goes when its horizon is in the group being collected; one listed there only for its winner stays
-- for its horizon's. It runs only while the lowest listed group (g) is wholly expired; until then a
-- record whose horizon expired reads as absent.
local cutG = cutH and floor(cutH / G)
if n > 0 and cutG and g and g < cutG and not mirror then
  local budget = min(2 * n + 100, CHUNK)
  -- The 64 lowest groups below the cut that the sorted set lists once this call's new groups
  -- (zadds, written at the end) are added.
  local grs, isNew = call('ZRANGEBYSCORE', listed, '-inf', '(' .. fmt('%d', cutG), 'LIMIT', 0, 64), {}
  for i = 2, #zadds, 2 do
    local fd = zadds[i]
    if zadds[i - 1] < cutG then isNew[fd] = true; grs[#grs + 1] = fd end
  end
  if next(isNew) then
    local seen, u = {}, {}
    for _, fd in ipairs(grs) do if not seen[fd] then seen[fd] = true; u[#u + 1] = fd end end
    table.sort(u, function(x, y) return tonumber(x) < tonumber(y) end)
    grs = {}
    for i = 1, min(#u, 64) do grs[i] = u[i] end
  end
  local ids, idGroup, done = {}, {}, {}
  local ts = {}
  for i, fd in ipairs(grs) do ts[i] = groupTable(tonumber(fd)) end
  load(ts, parseGroup)
  for i, fd in ipairs(grs) do
    if budget <= 0 then break end
    local d, t = tonumber(fd), ts[i]
    local from = #ids
    while t.k > 0 and budget > 0 do
      local cf = t.s .. '.' .. fmt('%d', t.k)
      cget({cf})
      if cv[cf] then entries(ids, cv[cf], 1) end
      cset(cf, false)
      t.k, t.dirty = t.k - 1, true
      budget = budget - (#ids - from); from = #ids
    end
    if t.k == 0 and budget > 0 then
      entries(ids, t.e, 1)
      t.e, t.n, t.x, t.dirty = '', 0, 0, true
      done[#done + 1] = fd
      budget = budget - (#ids - from)
    end
    for j = #idGroup + 1, #ids do idGroup[j] = d end
  end
  if #ids > 0 and L11 then
    store.load(ids, 0)
    local del, asked = {}, {}
    for j = 1, #ids do
      local e, d = ids[j], idGroup[j]
      if not asked[e .. d] then
        asked[e .. d] = true
        store.each(e, function(fp, rec)
          local _, _, _, _, z = parse(rec)
          if groupOf(z) == d then del[#del + 1] = fp end
        end)
      end
    end
    for _, fp in ipairs(del) do store.delete(fp) end
  elseif #ids > 0 then
    local recs = records(ids)
    for j = 1, #recs do
      local id = ids[j]
      if recs[j] then
        local _, _, _, _, z = parse(recs[j])
        if groupOf(z) == idGroup[j] then gcDels[#gcDels + 1] = id end
      end
    end
  end
  -- The collected groups leave the sorted set: a new one is not added, the others are removed at
  -- the end. Collection takes the lowest groups first, so those it removes are the lowest the
  -- sorted set holds, and the lowest left is the next one, or a new group.
  local gone = {}
  for _, fd in ipairs(done) do
    if isNew[fd] then gone[fd] = true else gcDone[#gcDone + 1] = fd end
  end
  if next(gone) then
    local kept = {}
    for i = 1, #zadds, 2 do
      if not gone[zadds[i + 1]] then kept[#kept + 1] = zadds[i]; kept[#kept + 1] = zadds[i + 1] end
    end
    zadds = kept
  end
  local low = call('ZRANGE', listed, #gcDone, #gcDone, 'WITHSCORES')
  g = low[2] and tonumber(low[2]) or nil
  for i = 1, #zadds, 2 do if not g or zadds[i] < g then g = zadds[i] end end
end

-- The version: one more than before, or the observation time when that is greater, so a version
-- published before Redis lost recent writes is never named again for other content.
if changed then
  v = max(v + 1, at)
  sets[#sets + 1] = 'v'; sets[#sets + 1] = fmt('%d', v)
end

-- Windows at the observation time, from the buckets (as this call leaves them) when the cached
-- sums are not for its minute and hour.
if not cached then
  hr[1], hr[2], hr[3], dy[1], dy[2], dy[3], wk[1], wk[2], wk[3] = 0, 0, 0, 0, 0, 0, 0, 0, 0
  -- No bucket lies past the watermark (an event moves it before it changes a bucket), so the
  -- windows are read up to it only: a read of an aggregate idle for a week reads no bucket, nor
  -- does one of an aggregate that holds nothing.
  local topM, topH = M - 60, H - 168
  if w then topM, topH = min(M, floor(w / MIN)), min(H, floor(w / HOUR)) end
  -- Nor is one stored before the aggregate's first call: it has only what this call made.
  local ts = {}
  for m = M - 59, topM do ts[#ts + 1] = minOf(m) end
  if head then load(ts, parseMin) end
  for _, t in ipairs(ts) do hr[1], hr[2], hr[3] = hr[1] + t.c, hr[2] + t.p, hr[3] + t.u end
  if head and topH >= H - 167 then loadHours(H - 167, topH) end
  for h = H - 167, topH do
    local t = hours[-h] -- nil: an hour a new aggregate's call did not touch
    if t then
      wk[1], wk[2], wk[3] = wk[1] + t.c, wk[2] + t.p, wk[3] + t.u
      if h >= H - 23 then dy[1], dy[2], dy[3] = dy[1] + t.c, dy[2] + t.p, dy[3] + t.u end
    end
  end
  hcm, hch, cacheDirty = M, H, true
end

-- The index's sorted set of hours lives twice the idle TTL and is refreshed every half TTL (server
-- clock, stamp rt) and whenever it gains an hour, which is also when it is created: it outlives
-- the index it lists, and does not outlive a dropped aggregate for long. The records and the state
-- are refreshed by every batch, so an aggregate goes exactly the idle TTL after its last event.
local refresh = false
if n > 0 and ttl > 0 then
  local now = tonumber(call('TIME')[1])
  if newGroups or not rt or now - rt >= ttl / 2000 then refresh = true; rt = now end
end

if n > 0 then
  local ns = #sets
  if not L11 then
    for _, h in ipairs(hlist) do
      local t = hours[-h]
      if t.dirty then
        if t.c + t.p + t.u == 0 then
          dels[#dels + 1] = t.s
        else
          sets[ns + 1] = t.s
          local start = h * HOUR
          sets[ns + 2] = spack('<BI5I5I5I5I5', t.lz and 2 or 1, t.c, t.p, t.u, t.a - start, t.b - start)
          ns = ns + 2
        end
      end
    end
  else
    -- Layout 11: each day with a changed hour is written again, the changed hours' entries
    -- spliced into the day as read.
    local dd = {}
    for _, h in ipairs(hlist) do
      if hours[-h].dirty then
        local d = (h - h % 24) / 24
        local ks = dd[-d]
        if not ks then ks = {}; dd[-d] = ks; dd[#dd + 1] = d end
        ks[#ks + 1] = h % 24
      end
    end
    for _, d in ipairs(dd) do
      local dt, ks = days[-d], dd[-d]
      if not dt then error('day ' .. d .. ' changed unread') end
      local v, at = dt.v, dt.at
      if #ks > 1 then table.sort(ks) end
      local parts, np, from = {}, 0, 1 -- from: the first byte of v not yet copied
      for _, hk in ipairs(ks) do
        local p = at[hk] -- where its entry is, or where it goes
        local q = p
        if p then
          local e = byte(v, p)
          q = p + 9 + 3 * HWIDTH[(e - e % 64) / 64]
        else
          for j = hk + 1, 23 do if at[j] then p = at[j]; break end end
          p = p or (v and #v + 1 or 1)
          q = p
        end
        if p > from then np = np + 1; parts[np] = sub(v, from, p - 1) end
        from = q
        local h = d * 24 + hk
        local t = hours[-h]
        if t.c + t.p + t.u > 0 then
          local start, top = h * HOUR, max(t.c, t.p, t.u)
          local a, b = t.a - start, t.b - start
          if a < 0 or b < a or b >= HOUR then error('hour ' .. h .. ' has bounds outside it') end
          local code = top < 256 and 0 or top < 65536 and 1 or top < 16777216 and 2 or 3
          np = np + 1
          parts[np] = char(hk + (t.lz and 32 or 0) + 64 * code) .. spack(HFMT[code], t.c, t.p, t.u, a, b)
        end
      end
      if v and from <= #v then np = np + 1; parts[np] = sub(v, from) end
      local nv = concat(parts)
      local s = fmt('d%d', d)
      if nv == '' then
        if v then dels[#dels + 1] = s end
      elseif nv ~= v then
        sets[ns + 1] = s; sets[ns + 2] = nv; ns = ns + 2
      end
    end
  end
  for _, d in ipairs(glist) do
    local t = groups[-d]
    if t.dirty then
      if t.k == 0 and t.e == '' then
        dels[#dels + 1] = t.s
      else
        sets[ns + 1] = t.s
        -- x counts a move per move, and one opportunity may leave a group more than once a batch:
        -- at most every entry can have been left behind.
        sets[ns + 2] = spack('<BI5I5I5', 0, t.k, t.n, min(t.x, t.n)) .. t.e
        ns = ns + 2
      end
    end
  end
  for _, m in ipairs(mlist) do
    local t = mins[-m]
    if t.dirty then
      if t.c + t.p + t.u == 0 then
        dels[#dels + 1] = t.s
      else
        sets[#sets + 1] = t.s; sets[#sets + 1] = spack('<BI5I5I5', 0, t.c, t.p, t.u)
      end
    end
  end
  for _, cf in ipairs(cdirty) do
    if cv[cf] then sets[#sets + 1] = cf; sets[#sets + 1] = cv[cf] else dels[#dels + 1] = cf end
  end
  -- An aggregate being converted: the records this call writes, copied as layout 11 keeps them
  -- into the packed store and listed beside layout 10's index (its reads first).
  local mstore
  if mirror and npend > 0 then
    local X = layout10to11(spack, sunpack)
    local mfps, recs, ents = {}, {}, {}
    for i, id in ipairs(pendIds) do
      local fp = mirror[id]
      local rec, wd, zd = X.record(id, held[id], GSPAN)
      mfps[i], recs[i] = fp, rec
      ents[#ents + 1] = {wd, fp}
      if zd ~= wd then ents[#ents + 1] = {zd, fp} end
    end
    X.shadow(st, ents, sets)
    mstore = newPackedRecords(KEYS[3], X.RLEN, X.shape(st, KEYS[3]))
    mstore.getAll(mfps, 1, #mfps, {})
    for i, fp in ipairs(mfps) do mstore.put(fp, recs[i]) end
    sets[#sets + 1] = 'M'; sets[#sets + 1] = fmt('%d,%d,%d', mstore.shape())
  end
  -- The writes deferred until every read is done.
  if mstore then mstore.flush() end
  if not L11 and npend > 0 then
    local h = {}
    for i, id in ipairs(pendIds) do h[2 * i - 1] = id; h[2 * i] = held[id] end
    hset(opps, h)
    if not head then
      -- A new aggregate's record hash would be a listpack up to hash-max-listpack-entries records
      -- (128 to 512), where every lookup scans the whole hash. A field longer than
      -- hash-max-listpack-value converts it to a hash table for good; it holds records alone.
      local long = 'a field longer than hash-max-listpack-value makes this hash a hash table: lookups in O(1)'
      call('HSET', opps, long, '')
      call('HDEL', opps, long)
    end
  end
  if #gcDels > 0 then hdel(opps, gcDels) end
  for i = 1, #zadds, CHUNK do call('ZADD', listed, unpack(zadds, i, min(i + CHUNK - 1, #zadds))) end
  if #gcDone > 0 then call('ZREM', listed, unpack(gcDone)) end
  local function e(x) return x and x + 1 or 0 end
  local nh
  if L11 then
    if store.flush() > 0 then
      -- One more, or the observation time when greater (as the version).
      wc = max(wc + 1, at)
      -- The buckets' write stamp, read with them (store.lua checks it): one more, or Redis's
      -- clock in µs when greater, so that no two writes leave the same stamp even where Redis
      -- lost the one between and the count above repeats.
      local t = call('TIME')
      local was = tonumber(call('HGET', KEYS[3], 'written')) or 0
      call('HSET', KEYS[3], 'written', fmt('%d', max(was + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))))
    end
    local sL, sp, sn = store.shape()
    nh = spack('<BB' .. string.rep('I7', 25), 11, G,
      e(w), e(pm), e(f), e(l), e(hcm), e(hch), e(rt), e(g), C, P, U,
      hr[1], hr[2], hr[3], dy[1], dy[2], dy[3], wk[1], wk[2], wk[3],
      cutH and cutH >= 0 and cutH + 1 or 0, sL, sp, sn, wc)
  else
    nh = spack(HEADW, mirror and 12 or 10, G,
      e(w), e(pm), e(f), e(l), e(hcm), e(hch), e(rt), e(g), C, P, U,
      hr[1], hr[2], hr[3], dy[1], dy[2], dy[3], wk[1], wk[2], wk[3],
      cutH and cutH >= 0 and cutH + 1 or 0)
  end
  if nh ~= head then sets[#sets + 1] = 'H'; sets[#sets + 1] = nh end
  if #dels > 0 then hdel(st, dels) end
  if #sets > 0 then hset(st, sets) end
  if ttl > 0 then
    call('PEXPIRE', opps, ARGV[3]); call('PEXPIRE', st, ARGV[3])
    -- Every call on an aggregate being converted keeps its packed store as long as its record hash.
    if mirror then call('PEXPIRE', KEYS[3], ARGV[3]) end
    if refresh then local t2 = fmt('%d', 2 * ttl); call('PEXPIRE', listed, t2) end
  end
end

-- The outcomes joined a thousand at a time: the embedded server's table.concat pushes every element
-- (and separator) onto a registry of 5 120 slots, which a batch of 2 560 observations overflowed.
local outcomes = concat(out, '', 1, min(#out, 1000))
for i = 1001, #out, 1000 do outcomes = outcomes .. concat(out, '', i, min(i + 999, #out)) end
return {outcomes, v, C, P, U, hr[1], hr[2], hr[3], dy[1], dy[2], dy[3], wk[1], wk[2], wk[3],
  f and fmt('%d', f) or '', l and fmt('%d', l) or ''}
