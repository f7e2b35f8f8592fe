-- The record store of state layout 11 (docs/performance.md, "Toward 48 bytes per opportunity"),
-- built ahead of the layout that will use it: records kept end to end in the fields of one hash,
-- a field per bucket, so that an opportunity costs its bytes and a share of a field instead of a
-- field of its own.
--
-- A record is a 16-byte fingerprint, then a tag byte, then the rest of its payload; the payload
-- (tag included) is len[tag] bytes, so records of several lengths share a bucket and still split
-- back into records. A fingerprint's bucket is its first 4 bytes read as a little-endian number x,
-- addressed by linear hashing: with level L and split pointer p the hash holds 2^L + p buckets, and
-- x lives in x mod 2^L, or x mod 2^(L+1) when that is below p. A bucket splits as soon as a record
-- added takes the load past PACK_LOAD records a bucket, and the last one merges back as soon as
-- one removed takes it under half that, within the call: a bucket holds about PACK_LOAD records
-- at every step (unless many fingerprints share their first 4 bytes), so the work of a call is
-- bounded by what it changes, never by what the hash holds.
--
-- The hash: field "m" holds "L,p,n" (n the records stored), field <b> (decimal) bucket b's
-- records; an empty bucket is not stored. Reads and writes go through newPackedRecords(key, len):
-- load the buckets of the fingerprints a call needs once (one HMGET), find and put and delete in
-- memory, and flush once (one HSET, one HDEL at most).
--
-- Fingerprints come from the caller, 16 bytes each, and must be unpredictable to whoever chooses
-- the ids (a keyed hash, HMAC-SHA-256 under a secret of the installation, truncated): the address
-- uses the low bits of the first 4 bytes, and ids aimed at one bucket (about 2^L tries each with
-- an unkeyed hash) would pile into it, every lookup there reading all of them. Payloads are the
-- caller's too, so a fingerprint may also appear inside another record's bytes: a match counts
-- only where a record starts. The caller keeps payloads to the lengths its tags say.

local PACK_LOAD = 8 -- records per bucket at which a bucket splits (and at half of which one merges)
local PACK_CHUNK = 4000 -- most arguments per command (Lua's unpack stops near 8000); even, for HSET

local function newPackedRecords(key, len)
  local byte, sub, find, floor = string.byte, string.sub, string.find, math.floor
  local call = redis.call
  local self = {}
  local L, p, n = 0, 0, 0
  local meta = call('HGET', key, 'm')
  if meta then
    local a, b, c = string.match(meta, '^(%d+),(%d+),(%d+)$')
    L, p, n = tonumber(a), tonumber(b), tonumber(c)
  end
  local size = 2 ^ L -- 2^L, kept beside L
  local held = {}  -- bucket -> its records as read or changed ('' when empty); nil: not read
  local dirty = {} -- bucket -> true when held differs from what the hash stores

  local function word(fp)
    local a, b, c, d = byte(fp, 1, 4)
    return a + 256 * (b + 256 * (c + 256 * d))
  end
  local function bucketOf(x)
    local b = x % size
    if b < p then b = x % (2 * size) end
    return b
  end
  self.bucketOf = function(fp) return bucketOf(word(fp)) end

  local steps = 0 -- records walked past, for tests of the work a lookup takes

  -- locate returns where fp's record starts in v and its end (inclusive), or nil. A plain search
  -- finds fp; a match counts only where a record starts, which a walk of the records' lengths
  -- tells. The walk only moves forward and the next search starts at the next record, so a
  -- lookup reads a bucket once however many false matches its bytes hold.
  local function locate(v, fp)
    local from, rec = 1, 1
    while true do
      local at = find(v, fp, from, true)
      if not at then return nil end
      while rec < at do rec = rec + 16 + len[byte(v, rec + 16)]; steps = steps + 1 end
      if rec == at then return at, at + 15 + len[byte(v, at + 16)] end
      from = rec
    end
  end

  local function read(bs)
    local names, seen = {}, {}
    for _, b in ipairs(bs) do
      if held[b] == nil and not seen[b] then seen[b] = true; names[#names + 1] = tostring(b) end
    end
    for i = 1, #names, PACK_CHUNK do
      local last = math.min(i + PACK_CHUNK - 1, #names)
      local got = call('HMGET', key, unpack(names, i, last))
      for j = i, last do held[tonumber(names[j])] = got[j - i + 1] or '' end
    end
  end

  -- load reads, in one command, the buckets of every fingerprint given that is not read yet (a
  -- bucket not loaded is read when first needed).
  self.load = function(fps)
    local bs = {}
    for i, fp in ipairs(fps) do bs[i] = bucketOf(word(fp)) end
    read(bs)
  end

  -- split moves the records of bucket p whose bit L is set to the new bucket p + 2^L.
  local function split()
    read({p})
    local v, stay, go = held[p], {}, {}
    local at = 1
    while at <= #v do
      local last = at + 15 + len[byte(v, at + 16)]
      if floor(word(sub(v, at, at + 3)) / size) % 2 == 1 then go[#go + 1] = sub(v, at, last)
      else stay[#stay + 1] = sub(v, at, last) end
      at = last + 1
    end
    held[p], held[p + size] = table.concat(stay), table.concat(go)
    dirty[p], dirty[p + size] = true, true
    p = p + 1
    if p == size then L, p, size = L + 1, 0, 2 * size end
  end
  -- merge folds the last bucket back into the one it split from.
  local function merge()
    if p == 0 then L, size = L - 1, size / 2; p = size end
    p = p - 1
    read({p, p + size})
    held[p] = held[p] .. held[p + size]
    held[p + size] = ''
    dirty[p], dirty[p + size] = true, true
  end

  -- bucket returns the number and records of the bucket of x, read now if load did not.
  local function bucket(x)
    local b = bucketOf(x)
    if held[b] == nil then read({b}) end
    return b, held[b]
  end

  -- get returns fp's payload, or nil.
  self.get = function(fp)
    local _, v = bucket(word(fp))
    local at, last = locate(v, fp)
    if at then return sub(v, at + 16, last) end
    return nil
  end

  -- put stores payload as fp's record, in place of the one it has, if any.
  self.put = function(fp, payload)
    local b, v = bucket(word(fp))
    local at, last = locate(v, fp)
    if at then
      held[b] = sub(v, 1, at + 15) .. payload .. sub(v, last + 1)
    else
      held[b] = v .. fp .. payload
      n = n + 1
    end
    dirty[b] = true
    if n > PACK_LOAD * (size + p) then split() end
  end

  -- delete removes fp's record, if any, and reports whether it did.
  self.delete = function(fp)
    local b, v = bucket(word(fp))
    local at, last = locate(v, fp)
    if not at then return false end
    held[b] = sub(v, 1, at - 1) .. sub(v, last + 1)
    n, dirty[b] = n - 1, true
    if size + p > 1 and 2 * n < PACK_LOAD * (size + p - 1) then merge() end
    return true
  end

  -- each calls f(fp, payload) for every record whose fingerprint begins with the 4 bytes of
  -- prefix (they share a bucket): how an index of 4-byte prefixes finds records. f must not put
  -- or delete.
  self.each = function(prefix, f)
    local _, v = bucket(word(prefix))
    local at = 1
    while at <= #v do
      local last = at + 15 + len[byte(v, at + 16)]
      if sub(v, at, at + 3) == prefix then f(sub(v, at, at + 15), sub(v, at + 16, last)) end
      at = last + 1
    end
  end

  self.count = function() return n end
  self.steps = function() return steps end

  -- flush writes what the call changed: the buckets, the meta field; nothing when it changed
  -- nothing.
  self.flush = function()
    if next(dirty) == nil then return end
    local sets, dels = {'m', L .. ',' .. p .. ',' .. n}, {}
    for b in pairs(dirty) do
      local v = held[b]
      if v == '' then dels[#dels + 1] = tostring(b)
      else sets[#sets + 1] = tostring(b); sets[#sets + 1] = v end
    end
    for i = 1, #dels, PACK_CHUNK do call('HDEL', key, unpack(dels, i, math.min(i + PACK_CHUNK - 1, #dels))) end
    if n == 0 and L == 0 then
      call('HDEL', key, 'm')
    else
      for i = 1, #sets, PACK_CHUNK do call('HSET', key, unpack(sets, i, math.min(i + PACK_CHUNK - 1, #sets))) end
    end
    dirty = {}
  end

  return self
end
