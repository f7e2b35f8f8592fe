-- Applies a batch of observations to one aggregate, atomically. Running it twice with the same
-- arguments changes nothing the second time: every write is a max-merge on (assessed, seq), so a
-- retried call after a lost reply, or a redelivered batch, is recognised as duplicates.
--
-- KEYS[1] hash  opportunity id -> "<class><assessed_us in hex>[,<seq in hex>]"; occurred_us
--               is the record's score in KEYS[2]
-- KEYS[2] zset  opportunity id scored by occurred_us (expiry and first/last)
-- KEYS[3] hash  state: C P U (all-time counts), v (version), w (newest occurred_us),
--               m<minute><class> and h<hour><class> bucket counts, pm ph (pruned up to),
--               cm ch x1..x9: the window sums (1h, 24h, 7d × C P U) cached for minute cm, hour ch
-- ARGV[1] retention_us, ARGV[2] observation time at_us, ARGV[3] key ttl in ms (0: none),
-- then five per observation: id, class (C|P|U), occurred_us, assessed_us, seq.
-- Returns {outcomes, version, C, P, U, 1h C P U, 24h C P U, 7d C P U, first_us, last_us} where
-- outcomes has one letter per observation: N counted, R reassessed, D duplicate, S stale, E expired.
local MIN, HOUR = 60000000, 3600000000
local MKEEP, HKEEP = 70, 170 -- buckets kept behind the newest event: windows plus skew
local opps, occz, st = KEYS[1], KEYS[2], KEYS[3]
local ret = tonumber(ARGV[1])
local at = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local floor = math.floor
local head = redis.call('HMGET', st, 'w', 'pm', 'ph')
local w, pm, ph = tonumber(head[1]), tonumber(head[2]), tonumber(head[3])
local w0 = w
local mfloor, hfloor
if w then mfloor, hfloor = floor(w / MIN) - MKEEP, floor(w / HOUR) - HKEEP end
local changed = false
-- The smallest retained occurred time, read once: expiry needs a look at the index only when the
-- retention cut passes it.
local minocc
do
  local first = redis.call('ZRANGE', occz, 0, 0, 'WITHSCORES')
  minocc = tonumber(first[2])
end

-- Window sums at the observation time. They are cached per (minute, hour) of that time and kept
-- up to date by every bucket change, so a batch recomputes them from the buckets only when its
-- observation time enters a new minute (or buckets were pruned); otherwise it costs 11 fields.
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
  for _, f in ipairs(dirty) do
    if deltas[f] ~= 0 then redis.call('HINCRBY', st, f, deltas[f]) end
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
  if h >= hfloor then
    addDelta('h' .. h .. cls, d)
    if cached and inWindows('h', h, slot[cls], d) then cacheDirty = true end
  end
end

local function encode(cls, asd, seq)
  if seq == 0 then return cls .. string.format('%x', asd) end
  return cls .. string.format('%x,%x', asd, seq)
end

-- parse returns class, assessed and seq of a record (its occurred time is its index score).
local function parse(rec)
  local c, a, s = string.match(rec, '^(%a)(%x+),?(%x*)$')
  return c, tonumber(a, 16), (s ~= '' and tonumber(s, 16)) or 0
end

local function prune(prefix, from, to)
  if to - from <= 300 and redis.call('HLEN', st) > 684 then
    local f = {}
    for b = from, to - 1 do
      f[#f + 1] = prefix .. b .. 'C'; f[#f + 1] = prefix .. b .. 'P'; f[#f + 1] = prefix .. b .. 'U'
    end
    if #f > 0 then redis.call('HDEL', st, unpack(f)) end
    return
  end
  for _, k in ipairs(redis.call('HKEYS', st)) do
    if string.sub(k, 1, 1) == prefix then
      local b = tonumber(string.sub(k, 2, -2))
      if b and b < to then redis.call('HDEL', st, k) end
    end
  end
end

local held, flushWrites -- defined with the main loop below; advance's expiry sweep uses them

-- advance moves the watermark to occ: opportunities beyond retention leave every count, and buckets
-- no window can reach any more are dropped.
local function advance(occ)
  if w and occ <= w then return end
  w = occ
  local nm, nh = floor(w / MIN) - MKEEP, floor(w / HOUR) - HKEEP
  if minocc and minocc < w - ret then
    flushWrites()
    local old = redis.call('ZRANGEBYSCORE', occz, '-inf', '(' .. string.format('%.0f', w - ret))
    for _, id in ipairs(old) do
      local c = parse(redis.call('HGET', opps, id))
      bump(c, tonumber(redis.call('ZSCORE', occz, id)), -1)
      redis.call('HDEL', opps, id)
      redis.call('ZREM', occz, id)
      if held then held[id] = false end
      changed = true
    end
    local first = redis.call('ZRANGE', occz, 0, 0, 'WITHSCORES')
    minocc = tonumber(first[2])
  end
  -- Buckets below the floors are never read or written again; deleting them is only garbage
  -- collection, done in steps of an hour of minutes or a day of hours to keep it cheap.
  if not pm then pm, ph = nm, nh; redis.call('HSET', st, 'pm', pm, 'ph', ph) end
  if nm - pm >= 60 then flush(); prune('m', pm, nm); pm = nm; redis.call('HSET', st, 'pm', nm); cached = false end
  if nh - ph >= 24 then flush(); prune('h', ph, nh); ph = nh; redis.call('HSET', st, 'ph', nh); cached = false end
  mfloor, hfloor = nm, nh
end

local n = (#ARGV - 3) / 5

-- Held records of the batch's opportunities, fetched in one call; writes are collected and made
-- in one HSET and one ZADD at the end (or before an expiry sweep, which reads the index).
held = {}
if n > 0 then
  local ids = {}
  for i = 0, n - 1 do ids[i + 1] = ARGV[4 + i * 5] end
  local got = redis.call('HMGET', opps, unpack(ids))
  for i = 1, n do
    if held[ids[i]] == nil then held[ids[i]] = got[i] end
  end
end
local pendRec, pendOcc, pendIds = {}, {}, {}
flushWrites = function()
  if #pendIds == 0 then return end
  local h, z = {}, {}
  for _, id in ipairs(pendIds) do
    h[#h + 1] = id; h[#h + 1] = pendRec[id]
    if pendOcc[id] then z[#z + 1] = pendOcc[id]; z[#z + 1] = id end
  end
  redis.call('HSET', opps, unpack(h))
  if #z > 0 then redis.call('ZADD', occz, unpack(z)) end
  pendRec, pendOcc, pendIds = {}, {}, {}
end
local pendOccNum = {} -- occurred of records written in this batch, for their re-assessment
local function write(id, value, occs, occ)
  if pendRec[id] == nil then pendIds[#pendIds + 1] = id end
  pendRec[id] = value
  held[id] = value
  if occs then pendOcc[id] = occs; pendOccNum[id] = occ end
end

local out = {}
for i = 0, n - 1 do
  local b = 3 + i * 5
  local id, cls, occs, asds, seqs = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  local occ, asd, seq = tonumber(occs), tonumber(asds), tonumber(seqs)
  advance(occ)
  if occ < w - ret then
    out[#out + 1] = 'E'
  else
    local rec = held[id]
    local value = encode(cls, asd, seq)
    if not rec then
      write(id, value, occs, occ)
      if not minocc or occ < minocc then minocc = occ end
      bump(cls, occ, 1)
      changed = true
      out[#out + 1] = 'N'
    else
      local oc, oa, os = parse(rec)
      if asd > oa or (asd == oa and seq > os) then
        local oo = pendOccNum[id] or tonumber(redis.call('ZSCORE', occz, id))
        bump(oc, oo, -1)
        bump(cls, occ, 1)
        if occ ~= oo then
          write(id, value, occs, occ)
          if not minocc or occ < minocc then minocc = occ end
        else
          write(id, value, nil, nil)
        end
        changed = true
        out[#out + 1] = 'R'
      elseif asd == oa and seq == os then
        out[#out + 1] = 'D'
      else
        out[#out + 1] = 'S'
      end
    end
  end
end

flushWrites()
flush()
if w and w ~= w0 then redis.call('HSET', st, 'w', string.format('%.0f', w)) end
local v
if changed then v = redis.call('HINCRBY', st, 'v', 1) else v = tonumber(redis.call('HGET', st, 'v') or '0') end
if n > 0 and ttl > 0 then
  redis.call('PEXPIRE', opps, ttl); redis.call('PEXPIRE', occz, ttl); redis.call('PEXPIRE', st, ttl)
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
    local f = {}
    for b = from, to do
      f[#f + 1] = prefix .. b .. 'C'; f[#f + 1] = prefix .. b .. 'P'; f[#f + 1] = prefix .. b .. 'U'
    end
    local v = redis.call('HMGET', st, unpack(f))
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
local first = redis.call('ZRANGE', occz, 0, 0, 'WITHSCORES')
local last = redis.call('ZRANGE', occz, -1, -1, 'WITHSCORES')
res[#res + 1] = first[2] or ''
res[#res + 1] = last[2] or ''
return res
