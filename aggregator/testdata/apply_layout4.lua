-- Applies a batch of observations to one aggregate, atomically. Running it twice with the same
-- arguments changes nothing the second time: every write is a max-merge on (assessed, seq), so a
-- retried call after a lost reply, or a redelivered batch, is recognised as duplicates.
--
-- KEYS[1] hash  opportunity id -> "<class><occurred_us hex>,<assessed_us hex>[,<seq hex>][;<horizon_us hex>]":
--               the winning assessment, and its horizon (the greatest occurred_us of every assessment
--               applied while retained) when that is above the winner's occurred_us
-- KEYS[2] hash  state: C P U (retained counts), v (version, see below), w (newest occurred_us),
--               h<hour><class> counts of every retained hour, a<hour> b<hour> its least and
--               greatest occurred_us, m<minute><class> counts of the last 70 minutes, pm (minute
--               buckets pruned up to), f l (first and last retained occurred_us),
--               cm ch x1..x9: the window sums (1h, 24h, 7d × C P U) cached for minute cm, hour ch,
--               rt (server time, s, of the last TTL refresh of KEYS[3] and KEYS[4]), enc (see below).
--               A count that falls to 0 is deleted. Numbers other than v may be written in
--               exponent form (Redis formats Lua numbers shortest-exact); only this script reads them.
-- KEYS[3] hash  the id index: per hour, the ids whose winner or horizon entered that hour, so that a
--               record can be found from the hour of its winner (to recompute the hour's bounds)
--               and from the hour of its horizon (to delete it once that hour expires). Field
--               "<hour>" is the hour's open chunk, "<k>|" then entries; fields "<hour>.1" ..
--               "<hour>.<k>" its closed chunks. An entry is "<length of id>:<id>", so ids may hold
--               any byte. A chunk is closed once appending would take it past CHUNKBYTES, so an
--               append costs a bounded copy however much the hour holds.
-- KEYS[4] sorted set of the hours that have index chunks, scored by hour: garbage collection visits
--               exactly those, however far apart (an event dated 1970 and one dated today make two
--               entries, not half a million hours to walk)
-- ARGV[1] retention_us, ARGV[2] observation time at_us, ARGV[3] key ttl in ms (0: none),
-- then two per observation: id, and its record as KEYS[1] stores it (encoded by the caller, so a
-- byte-identical duplicate is recognised by one string comparison; the occurred time is read
-- from it).
-- Returns {outcomes, version, C, P, U, 1h C P U, 24h C P U, 7d C P U, first_us, last_us} where
-- outcomes has one letter per observation: N counted, R reassessed, D duplicate, S stale, E expired.
--
-- Retention is by whole hours: hour h is retained while h >= floor((w - retention) / 1h). When an
-- hour leaves, its bucket counts leave C P U at once. A record is kept while its horizon is retained
-- (docs/semantics.md#retention), so a redelivered older assessment still meets the identity; records
-- whose horizon expired are deleted a little per batch (garbage collection from the id index), and
-- until then they read as absent.
--
-- Cost: Redis work per call is a fixed handful of commands however many hours the batch touches
-- (docs/semantics.md#delivery: one script call per aggregate and batch). The state hash is read
-- through a cache (one HMGET up front, one for every bucket and bound the batch touches) and
-- written once at the end; the index with one HMGET and one HSET of the touched hours' open chunks.
local MIN, HOUR = 60000000, 3600000000
local MKEEP = 70 -- minute buckets kept behind the newest event: the 1h window plus skew
local CHUNK = 4000 -- most arguments per command built in the script (Lua's unpack limit is 8000)
local CHUNKBYTES = 1024 -- an index chunk is closed before it grows past this
local opps, st, index, listed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ret = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local floor = math.floor
local find, sub = string.find, string.sub
local fmt = string.format
local function num(x) return fmt('%d', x) end -- exact: every value is an integer below 2^53

-- hmget reads fields of key in chunks, returning one value (or false) per field.
local function hmget(key, fields)
  if #fields <= CHUNK then return redis.call('HMGET', key, unpack(fields)) end
  local out = {}
  for i = 1, #fields, CHUNK do
    local got = redis.call('HMGET', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end
local function hdel(key, fields)
  for i = 1, #fields, CHUNK do redis.call('HDEL', key, unpack(fields, i, math.min(i + CHUNK - 1, #fields))) end
end
-- hset writes field, value pairs (a flat list).
local function hset(key, pairs)
  for i = 1, #pairs, CHUNK do redis.call('HSET', key, unpack(pairs, i, math.min(i + CHUNK - 1, #pairs))) end
end

-- The state hash, read through a cache: sv[field] is its value, false when absent, nil when not
-- read yet. Changes are made in the cache (sset) and written by swrite.
local sv, sdirty, sdirtyList = {}, {}, {}
local function sread(fields)
  local miss, seen = {}, {}
  for _, k in ipairs(fields) do
    if sv[k] == nil and not seen[k] then seen[k] = true; miss[#miss + 1] = k end
  end
  if #miss > 0 then
    local got = hmget(st, miss)
    for i, k in ipairs(miss) do sv[k] = got[i] end
  end
end
local function sset(k, v)
  sv[k] = v
  if not sdirty[k] then sdirty[k] = true; sdirtyList[#sdirtyList + 1] = k end
end
local function swrite()
  local sets, dels = {}, {}
  for _, k in ipairs(sdirtyList) do
    local v = sv[k]
    if v then sets[#sets + 1] = k; sets[#sets + 1] = v else dels[#dels + 1] = k end
  end
  if #sets > 0 then hset(st, sets) end
  if #dels > 0 then hdel(st, dels) end
  sdirty, sdirtyList = {}, {}
end

local n = (#ARGV - 3) / 2

-- Per hour and minute the batch touches, its field names are built once: hinfo[-h] holds s (the
-- hour in decimal), lo hi (least and greatest occurred inserted), rlo rhi (removed) and ents (the
-- index entries to append).
-- Tables keyed by an hour or minute use its negative: the embedded Redis of `repeatrate dev`
-- (gopher-lua) keeps positive integer keys below 2^26 in an array part grown up to the key, so an
-- hour since 1970 (about 5·10^5) or a minute (3·10^7) would allocate that many slots per call.
local hinfo, hlist, mname = {}, {}, {}
local function hourOf(h)
  local t = hinfo[-h]
  if not t then t = {s = num(h)}; hinfo[-h] = t; hlist[#hlist + 1] = h end
  return t
end

-- Each observation's occurred time and hour, and the held records of the batch's opportunities
-- (one HMGET); the state fields the batch will most likely touch are read with the head (one HMGET).
local occs, hs, held = {}, {}, {}
local want = {'w', 'pm', 'f', 'l', 'v', 'C', 'P', 'U', 'cm', 'ch', 'x1', 'x2', 'x3', 'x4', 'x5', 'x6', 'x7', 'x8', 'x9', 'enc', 'rt'}
if n > 0 then
  local ids = {}
  for i = 1, n do ids[i] = ARGV[2 + i * 2] end
  local got = hmget(opps, ids)
  for i = 1, n do
    local id, value = ids[i], ARGV[3 + i * 2]
    if held[id] == nil then held[id] = got[i] end
    local occ = tonumber(sub(value, 2, find(value, ',', 3, true) - 1), 16)
    local h = floor(occ / HOUR)
    occs[i], hs[i] = occ, h
    local t = hinfo[-h]
    if not t then
      t = hourOf(h)
      local x = t.s
      want[#want + 1] = 'h' .. x .. 'C'; want[#want + 1] = 'h' .. x .. 'P'; want[#want + 1] = 'h' .. x .. 'U'
      want[#want + 1] = 'a' .. x; want[#want + 1] = 'b' .. x
    end
  end
end
sread(want)
-- The state hash and the index are read and written a field at a time, so they must be hash
-- tables: a small hash (up to hash-max-listpack-entries, 128 to 512 fields) is stored as a listpack,
-- where every field lookup scans the whole hash, and the buckets of a day fill some 350 fields. A
-- value longer than hash-max-listpack-value (64 bytes by default) makes Redis convert a hash to a
-- hash table for good, so each of the two is created with one.
if not sv.enc and n > 0 then
  local why = 'a value longer than hash-max-listpack-value keeps this hash a hash table: field lookups in O(1)'
  sset('enc', why)
  redis.call('HSET', index, 'enc', why)
end
local w, pm, f, l = tonumber(sv.w), tonumber(sv.pm), tonumber(sv.f), tonumber(sv.l)
local w0, f0, l0 = w, f, l
local cutH, mfloor -- first retained hour, first minute with a bucket
if w then cutH, mfloor = floor((w - ret) / HOUR), floor(w / MIN) - MKEEP end
local changed = false
local fDirty, lDirty = false, false -- f or l may no longer be exact: recompute from a/b at the end

-- Window sums at the observation time. They are cached per (minute, hour) of that time and kept
-- up to date by every bucket change, so a batch recomputes them from the buckets only when its
-- observation time enters a new minute (or buckets were dropped).
local M, H = floor(at / MIN), floor(at / HOUR)
local slot = {C = 1, P = 2, U = 3}
local hr, dy, wk = {0, 0, 0}, {0, 0, 0}, {0, 0, 0}
local cached = tonumber(sv.cm) == M and tonumber(sv.ch) == H
if cached then
  for j = 1, 3 do
    hr[j], dy[j], wk[j] = tonumber(sv['x' .. j]), tonumber(sv['x' .. (3 + j)]), tonumber(sv['x' .. (6 + j)])
  end
end
local cacheDirty = false

local function inWindows(prefix, b, j, d)
  if prefix == 'm' then
    if b <= M and b >= M - 59 then hr[j] = hr[j] + d; return true end
  elseif b <= H and b >= H - 167 then
    wk[j] = wk[j] + d
    if b >= H - 23 then dy[j] = dy[j] + d end
    return true
  end
  return false
end

-- Count changes are summed here and folded into the cache once per field (applyDeltas).
local deltas, dlist = {}, {}
local function addDelta(field, d)
  local x = deltas[field]
  if x == nil then dlist[#dlist + 1] = field; x = 0 end
  deltas[field] = x + d
end
local function applyDeltas()
  if #dlist == 0 then return end
  sread(dlist)
  for _, k in ipairs(dlist) do
    local d = deltas[k]
    if d ~= 0 then
      local x = (tonumber(sv[k]) or 0) + d
      sset(k, x ~= 0 and x or false)
    end
  end
  deltas, dlist = {}, {}
end

local function bump(cls, occ, d)
  addDelta(cls, d)
  local m = floor(occ / MIN)
  if m >= mfloor then
    local ms = mname[-m]
    if not ms then ms = 'm' .. num(m); mname[-m] = ms end
    addDelta(ms .. cls, d)
    if cached and inWindows('m', m, slot[cls], d) then cacheDirty = true end
  end
  local h = floor(occ / HOUR)
  addDelta('h' .. hourOf(h).s .. cls, d)
  if cached and inWindows('h', h, slot[cls], d) then cacheDirty = true end
end

-- parse returns class, occurred, assessed, seq and horizon of a record, and the record without
-- its horizon.
local function parse(rec)
  local base, c, o, a, s, z = string.match(rec, '^((%a)(%x+),(%x+),?(%x*));?(%x*)$')
  o = tonumber(o, 16)
  return c, o, tonumber(a, 16), (s ~= '' and tonumber(s, 16)) or 0, (z ~= '' and tonumber(z, 16)) or o, base
end
-- withHorizon returns record base (no horizon) of an assessment that occurred at occ, with horizon z.
local function withHorizon(base, occ, z)
  if z > occ then return base .. ';' .. string.format('%x', z) end
  return base
end

local function pruneMinutes(from, to)
  applyDeltas()
  swrite()
  local gone = {}
  if to - from <= 300 and redis.call('HLEN', st) > 684 then
    for b = from, to - 1 do gone[#gone + 1] = 'm' .. b .. 'C'; gone[#gone + 1] = 'm' .. b .. 'P'; gone[#gone + 1] = 'm' .. b .. 'U' end
  else
    for _, k in ipairs(redis.call('HKEYS', st)) do
      if sub(k, 1, 1) == 'm' then
        local b = tonumber(sub(k, 2, -2))
        if b and b < to then gone[#gone + 1] = k end
      end
    end
  end
  if #gone > 0 then
    hdel(st, gone)
    for _, k in ipairs(gone) do sv[k] = false end
  end
end

-- expireHours drops the hours below newCut: their counts leave C P U, their buckets and bounds
-- are deleted. Only hours between the first and last retained ones can hold anything.
local function expireHours(newCut)
  if not f then return end
  local lo, hi = math.max(cutH, floor(f / HOUR)), math.min(newCut - 1, floor(l / HOUR))
  if lo > hi then return end
  applyDeltas()
  local fs = {}
  for h = lo, hi do fs[#fs + 1] = 'h' .. h .. 'C'; fs[#fs + 1] = 'h' .. h .. 'P'; fs[#fs + 1] = 'h' .. h .. 'U' end
  sread(fs)
  local dropped = false
  for h = lo, hi do
    local kc, kp, ku = 'h' .. h .. 'C', 'h' .. h .. 'P', 'h' .. h .. 'U'
    local c, p, u = tonumber(sv[kc]) or 0, tonumber(sv[kp]) or 0, tonumber(sv[ku]) or 0
    if c + p + u > 0 then
      addDelta('C', -c); addDelta('P', -p); addDelta('U', -u)
      changed, dropped = true, true
      sset(kc, false); sset(kp, false); sset(ku, false); sset('a' .. h, false); sset('b' .. h, false)
      if pm and (h + 1) * 60 > pm then -- a short retention: the hour still has minute buckets
        for m = h * 60, h * 60 + 59 do sset('m' .. m .. 'C', false); sset('m' .. m .. 'P', false); sset('m' .. m .. 'U', false) end
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

-- advance moves the watermark to occ: hours beyond retention leave every count, and minute buckets
-- no window can reach any more are dropped.
local function advance(occ)
  if w and occ <= w then return end
  w = occ
  local nc = floor((w - ret) / HOUR)
  if cutH and nc > cutH then expireHours(nc) end
  cutH = nc
  local nm = floor(w / MIN) - MKEEP
  -- Minute buckets below the floor are never read or written again; deleting them is only
  -- garbage collection, done in steps of an hour of minutes to keep it cheap.
  if not pm then pm = nm; sset('pm', pm) end
  if nm - pm >= 60 then pruneMinutes(pm, nm); pm = nm; sset('pm', nm); cached = false end
  mfloor = nm
end

-- Per hour touched by the batch (hinfo): least and greatest occurred inserted (lo, hi) and removed
-- (rlo, rhi).
local function insertOcc(occ)
  local t = hourOf(floor(occ / HOUR))
  if not t.lo or occ < t.lo then t.lo = occ end
  if not t.hi or occ > t.hi then t.hi = occ end
  if not f or occ < f then f = occ end
  if not l or occ > l then l = occ end
end
local function removeOcc(occ)
  local t = hourOf(floor(occ / HOUR))
  if not t.rlo or occ < t.rlo then t.rlo = occ end
  if not t.rhi or occ > t.rhi then t.rhi = occ end
  if occ <= f then fDirty = true end
  if occ >= l then lDirty = true end
end

-- Writes are collected and made at the end: one HSET for the records, one HSET for the index
-- chunks of the touched hours.
local pendRec, pendIds, pushHours, pushedTo = {}, {}, {}, {}
-- push lists id under hour once per batch, however often the batch moves it there.
local function push(id, hour)
  local p = pushedTo[id]
  if p == hour then return end
  if p then
    if type(p) ~= 'table' then p = {[-p] = true}; pushedTo[id] = p end
    if p[-hour] then return end
    p[-hour] = true
  else
    pushedTo[id] = hour
  end
  local t = hourOf(hour)
  local e = t.ents
  if not e then e = {}; t.ents = e; pushHours[#pushHours + 1] = hour end
  e[#e + 1] = #id .. ':' .. id
end
-- write records value for id and lists id under each given hour that is not nil.
local function write(id, value, h1, h2)
  if pendRec[id] == nil then pendIds[#pendIds + 1] = id end
  pendRec[id] = value
  held[id] = value
  if h1 then push(id, h1) end
  if h2 and h2 ~= h1 then push(id, h2) end
end

local out = {}
for i = 1, n do
  local id, value, occ = ARGV[2 + i * 2], ARGV[3 + i * 2], occs[i]
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
      if oz < cut then rec = nil end -- its horizon expired: the record is garbage
    end
    if not rec then
      local cls = sub(value, 1, 1)
      write(id, value, hs[i])
      insertOcc(occ)
      bump(cls, occ, 1)
      changed = true
      out[i] = 'N'
    else
      local cls, _, asd, seq = parse(value)
      if asd > oa or (asd == oa and seq > os) then
        if oo >= cut then bump(oc, oo, -1) end
        bump(cls, occ, 1)
        local z = math.max(oz, occ)
        local h, oh, zh, ozh = hs[i], floor(oo / HOUR), floor(z / HOUR), floor(oz / HOUR)
        write(id, withHorizon(value, occ, z), h ~= oh and h or nil, zh ~= ozh and zh or nil)
        if oo < cut then
          insertOcc(occ)
        elseif occ ~= oo then
          removeOcc(oo); insertOcc(occ)
        end
        changed = true
        out[i] = 'R'
      else
        if occ > oz then -- the horizon grows: list the id under its new hour
          local zh = hs[i]
          write(id, withHorizon(obase, oo, occ), zh ~= floor(oz / HOUR) and zh or nil)
        end
        out[i] = (asd == oa and seq == os) and 'D' or 'S'
      end
    end
  end
end

if #pendIds > 0 then
  local h = {}
  for _, id in ipairs(pendIds) do h[#h + 1] = id; h[#h + 1] = pendRec[id] end
  hset(opps, h)
end

-- chunkHeader returns the number of closed chunks of an open chunk and where its entries start.
local function chunkHeader(open)
  local k, pos = string.match(open, '^(%d+)|()')
  return tonumber(k), pos
end
-- entries appends to ids the ids of the entries of chunk s from position pos.
local function entries(ids, s, pos)
  local len = #s
  while pos <= len do
    local c = find(s, ':', pos, true)
    local e = c + tonumber(sub(s, pos, c - 1))
    ids[#ids + 1] = sub(s, c + 1, e)
    pos = e + 1
  end
  return ids
end

local newHours = false
if #pushHours > 0 then
  local fs = {}
  for i, hour in ipairs(pushHours) do fs[i] = hinfo[-hour].s end
  local open = hmget(index, fs)
  local sets, zs = {}, {}
  for i, hour in ipairs(pushHours) do
    local add = table.concat(hinfo[-hour].ents)
    local cur = open[i]
    if not cur then
      sets[#sets + 1] = fs[i]; sets[#sets + 1] = '0|' .. add
      zs[#zs + 1] = hour; zs[#zs + 1] = fs[i]
    else
      local k, pos = chunkHeader(cur)
      if #cur - pos + 1 + #add > CHUNKBYTES and #cur >= pos then -- close the open chunk
        sets[#sets + 1] = fs[i] .. '.' .. (k + 1); sets[#sets + 1] = sub(cur, pos)
        sets[#sets + 1] = fs[i]; sets[#sets + 1] = (k + 1) .. '|' .. add
      else
        sets[#sets + 1] = fs[i]; sets[#sets + 1] = cur .. add
      end
    end
  end
  hset(index, sets)
  -- The index and the sorted set of its hours change together (expire together, see the end).
  for i = 1, #zs, CHUNK do redis.call('ZADD', listed, unpack(zs, i, math.min(i + CHUNK - 1, #zs))) end
  newHours = #zs > 0
end

-- hourIds returns the ids listed under hour h and its number of closed chunks (nil when the hour
-- has no chunk).
local function hourIds(h)
  local fh = num(h)
  local open = redis.call('HGET', index, fh)
  if not open then return {}, nil end
  local k, pos = chunkHeader(open)
  local ids = {}
  if k > 0 then
    local fs = {}
    for i = 1, k do fs[i] = fh .. '.' .. i end
    for _, c in ipairs(hmget(index, fs)) do
      if c then entries(ids, c, 1) end
    end
  end
  return entries(ids, open, pos), k
end
-- rewriteHour replaces hour h's chunks (k closed ones before) by ids, a list of entries.
local function rewriteHour(h, k, ents)
  local fh = num(h)
  local sets, chunk, size, closed = {}, {}, 0, 0
  for _, e in ipairs(ents) do
    if size + #e > CHUNKBYTES and size > 0 then
      closed = closed + 1
      sets[#sets + 1] = fh .. '.' .. closed; sets[#sets + 1] = table.concat(chunk)
      chunk, size = {}, 0
    end
    chunk[#chunk + 1] = e; size = size + #e
  end
  local dels = {}
  for i = closed + 1, k do dels[#dels + 1] = fh .. '.' .. i end
  if #ents == 0 then
    dels[#dels + 1] = fh
  else
    sets[#sets + 1] = fh; sets[#sets + 1] = closed .. '|' .. table.concat(chunk)
  end
  if #sets > 0 then hset(index, sets) end
  if #dels > 0 then hdel(index, dels) end
end

-- scanHour returns the least and greatest occurred of hour h's records, reading its ids. An
-- index that holds more than twice the ids still listed there for a reason (their winner or their
-- horizon is in hour h), plus some slack, is rewritten with those alone: an opportunity moved back
-- and forth between hours costs its hour an entry per batch, and the rewrite keeps the cost of a
-- scan proportional to what the hour holds.
local function scanHour(h)
  local ids, k = hourIds(h)
  local lo, hi
  local recs = #ids > 0 and hmget(opps, ids) or {}
  local keep, kept = {}, {}
  for j = 1, #recs do
    if recs[j] then
      local _, o, _, _, z = parse(recs[j])
      if floor(o / HOUR) == h then
        if not lo or o < lo then lo = o end
        if not hi or o > hi then hi = o end
      end
      if (floor(o / HOUR) == h or floor(z / HOUR) == h) and not kept[ids[j]] then
        kept[ids[j]] = true
        keep[#keep + 1] = #ids[j] .. ':' .. ids[j]
      end
    end
  end
  if k and #ids > 2 * #keep + 64 then rewriteHour(h, k, keep) end
  return lo, hi
end

-- Bounds of the touched hours: merged with what was held, or recomputed from the index when an
-- opportunity holding one moved out. Most buckets and bounds were read with the head; the rest
-- (hours only a re-assessment's former winner touched, minute buckets) in one more call.
do
  local fs = {}
  for _, k in ipairs(dlist) do fs[#fs + 1] = k end
  for _, h in ipairs(hlist) do
    local t = hinfo[-h]
    if h >= cutH and (t.lo or t.rlo) then fs[#fs + 1] = 'a' .. t.s; fs[#fs + 1] = 'b' .. t.s end
  end
  sread(fs)
end
applyDeltas()
for _, h in ipairs(hlist) do
  local t = hinfo[-h]
  if h >= cutH and (t.lo or t.rlo) then
    local ka, kb = 'a' .. t.s, 'b' .. t.s
    local a0, z0 = tonumber(sv[ka]), tonumber(sv[kb])
    local a, z = a0, z0
    if t.lo then
      if not a or t.lo < a then a = t.lo end
      if not z or t.hi > z then z = t.hi end
    end
    if t.rlo and (not a or t.rlo <= a or t.rhi >= z) then a, z = scanHour(h) end
    if a ~= a0 then sset(ka, a or false) end
    if z ~= z0 then sset(kb, z or false) end
  end
end

-- First and last: the least bound of the lowest retained hour, the greatest of the highest.
if (fDirty or lDirty) and w then
  local fs = {}
  local top = floor(w / HOUR)
  for h = cutH, top do fs[#fs + 1] = 'a' .. h; fs[#fs + 1] = 'b' .. h end
  sread(fs)
  f, l = nil, nil
  for i = 1, #fs, 2 do
    if sv[fs[i]] then f = tonumber(sv[fs[i]]); break end
  end
  for i = #fs, 2, -2 do
    if sv[fs[i]] then l = tonumber(sv[fs[i]]); break end
  end
end

-- Garbage collection: delete the records of expired hours, a bounded number per batch (at least
-- twice what the batch can add), from the lowest listed hour up, a chunk at a time. A record goes
-- when its horizon is in the hour being collected; one listed there only for its winner stays for
-- its horizon's.
if n > 0 and cutH then
  local budget = math.min(2 * n + 100, CHUNK)
  local hours = redis.call('ZRANGEBYSCORE', listed, '-inf', '(' .. cutH, 'LIMIT', 0, 64)
  local ids, idHour, idxDel, idxSet, done = {}, {}, {}, {}, {}
  for _, fh in ipairs(hours) do
    if budget <= 0 then break end
    local h = tonumber(fh)
    local open = redis.call('HGET', index, fh)
    if not open then
      done[#done + 1] = fh
    else
      local k, pos = chunkHeader(open)
      local from = #ids
      while k > 0 and budget > 0 do
        local c = redis.call('HGET', index, fh .. '.' .. k)
        if c then entries(ids, c, 1) end
        idxDel[#idxDel + 1] = fh .. '.' .. k
        k = k - 1
        budget = budget - (#ids - from); from = #ids
      end
      if k == 0 and budget > 0 then
        entries(ids, open, pos)
        idxDel[#idxDel + 1] = fh
        done[#done + 1] = fh
        budget = budget - (#ids - from)
      else
        idxSet[#idxSet + 1] = fh; idxSet[#idxSet + 1] = k .. '|' .. sub(open, pos)
      end
      for j = #idHour + 1, #ids do idHour[j] = h end
    end
  end
  if #ids > 0 then
    local recs = hmget(opps, ids)
    local del = {}
    for j = 1, #recs do
      if recs[j] then
        local _, _, _, _, z = parse(recs[j])
        if floor(z / HOUR) == idHour[j] then del[#del + 1] = ids[j] end
      end
    end
    if #del > 0 then hdel(opps, del) end
  end
  if #idxDel > 0 then hdel(index, idxDel) end
  if #idxSet > 0 then hset(index, idxSet) end
  if #done > 0 then redis.call('ZREM', listed, unpack(done)) end
end

if w and w ~= w0 then sset('w', w) end
if f then
  if f ~= f0 then sset('f', f) end
  if l ~= l0 then sset('l', l) end
elseif f0 then
  sset('f', false); sset('l', false)
end

-- The version: one more than before, or the observation time when that is greater, so a version
-- published before Redis lost recent writes is never named again for other content.
local v = tonumber(sv.v) or 0
if changed then
  v = math.max(v + 1, at)
  sset('v', num(v))
end
applyDeltas()
local res = {table.concat(out), v}
for _, k in ipairs({'C', 'P', 'U'}) do res[#res + 1] = tonumber(sv[k]) or 0 end
if cached and cacheDirty and n > 0 then
  sset('x1', hr[1]); sset('x2', hr[2]); sset('x3', hr[3]); sset('x4', dy[1]); sset('x5', dy[2]); sset('x6', dy[3])
  sset('x7', wk[1]); sset('x8', wk[2]); sset('x9', wk[3])
end
-- The index and its sorted set of hours live twice the idle TTL and are refreshed every half TTL
-- (server clock, stamp rt) and whenever they gain an hour, which is also when either is created:
-- they outlive the records they find the garbage of, and do not outlive a dropped aggregate for
-- long. The records and the state are refreshed by every batch, so an aggregate goes exactly the
-- idle TTL after its last event.
local refresh = false
if n > 0 and ttl > 0 then
  local now = tonumber(redis.call('TIME')[1])
  if newHours or not sv.rt or now - tonumber(sv.rt) >= ttl / 2000 then refresh = true; sset('rt', now) end
end
swrite()
if n > 0 and ttl > 0 then
  redis.call('PEXPIRE', opps, ttl); redis.call('PEXPIRE', st, ttl)
  if refresh then redis.call('PEXPIRE', index, 2 * ttl); redis.call('PEXPIRE', listed, 2 * ttl) end
end

-- windows at the observation time
if not cached then
  local add = inWindows
  hr[1], hr[2], hr[3], dy[1], dy[2], dy[3], wk[1], wk[2], wk[3] = 0, 0, 0, 0, 0, 0, 0, 0, 0
  if redis.call('HLEN', st) <= 684 then
    -- A small state hash (sparse traffic, often a listpack): one pass over what exists.
    local kv = redis.call('HGETALL', st)
    for i = 1, #kv, 2 do
      local k = kv[i]
      local p = sub(k, 1, 1)
      if p == 'm' or p == 'h' then
        local j = slot[sub(k, -1)]
        local b = tonumber(sub(k, 2, -2))
        if j and b then add(p, b, j, tonumber(kv[i + 1])) end
      end
    end
  else
    -- A large one: look up exactly the buckets the windows cover.
    local function get(prefix, from, to)
      local fs = {}
      for b = from, to do
        fs[#fs + 1] = prefix .. b .. 'C'; fs[#fs + 1] = prefix .. b .. 'P'; fs[#fs + 1] = prefix .. b .. 'U'
      end
      local got = hmget(st, fs)
      for i = 1, #got do
        if got[i] then add(prefix, from + floor((i - 1) / 3), (i - 1) % 3 + 1, tonumber(got[i])) end
      end
    end
    get('m', M - 59, M)
    get('h', H - 167, H)
  end
  if n > 0 then
    redis.call('HSET', st, 'cm', M, 'ch', H, 'x1', hr[1], 'x2', hr[2], 'x3', hr[3], 'x4', dy[1], 'x5', dy[2],
      'x6', dy[3], 'x7', wk[1], 'x8', wk[2], 'x9', wk[3])
  end
end
for _, c in ipairs({hr, dy, wk}) do
  res[#res + 1] = c[1]; res[#res + 1] = c[2]; res[#res + 1] = c[3]
end
res[#res + 1] = f and num(f) or ''
res[#res + 1] = l and num(l) or ''
return res
