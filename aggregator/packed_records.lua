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
-- The hash holds only buckets: field <b> (b's little-endian bytes, as few as it takes, at least
-- one) is bucket b's records; an empty bucket is not stored. The shape (L, p and n, the records
-- stored) is the caller's to keep, beside state it reads anyway: newPackedRecords(key, len, L, p,
-- n) opens the store, shape() returns it as the call leaves it. A call loads the buckets of the
-- fingerprints it needs at once (one HMGET; any other is read when first needed), or looks them
-- all up at once (getAll, after which a put of one found absent appends it without a search),
-- finds, puts and deletes in memory, and flushes once (one HSET and one HDEL, in chunks past 2 000
-- buckets; nothing when no bucket ends the call other than it began).
--
-- Fingerprints come from the caller, 16 bytes each, and must be unpredictable to whoever chooses
-- the ids (a keyed hash, HMAC-SHA-256 under a secret of the installation, truncated): the address
-- uses the low bits of the first 4 bytes, and ids aimed at one bucket (about 2^L tries each with
-- an unkeyed hash) would pile into it, every lookup there reading all of them. Payloads are the
-- caller's too, so a fingerprint may also appear inside another record's bytes: a match counts
-- only where a record starts. The caller keeps payloads to the lengths its tags say.

local PACK_LOAD = 8 -- records per bucket at which a bucket splits (and at half of which one merges)
local PACK_CHUNK = 4000 -- most arguments per command (Lua's unpack stops near 8000); even, for HSET

local pbyte, psub, pfind, pfloor, pchar = string.byte, string.sub, string.find, math.floor, string.char
local packedSteps = 0 -- records lookups walked past, for tests of the work a lookup takes

-- packedName is bucket b's field (no number formatting: a byte per 8 bits of b).
local function packedName(b)
  if b < 256 then return pchar(b) end
  if b < 65536 then return pchar(b % 256, pfloor(b / 256)) end
  if b < 16777216 then return pchar(b % 256, pfloor(b / 256) % 256, pfloor(b / 65536)) end
  return pchar(b % 256, pfloor(b / 256) % 256, pfloor(b / 65536) % 256, pfloor(b / 16777216))
end
-- packedLocate returns where fp's record starts in v and its end (inclusive), or nil. A plain
-- search finds fp; a match counts only where a record starts, which a walk of the records'
-- lengths tells. The walk only moves forward and the next search starts at the next record, so a
-- lookup reads a bucket once however many false matches its bytes hold.
local function packedLocate(v, fp, len)
  local from, rec = 1, 1
  while true do
    local at = pfind(v, fp, from, true)
    if not at then return nil end
    while rec < at do rec = rec + 16 + len[pbyte(v, rec + 16)]; packedSteps = packedSteps + 1 end
    if rec == at then return at, at + 15 + len[pbyte(v, at + 16)] end
    from = rec
  end
end

-- The functions here are made once per script call; a store's own closures are only those that
-- share its state (a closure costs in proportion to the variables it captures).
local function newPackedRecords(key, len, L, p, n)
  local byte, sub, floor, min = pbyte, psub, pfloor, math.min
  local name = packedName
  local call = redis.call
  local self = {}
  L, p, n = L or 0, p or 0, n or 0
  local size = 2 ^ L -- 2^L, kept beside L
  -- Only a shape the store returned is accepted: any other would address records where they are
  -- not, or read more buckets than the call needs.
  if L < 0 or L > 31 or L % 1 ~= 0 or p < 0 or p >= size or p % 1 ~= 0 or n < 0 or n % 1 ~= 0
      or n > PACK_LOAD * (size + p) or (size + p > 1 and 2 * n < PACK_LOAD * (size + p - 1)) then
    error('packed records: shape ' .. L .. ',' .. p .. ',' .. n .. ' is none the store leaves')
  end
  -- Tables are keyed by -1 - b, not b: the embedded server's Lua (gopher-lua) stores a positive
  -- integer key in a table's array part, filling every index below it (seconds and gigabytes at
  -- a bucket near 2^26), as apply.lua's tables keyed by -hour avoid too.
  local held = {}  -- -1 - bucket -> its records as read or changed ('' when empty); nil: not read
  local names = {} -- -1 - bucket -> its field name, once made
  local fieldsRead = 0 -- bucket fields read, for tests of what a call reads
  -- -1 - bucket -> its records as the hash holds them ('' when absent), once the call changes
  -- them in held (flush compares): mark(k) before every change.
  local dirty = {}
  local absent = {} -- fingerprint -> -1 - its bucket, when getAll found it absent and no put since
  local moved = {} -- -1 - bucket -> true when a split or merge changed which fingerprints it holds

  -- mark keeps bucket k's records as the hash holds them, before the call's first change to them
  -- (a bucket not read is one the hash does not hold: one a split makes).
  local function mark(k)
    if dirty[k] == nil then dirty[k] = held[k] or '' end
  end

  -- addr returns the bucket of a fingerprint (or prefix) s: its first 4 bytes as a little-endian
  -- number x, x mod 2^L, or x mod 2^(L+1) when that is below p.
  local function addr(s)
    local a, b, c, d = byte(s, 1, 4)
    local x = a + 256 * (b + 256 * (c + 256 * d))
    local bk = x % size
    if bk < p then bk = x % (2 * size) end
    return bk
  end

  -- read reads the buckets of bs not read yet, in one command per PACK_CHUNK of them (a bucket
  -- named twice is read once: held holds false for it while its read is under way).
  local function read(bs)
    local fs, nums = {}, {}
    for _, b in ipairs(bs) do
      local k = -1 - b
      if held[k] == nil then
        local f = name(b)
        held[k], names[k] = false, f; nums[#nums + 1] = k; fs[#fs + 1] = f
      end
    end
    for i = 1, #fs, PACK_CHUNK do
      local last = min(i + PACK_CHUNK - 1, #fs)
      local got = call('HMGET', key, unpack(fs, i, last))
      for j = i, last do local v = got[j - i + 1] or ''; held[nums[j]] = v end
      fieldsRead = fieldsRead + last - i + 1
    end
  end

  -- splitting adds to bs the buckets that would split if adds new records were put. Buckets
  -- split in order from p, wrapping to 0 at the next level; the first 2^L + p of them are those
  -- the hash holds now (any later one this call would make first, so it is not read).
  local function splitting(bs, adds)
    local q, sz, nb = p, size, size + p
    for _ = 1, min(nb, floor((n + adds) / PACK_LOAD) - nb + 1) do
      bs[#bs + 1] = q
      q = q + 1
      if q == sz then q, sz = 0, 2 * sz end
    end
  end

  -- load reads, in one command, the buckets of every fingerprint (or 4- to 16-byte prefix) given
  -- that is not read yet, and the buckets that would split if adds new records were put (all of
  -- fps when adds is nil): a split reads one more bucket, and a field more in this command costs
  -- less than a command of its own.
  self.load = function(fps, adds)
    local bs = {}
    for i, fp in ipairs(fps) do bs[i] = addr(fp) end
    splitting(bs, adds or #fps)
    read(bs)
  end

  -- getAll looks up fps[from..to] that out does not hold yet: out[fp] becomes the fingerprint's
  -- payload, or false. Every bucket they name, and those a split would read if each were new, is
  -- read in one command; one found absent is remembered with its bucket, so that a put of it
  -- appends without a search, and without computing its address again unless a split or merge
  -- has moved its bucket since.
  self.getAll = function(fps, from, to, out)
    local ks, bs = {}, {}
    for i = from, to do
      local fp = fps[i]
      if out[fp] == nil then
        local bk = addr(fp)
        ks[i] = -1 - bk; bs[#bs + 1] = bk
      end
    end
    splitting(bs, #bs)
    read(bs)
    for i = from, to do
      local k = ks[i]
      if k then
        local fp = fps[i]
        if out[fp] == nil then
          local v = held[k]
          local at, last = packedLocate(v, fp, len)
          if at then out[fp] = sub(v, at + 16, last) else out[fp] = false; absent[fp] = k end
        end
      end
    end
  end

  -- split moves the records of bucket p whose bit L is set to the new bucket p + 2^L. Bit L of a
  -- fingerprint's address is bit L % 8 of its byte L // 8 + 1; records that go the same way in a
  -- row are moved as one piece.
  local function split()
    if held[-1 - p] == nil then read({p}) end
    local v = held[-1 - p]
    local off, bit = floor(L / 8), 2 ^ (L % 8)
    local stay, go, ns, ng = {}, {}, 0, 0
    local at, from, dir, size1 = 1, 1, nil, #v
    while at <= size1 do
      local d = floor(byte(v, at + off) / bit) % 2
      if d ~= dir then
        if dir == 1 then ng = ng + 1; go[ng] = sub(v, from, at - 1)
        elseif dir == 0 then ns = ns + 1; stay[ns] = sub(v, from, at - 1) end
        from, dir = at, d
      end
      at = at + 16 + len[byte(v, at + 16)]
    end
    if dir == 1 then ng = ng + 1; go[ng] = sub(v, from)
    elseif dir == 0 then ns = ns + 1; stay[ns] = sub(v, from) end
    mark(-1 - p); mark(-1 - p - size)
    held[-1 - p], held[-1 - p - size] = table.concat(stay), table.concat(go)
    moved[-1 - p], moved[-1 - p - size] = true, true
    p = p + 1
    if p == size then
      if L == 31 then error('packed records: 2^32 buckets, the most a 4-byte address names') end
      L, p, size = L + 1, 0, 2 * size
    end
  end
  -- merge folds the last bucket back into the one it split from.
  local function merge()
    if p == 0 then L, size = L - 1, size / 2; p = size end
    p = p - 1
    read({p, p + size})
    mark(-1 - p); mark(-1 - p - size)
    held[-1 - p] = held[-1 - p] .. held[-1 - p - size]
    held[-1 - p - size] = ''
    moved[-1 - p], moved[-1 - p - size] = true, true
  end

  -- The last lookup, so that a put after a get of the same fingerprint does not search again:
  -- valid while its bucket still holds the same string.
  local lastFp, lastB, lastV, lastAt, lastEnd, lastP, lastL
  -- find1 returns fp's bucket (as held's key), its records and where fp's record lies in them.
  local function find1(fp)
    -- The last lookup stands while the shape, and so fp's address, is the same and its bucket
    -- holds the same records.
    if fp == lastFp and p == lastP and L == lastL and held[lastB] == lastV then
      return lastB, lastV, lastAt, lastEnd
    end
    local b = addr(fp)
    local k = -1 - b
    if held[k] == nil then read({b}) end
    local v = held[k]
    local at, last = packedLocate(v, fp, len)
    lastFp, lastB, lastV, lastAt, lastEnd, lastP, lastL = fp, k, v, at, last, p, L
    return k, v, at, last
  end

  -- get returns fp's payload, or nil.
  self.get = function(fp)
    local _, v, at, last = find1(fp)
    if at then return sub(v, at + 16, last) end
    return nil
  end

  -- put stores payload as fp's record, in place of the one it has, if any.
  self.put = function(fp, payload)
    if #fp ~= 16 or len[byte(payload, 1)] ~= #payload then
      error('packed records: a record is a 16-byte fingerprint and a payload of its tag\'s length')
    end
    local k = absent[fp]
    if k then
      -- Known absent: appended to its bucket, addressed again only when a split or merge moved it.
      absent[fp] = nil
      if moved[k] then
        k = -1 - addr(fp)
        if held[k] == nil then read({-1 - k}) end
      end
      mark(k)
      held[k] = held[k] .. fp .. payload
      n = n + 1
    else
      local v, at, last
      k, v, at, last = find1(fp)
      mark(k)
      if at then
        held[k] = sub(v, 1, at + 15) .. payload .. sub(v, last + 1)
      else
        held[k] = v .. fp .. payload
        n = n + 1
      end
    end
    if n > PACK_LOAD * (size + p) then split() end
  end

  -- delete removes fp's record, if any, and reports whether it did.
  self.delete = function(fp)
    local k, v, at, last = find1(fp)
    if not at then return false end
    mark(k)
    held[k] = sub(v, 1, at - 1) .. sub(v, last + 1)
    n = n - 1
    if size + p > 1 and 2 * n < PACK_LOAD * (size + p - 1) then merge() end
    return true
  end

  -- each calls f(fp, payload) for every record whose fingerprint begins with prefix (4 to 16
  -- bytes; the first 4 name the bucket): how an index of 4-byte prefixes finds records. f must
  -- not put or delete.
  self.each = function(prefix, f)
    local b = addr(prefix)
    if held[-1 - b] == nil then read({b}) end
    local v = held[-1 - b]
    local at, w = 1, #prefix - 1
    while at <= #v do
      local last = at + 15 + len[byte(v, at + 16)]
      if sub(v, at, at + w) == prefix then f(sub(v, at, at + 15), sub(v, at + 16, last)) end
      at = last + 1
    end
  end

  self.shape = function() return L, p, n end
  self.fieldsRead = function() return fieldsRead end
  self.steps = function() return packedSteps end

  -- flush writes the buckets whose records differ from what the hash holds (a put of what was
  -- there, or a record put and deleted again, writes nothing) and returns how many it wrote.
  self.flush = function()
    local sets, dels = {}, {}
    for k, was in pairs(dirty) do
      local v = held[k]
      if v ~= was then
        local f = names[k] or name(-1 - k)
        if v == '' then dels[#dels + 1] = f
        else sets[#sets + 1] = f; sets[#sets + 1] = v end
      end
    end
    for i = 1, #dels, PACK_CHUNK do call('HDEL', key, unpack(dels, i, min(i + PACK_CHUNK - 1, #dels))) end
    for i = 1, #sets, PACK_CHUNK do call('HSET', key, unpack(sets, i, min(i + PACK_CHUNK - 1, #sets))) end
    dirty = {}
    return #dels + #sets / 2
  end

  return self
end
