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
--               buckets pruned up to), f l (first and last retained occurred_us), t (last TTL
--               refresh of the lists, s),
--               cm ch x1..x9: the window sums (1h, 24h, 7d × C P U) cached for minute cm, hour ch
-- KEYS[3] prefix of the id lists: KEYS[3] .. <hour> lists the ids whose winner or horizon entered
--               that hour, so that a record can be found from the hour of its winner (to recompute the
--               hour's bounds) and from the hour of its horizon (to delete it once that hour expires)
-- KEYS[4] sorted set of the hours that have an id list, scored by hour: garbage collection and
--               TTL refreshes visit exactly those, however far apart (an event dated 1970 and one
--               dated today make two entries, not half a million hours to walk)
-- ARGV[1] retention_us, ARGV[2] observation time at_us, ARGV[3] key ttl in ms (0: none),
-- then three per observation: id, occurred_us, and its record as KEYS[1] stores it (encoded by
-- the caller, so a byte-identical duplicate is recognised by one string comparison).
-- Returns {outcomes, version, C, P, U, 1h C P U, 24h C P U, 7d C P U, first_us, last_us} where
-- outcomes has one letter per observation: N counted, R reassessed, D duplicate, S stale, E expired.
--
-- Retention is by whole hours: hour h is retained while h >= floor((w - retention) / 1h). When an
-- hour leaves, its bucket counts leave C P U at once. A record is kept while its horizon is retained
-- (docs/semantics.md#retention), so a redelivered older assessment still meets the identity; records
-- whose horizon expired are deleted a little per batch (garbage collection from the id lists), and
-- until then they read as absent.
local MIN, HOUR = 60000000, 3600000000
local MKEEP = 70 -- minute buckets kept behind the newest event: the 1h window plus skew
local CHUNK = 4000 -- most arguments per command built in the script (Lua's unpack limit is 8000)
local opps, st, lists, listed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ret = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local floor = math.floor
local function num(x) return string.format('%.0f', x) end

local head = redis.call('HMGET', st, 'w', 'pm', 'f', 'l', 't')
local w, pm, f, l = tonumber(head[1]), tonumber(head[2]), tonumber(head[3]), tonumber(head[4])
local refreshed = tonumber(head[5]) or 0
local w0, f0, l0 = w, f, l
local cutH, mfloor -- first retained hour, first minute with a bucket
if w then cutH, mfloor = floor((w - ret) / HOUR), floor(w / MIN) - MKEEP end
local changed = false
local fDirty, lDirty = false, false -- f or l may no longer be exact: recompute from a/b at the end

-- hmget reads fields of key in chunks, returning one value (or false) per field.
local function hmget(key, fields)
  local out = {}
  for i = 1, #fields, CHUNK do
    local part = {}
    for j = i, math.min(i + CHUNK - 1, #fields) do part[#part + 1] = fields[j] end
    local got = redis.call('HMGET', key, unpack(part))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end
local function hdel(key, fields)
  for i = 1, #fields, CHUNK do
    local part = {}
    for j = i, math.min(i + CHUNK - 1, #fields) do part[#part + 1] = fields[j] end
    redis.call('HDEL', key, unpack(part))
  end
end

-- Window sums at the observation time. They are cached per (minute, hour) of that time and kept
-- up to date by every bucket change, so a batch recomputes them from the buckets only when its
-- observation time enters a new minute (or buckets were dropped); otherwise it costs 11 fields.
local M, H = floor(at / MIN), floor(at / HOUR)
local slot = {C = 1, P = 2, U = 3}
local hr, dy, wk = {0, 0, 0}, {0, 0, 0}, {0, 0, 0}
local cache = redis.call('HMGET', st, 'cm', 'ch', 'x1', 'x2', 'x3', 'x4', 'x5', 'x6', 'x7', 'x8', 'x9')
local cached = tonumber(cache[1]) == M and tonumber(cache[2]) == H
if cached then
  for j = 1, 3 do
    hr[j], dy[j], wk[j] = tonumber(cache[2 + j]), tonumber(cache[5 + j]), tonumber(cache[8 + j])
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

-- Count changes are summed here and written once per field (flush): a batch touches few buckets.
local deltas, dirty = {}, {}
local function addDelta(field, d)
  local x = deltas[field]
  if x == nil then dirty[#dirty + 1] = field; x = 0 end
  deltas[field] = x + d
end
local function flush()
  for _, k in ipairs(dirty) do
    if deltas[k] ~= 0 then redis.call('HINCRBY', st, k, deltas[k]) end
  end
  deltas, dirty = {}, {}
end

local function bump(cls, occ, d)
  addDelta(cls, d)
  local m = floor(occ / MIN)
  if m >= mfloor then
    addDelta('m' .. m .. cls, d)
    if cached and inWindows('m', m, slot[cls], d) then cacheDirty = true end
  end
  local h = floor(occ / HOUR)
  addDelta('h' .. h .. cls, d)
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
  if to - from <= 300 and redis.call('HLEN', st) > 684 then
    local fs = {}
    for b = from, to - 1 do fs[#fs + 1] = 'm' .. b .. 'C'; fs[#fs + 1] = 'm' .. b .. 'P'; fs[#fs + 1] = 'm' .. b .. 'U' end
    if #fs > 0 then hdel(st, fs) end
    return
  end
  local old = {}
  for _, k in ipairs(redis.call('HKEYS', st)) do
    if string.sub(k, 1, 1) == 'm' then
      local b = tonumber(string.sub(k, 2, -2))
      if b and b < to then old[#old + 1] = k end
    end
  end
  if #old > 0 then hdel(st, old) end
end

-- expireHours drops the hours below newCut: their counts leave C P U, their buckets and bounds
-- are deleted. Only hours between the first and last retained ones can hold anything.
local function expireHours(newCut)
  if not f then return end
  local lo, hi = math.max(cutH, floor(f / HOUR)), math.min(newCut - 1, floor(l / HOUR))
  if lo > hi then return end
  flush()
  local fs = {}
  for h = lo, hi do fs[#fs + 1] = 'h' .. h .. 'C'; fs[#fs + 1] = 'h' .. h .. 'P'; fs[#fs + 1] = 'h' .. h .. 'U' end
  local v = hmget(st, fs)
  local gone = {}
  for i = 0, hi - lo do
    local h = lo + i
    local c, p, u = tonumber(v[3 * i + 1]) or 0, tonumber(v[3 * i + 2]) or 0, tonumber(v[3 * i + 3]) or 0
    if c + p + u > 0 then
      addDelta('C', -c); addDelta('P', -p); addDelta('U', -u)
      changed = true
      gone[#gone + 1] = 'h' .. h .. 'C'; gone[#gone + 1] = 'h' .. h .. 'P'; gone[#gone + 1] = 'h' .. h .. 'U'
      gone[#gone + 1] = 'a' .. h; gone[#gone + 1] = 'b' .. h
      if pm and (h + 1) * 60 > pm then -- a short retention: the hour still has minute buckets
        for m = h * 60, h * 60 + 59 do gone[#gone + 1] = 'm' .. m .. 'C'; gone[#gone + 1] = 'm' .. m .. 'P'; gone[#gone + 1] = 'm' .. m .. 'U' end
      end
    end
  end
  if #gone > 0 then hdel(st, gone); cached = false end
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
  if not pm then pm = nm; redis.call('HSET', st, 'pm', pm) end
  if nm - pm >= 60 then flush(); pruneMinutes(pm, nm); pm = nm; redis.call('HSET', st, 'pm', nm); cached = false end
  mfloor = nm
end

-- Per hour touched by the batch: least and greatest occurred inserted (lo, hi) and removed (rlo, rhi).
local touched, touchedList = {}, {}
local function touch(h)
  local t = touched[h]
  if not t then t = {}; touched[h] = t; touchedList[#touchedList + 1] = h end
  return t
end
local function insertOcc(occ)
  local t = touch(floor(occ / HOUR))
  if not t.lo or occ < t.lo then t.lo = occ end
  if not t.hi or occ > t.hi then t.hi = occ end
  if not f or occ < f then f = occ end
  if not l or occ > l then l = occ end
end
local function removeOcc(occ)
  local t = touch(floor(occ / HOUR))
  if not t.rlo or occ < t.rlo then t.rlo = occ end
  if not t.rhi or occ > t.rhi then t.rhi = occ end
  if occ <= f then fDirty = true end
  if occ >= l then lDirty = true end
end

local n = (#ARGV - 3) / 3

-- Held records of the batch's opportunities, fetched in one call; writes are collected and made
-- at the end: one HSET for the records, one RPUSH per hour for the id lists.
local held = {}
if n > 0 then
  local ids = {}
  for i = 0, n - 1 do ids[i + 1] = ARGV[4 + i * 3] end
  local got = hmget(opps, ids)
  for i = 1, n do
    if held[ids[i]] == nil then held[ids[i]] = got[i] end
  end
end
local pendRec, pendIds, pushes, pushHours, pushed = {}, {}, {}, {}, {}
-- push lists id under hour once per batch, however often the batch moves it there.
local function push(id, hour)
  local p = pushes[hour]
  if not p then p = {}; pushes[hour] = p; pushHours[#pushHours + 1] = hour; pushed[hour] = {} end
  if pushed[hour][id] then return end
  pushed[hour][id] = true
  p[#p + 1] = id
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
for i = 0, n - 1 do
  local b = 3 + i * 3
  local id, occ, value = ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3]
  advance(occ)
  local cut = cutH * HOUR
  local rec = held[id]
  if rec == value and occ >= cut then
    -- The same assessment, byte for byte, of a record whose winner (and so horizon) is retained.
    out[#out + 1] = 'D'
  else
    local cls, _, asd, seq = parse(value)
    local oc, oo, oa, os, oz, obase
    if rec then
      oc, oo, oa, os, oz, obase = parse(rec)
      if oz < cut then rec = nil end -- its horizon expired: the record is garbage
    end
    local isNewer = rec and (asd > oa or (asd == oa and seq > os))
    if occ < cut then
      -- Changes nothing, even when newer than the held winner (docs/semantics.md#retention).
      out[#out + 1] = 'E'
    elseif not rec then
      write(id, value, floor(occ / HOUR))
      insertOcc(occ)
      bump(cls, occ, 1)
      changed = true
      out[#out + 1] = 'N'
    elseif isNewer then
      if oo >= cut then bump(oc, oo, -1) end
      bump(cls, occ, 1)
      local z = math.max(oz, occ)
      local h, oh, zh, ozh = floor(occ / HOUR), floor(oo / HOUR), floor(z / HOUR), floor(oz / HOUR)
      write(id, withHorizon(value, occ, z), h ~= oh and h or nil, zh ~= ozh and zh or nil)
      if oo < cut then
        insertOcc(occ)
      elseif occ ~= oo then
        removeOcc(oo); insertOcc(occ)
      end
      changed = true
      out[#out + 1] = 'R'
    else
      if occ > oz then -- the horizon grows: list the id under its new hour
        local zh = floor(occ / HOUR)
        write(id, withHorizon(obase, oo, occ), zh ~= floor(oz / HOUR) and zh or nil)
      end
      out[#out + 1] = (asd == oa and seq == os) and 'D' or 'S'
    end
  end
end

if #pendIds > 0 then
  local h = {}
  for _, id in ipairs(pendIds) do h[#h + 1] = id; h[#h + 1] = pendRec[id] end
  for i = 1, #h, CHUNK do
    redis.call('HSET', opps, unpack(h, i, math.min(i + CHUNK - 1, #h)))
  end
end
if #pushHours > 0 then
  local zs = {}
  for _, hour in ipairs(pushHours) do
    local ids = pushes[hour]
    for i = 1, #ids, CHUNK do redis.call('RPUSH', lists .. hour, unpack(ids, i, math.min(i + CHUNK - 1, #ids))) end
    if ttl > 0 then redis.call('PEXPIRE', lists .. hour, 2 * ttl) end
    zs[#zs + 1] = hour; zs[#zs + 1] = hour
  end
  for i = 1, #zs, CHUNK do redis.call('ZADD', listed, unpack(zs, i, math.min(i + CHUNK - 1, #zs))) end
  if ttl > 0 then redis.call('PEXPIRE', listed, 2 * ttl) end
end
flush()

-- scanHour returns the least and greatest occurred of hour h's records, reading its id list. A
-- list that holds more than twice the ids still listed there for a reason (their winner or their
-- horizon is in hour h), plus some slack, is rewritten with those alone: an opportunity moved back
-- and forth between hours costs its list an entry per batch, and the rewrite keeps the cost of a
-- scan proportional to what the hour holds.
local function scanHour(h)
  local ids = redis.call('LRANGE', lists .. h, 0, -1)
  local lo, hi
  local recs = hmget(opps, ids)
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
        keep[#keep + 1] = ids[j]
      end
    end
  end
  if #ids > 2 * #keep + 64 then
    redis.call('DEL', lists .. h)
    for i = 1, #keep, CHUNK do redis.call('RPUSH', lists .. h, unpack(keep, i, math.min(i + CHUNK - 1, #keep))) end
    if #keep > 0 and ttl > 0 then redis.call('PEXPIRE', lists .. h, 2 * ttl) end
  end
  return lo, hi
end

-- Bounds of the touched hours: merged with what was held, or recomputed from the id list when
-- an opportunity holding one moved out.
if #touchedList > 0 then
  local hs, fs = {}, {}
  for _, h in ipairs(touchedList) do
    if h >= cutH then hs[#hs + 1] = h; fs[#fs + 1] = 'a' .. h; fs[#fs + 1] = 'b' .. h end
  end
  local ab = hmget(st, fs)
  local set, del = {}, {}
  for i, h in ipairs(hs) do
    local t = touched[h]
    local a, z = tonumber(ab[2 * i - 1]), tonumber(ab[2 * i])
    if t.lo then
      if not a or t.lo < a then a = t.lo end
      if not z or t.hi > z then z = t.hi end
    end
    if t.rlo and (not a or t.rlo <= a or t.rhi >= z) then a, z = scanHour(h) end
    if a then
      set[#set + 1] = 'a' .. h; set[#set + 1] = num(a); set[#set + 1] = 'b' .. h; set[#set + 1] = num(z)
    else
      del[#del + 1] = 'a' .. h; del[#del + 1] = 'b' .. h
    end
  end
  if #set > 0 then redis.call('HSET', st, unpack(set)) end
  if #del > 0 then hdel(st, del) end
end

-- First and last: the least bound of the lowest retained hour, the greatest of the highest.
if (fDirty or lDirty) and w then
  local fs = {}
  local top = floor(w / HOUR)
  for h = cutH, top do fs[#fs + 1] = 'a' .. h; fs[#fs + 1] = 'b' .. h end
  local ab = hmget(st, fs)
  f, l = nil, nil
  for i = 1, #ab, 2 do
    if ab[i] then f = tonumber(ab[i]); break end
  end
  for i = #ab, 2, -2 do
    if ab[i] then l = tonumber(ab[i]); break end
  end
end

-- Garbage collection: delete the records of expired hours, a bounded number per batch (at least
-- twice what the batch can add), from the lowest listed hour up. A record goes when its horizon
-- is in the hour being collected; one listed there only for its winner stays for its horizon's.
if n > 0 and cutH then
  local budget = math.min(2 * n + 100, CHUNK)
  local hours = redis.call('ZRANGEBYSCORE', listed, '-inf', '(' .. cutH, 'LIMIT', 0, 64)
  for _, hs in ipairs(hours) do
    if budget <= 0 then break end
    local h = tonumber(hs)
    local ids = redis.call('LPOP', lists .. h, budget)
    if ids then
      local recs = hmget(opps, ids)
      local del = {}
      for j = 1, #recs do
        if recs[j] then
          local _, _, _, _, z = parse(recs[j])
          if floor(z / HOUR) == h then del[#del + 1] = ids[j] end
        end
      end
      if #del > 0 then hdel(opps, del) end
      budget = budget - #ids
    end
    if redis.call('EXISTS', lists .. h) == 0 then redis.call('ZREM', listed, hs) end
  end
end

local sets, dels = {}, {}
if w and w ~= w0 then sets[#sets + 1] = 'w'; sets[#sets + 1] = num(w) end
if f then
  if f ~= f0 then sets[#sets + 1] = 'f'; sets[#sets + 1] = num(f) end
  if l ~= l0 then sets[#sets + 1] = 'l'; sets[#sets + 1] = num(l) end
elseif f0 then
  dels = {'f', 'l'}
end
if #sets > 0 then redis.call('HSET', st, unpack(sets)) end
if #dels > 0 then redis.call('HDEL', st, unpack(dels)) end

-- The version: one more than before, or the observation time when that is greater, so a version
-- published before Redis lost recent writes is never named again for other content.
local v = tonumber(redis.call('HGET', st, 'v') or '0')
if changed then
  v = math.max(v + 1, at)
  redis.call('HSET', st, 'v', num(v))
end
if n > 0 and ttl > 0 then
  redis.call('PEXPIRE', opps, ttl); redis.call('PEXPIRE', st, ttl)
  -- The id lists live twice the idle TTL and are all refreshed every half TTL (server clock), so
  -- none expires while its aggregate is alive, and none outlives a dropped aggregate for long.
  local now = tonumber(redis.call('TIME')[1])
  if now - refreshed >= ttl / 2000 then
    for _, h in ipairs(redis.call('ZRANGE', listed, 0, -1)) do redis.call('PEXPIRE', lists .. h, 2 * ttl) end
    redis.call('PEXPIRE', listed, 2 * ttl)
    redis.call('HSET', st, 't', now)
  end
end

-- windows at the observation time
local res = {table.concat(out), v}
local all = redis.call('HMGET', st, 'C', 'P', 'U')
for i = 1, 3 do res[#res + 1] = tonumber(all[i] or '0') end
local add = inWindows
if cached then
  if cacheDirty and n > 0 then
    redis.call('HSET', st, 'x1', hr[1], 'x2', hr[2], 'x3', hr[3], 'x4', dy[1], 'x5', dy[2], 'x6', dy[3],
      'x7', wk[1], 'x8', wk[2], 'x9', wk[3])
  end
else
  hr[1], hr[2], hr[3], dy[1], dy[2], dy[3], wk[1], wk[2], wk[3] = 0, 0, 0, 0, 0, 0, 0, 0, 0
end
if cached then
elseif redis.call('HLEN', st) <= 684 then
  -- A small state hash (sparse traffic, often a listpack): one pass over what exists.
  local kv = redis.call('HGETALL', st)
  for i = 1, #kv, 2 do
    local k = kv[i]
    local p = string.sub(k, 1, 1)
    if p == 'm' or p == 'h' then
      local j = slot[string.sub(k, -1)]
      local b = tonumber(string.sub(k, 2, -2))
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
    local v = hmget(st, fs)
    for i = 1, #v do
      if v[i] then add(prefix, from + floor((i - 1) / 3), (i - 1) % 3 + 1, tonumber(v[i])) end
    end
  end
  get('m', M - 59, M)
  get('h', H - 167, H)
end
if not cached and n > 0 then
  redis.call('HSET', st, 'cm', M, 'ch', H, 'x1', hr[1], 'x2', hr[2], 'x3', hr[3], 'x4', dy[1], 'x5', dy[2],
    'x6', dy[3], 'x7', wk[1], 'x8', wk[2], 'x9', wk[3])
end
for _, c in ipairs({hr, dy, wk}) do
  res[#res + 1] = c[1]; res[#res + 1] = c[2]; res[#res + 1] = c[3]
end
res[#res + 1] = f and num(f) or ''
res[#res + 1] = l and num(l) or ''
return res
