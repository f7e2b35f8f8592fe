-- Merges graded runs into one suite and keeps, incrementally, the sums its snapshots are computed
-- from (docs/semantics.md: suite discrimination, stability), then reads back what the snapshots of
-- the touched versions need. Atomic; running the same call twice changes nothing. A call costs what
-- its runs change, never what the suite holds, except when it reorders versions that existed
-- before it (a greater version_seq for one of them) or moves the first judged version
-- (judge_last_versions > 0): then the discrimination counts are recomputed over every case.
--
-- Keys (one hash tag; B is KEYS[1] without its last letter). Every key the script touches is
-- declared, so that on Redis Cluster a slot being migrated never runs it on a half-moved suite
-- (Redis checks only declared keys: it answers ASK or TRYAGAIN until the slot has moved): KEYS[1]
-- B..'r', KEYS[2] B..'rv', KEYS[3..10] B..'vo', 'vi', 'vx', 'c', 'm', 'd', 'rl', 'pa', then
-- B..'h'..id, B..'i'..id, B..'x'..id for every version id from 1 to some V. Before any write the
-- script checks that V covers every version id the suite has and the call may create (one per
-- version label of its runs not yet known); when not, it returns {'v', the least V that does},
-- writing nothing, and the caller calls again with that many.
--
--   B..'r'   hash  "<vid>|<case>|<block>" -> the stored runs of that cell whose run_index div 16 is
--                  block, each "<run_index> <assessed> <seq> <flags>;" (flags as in ARGV), in the
--                  order they were first stored: what the re-assessment rule compares and what a
--                  replaced run takes back. A call reads and writes one field per cell and block it
--                  touches (cells usually hold fewer than 16 runs), never one per run, and a field
--                  holds at most 16 runs; the cell's bitmap says which are held, so new runs are
--                  appended without parsing the field
--   B..'rv'  set   revived cases already announced (expires with the rest, never before)
--   B..'vo'  zset  version label, scored by version_seq (ties by label): the order of versions
--   B..'vi'  hash  version label -> version id;  B..'vx' hash  version id -> label
--   B..'c'   hash  case -> ids of the versions it has runs in, space-separated
--   B..'m'   hash  "<vid>|<case>" -> "<pass> <fail> <error> <planned> <first occurred>|<bitmap>",
--                  the bitmap holding bit i (byte i/8, low bit first) for each run index stored
--   B..'d'   hash  case classes ap/af/di/tn, per version <vid>n <vid>p <vid>dn <vid>dp (judged
--                  cases with an outcome there, passed there; the same over discriminating
--                  cases), vn (last version id), sv (the suite's snapshot version)
--   B..'rl'  zset  revived cases, all scored 0 (so in byte order)
--   B..'pa'  zset  revived cases not announced yet, scored 0: every call reports them all, so a
--                  batch applied again reports what it reported the first time
--   B..'h'..vid  hash  R greatest planned runs; p<i>/n<i> passed/scored runs of index i;
--                  c<n>,<c> cases with n scored runs of which c passed; t<n>,<c> the same with n
--                  counting errored runs too (OpenCompass counts them as failures); l<t> replies of t tokens;
--                  a<t> abnormal replies of t tokens; M missing runs of matured cases; D deadline
--   B..'i'..vid  zset  cases with missing runs not yet matured, scored by first occurred
--   B..'x'..vid  zset  cases with missing runs matured (first occurred <= D), scored 0
--
-- ARGV: ttl_ms, min_history, judge_last_versions, deadline_us, mode ('a' apply, "a:<observed µs>"
-- likewise with the observation time, 'r' read every version), list limit, sample limit; T, then T triples (version, field of B..'h'..vid, count): the
-- per-run-index and per-reply-length sums (p<i>, n<i>, l<t>, a<t>) of every run of the call as if
-- each were new, so that a new run adds nothing here one by one (a run found already held takes
-- its share back); then the runs grouped by cell, 10 arguments per group: version, case, n, the
-- greatest planned runs, the least occurred time and the greatest version_seq of the group's runs,
-- the n runs' entries as B..'r' stores them, concatenated ("<run_index> <assessed> <seq>
-- <flags>;", flags = tokens*16 + result*4 + reply*2 + trigger: result 0 pass, 1 fail, 2 error,
-- reply and trigger 0 or 1), and, when the runs have distinct indexes in one block, "<passed>
-- <failed> <errored> <block>", the bitmap of their indexes and the record B..'m' holds of a cell
-- of just those runs (else '' three times): a cell that did not exist takes those as they are,
-- with its block's value the entries, and no run is looked at one by one. Returns {codes (one
-- per run, in argument order), discrimination, revived, versions, snapshot version, the greatest
-- version id} (see Redis.Apply in redis.go).

-- Globals the loops use, read once: a global is a table lookup by name on every use, a local a
-- register.
local ARGV, tonumber, ipairs, pairs, unpack = ARGV, tonumber, ipairs, pairs, unpack
local floor, max, min = math.floor, math.max, math.min
local sub, byte, char, fmt, match, gmatch, rep = string.sub, string.byte, string.char, string.format, string.match, string.gmatch, string.rep
local find = string.find
local call, concat, sort = redis.call, table.concat, table.sort
local R, AN = KEYS[1], KEYS[2]
local B = sub(R, 1, -2)
local VO, VI, VX, C, M, D, RL = B .. 'vo', B .. 'vi', B .. 'vx', B .. 'c', B .. 'm', B .. 'd', B .. 'rl'
local PA = B .. 'pa'
local ttl, minHistory, judgeLast = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local deadline, listN, sampleN = tonumber(ARGV[4]), tonumber(ARGV[6]), tonumber(ARGV[7])
-- mode 'a' (apply; "a:<µs>" carries the observation time, which the snapshot version takes) or 'r'
local mode, observed = sub(ARGV[5], 1, 1), tonumber(sub(ARGV[5], 3)) or 0
local GROUP = 10
local TOTALS = 9 -- the first totals triple
local FIRST = TOTALS + 3 * (tonumber(ARGV[8]) or 0)
local nargs = #ARGV
local anyRuns = nargs >= FIRST

-- Bulk reads and writes of hash fields, in chunks (Lua unpacks a few thousand values at most, the
-- embedded Redis of `repeatrate dev` fewer).
local CHUNK = 1000
local function hmget(key, fields)
  local out = {}
  for i = 1, #fields, CHUNK do
    local got = call('HMGET', key, unpack(fields, i, min(i + CHUNK - 1, #fields)))
    for j = 1, #got do out[#out + 1] = got[j] end
  end
  return out
end
-- hsetAll writes the fields of list fs with their values in t.
local function hsetAll(key, fs, t)
  for i = 1, #fs, CHUNK do
    local args = {}
    for j = i, min(i + CHUNK - 1, #fs) do args[#args + 1] = fs[j]; args[#args + 1] = t[fs[j]] end
    call('HSET', key, unpack(args))
  end
end

-- Declared versions: see Keys above. Nothing is written before this check.
do
  local declared = (#KEYS - 10) / 3
  local need = tonumber(call('HGET', D, 'vn') or '0')
  if anyRuns then
    local seen, labels = {}, {}
    for j = TOTALS, FIRST - 1, 3 do
      local l = ARGV[j]
      if not seen[l] then seen[l] = true; labels[#labels + 1] = l end
    end
    for b = FIRST, nargs, GROUP do
      local l = ARGV[b]
      if not seen[l] then seen[l] = true; labels[#labels + 1] = l end
    end
    local ids = hmget(VI, labels)
    for j = 1, #labels do
      if not ids[j] then need = need + 1 end
    end
  end
  if need > declared then return { 'v', need } end
end

-- Versions --------------------------------------------------------------------------------------
local vidOf, labelOf, rankOf, created = {}, {}, {}, {}
local count -- ZCARD of VO, nil when unknown
local function resetRanks() rankOf = {}; count = nil end
local function vid(label, create)
  local id = vidOf[label]
  if id then return id end
  id = call('HGET', VI, label)
  if not id then
    if not create then return nil end
    id = tostring(call('HINCRBY', D, 'vn', 1))
    call('HSET', VI, label, id)
    call('HSET', VX, id, label)
    created[id] = true
  end
  vidOf[label], labelOf[id] = id, label
  return id
end
local function label(id)
  local l = labelOf[id]
  if not l then
    l = call('HGET', VX, id)
    labelOf[id], vidOf[l] = l, id
  end
  return l
end
local function versions()
  if not count then count = call('ZCARD', VO) end
  return count
end
local function rank(id)
  local r = rankOf[id]
  if not r then
    r = call('ZRANK', VO, label(id))
    rankOf[id] = r
  end
  return r
end
-- judged reports whether the version of rank r is among the judged ones.
local function judged(r)
  return judgeLast == 0 or r >= versions() - judgeLast
end
-- boundary names the first judged version, '' when every version is judged.
local function boundary()
  local n = versions()
  if judgeLast == 0 or n <= judgeLast then return '' end
  return call('ZRANGE', VO, n - judgeLast, n - judgeLast)[1]
end

-- Cells: what a case holds in one version ----------------------------------------------------------
local cells, touchedCells = {}, {}
local cellRaw = {} -- values of M read ahead: a string, or false when absent
local NONE = { p = 0, f = 0, e = 0, planned = 0, exists = false }
local function cell(id, c, create, k)
  k = k or id .. '|' .. c
  local x = cells[k]
  if x then return x end
  local v = cellRaw[k]
  if v == nil then v = call('HGET', M, k) end
  if v then
    local bar = find(v, '|', 1, true)
    local p, f, e, pl, fo = match(sub(v, 1, bar - 1), '^(%d+) (%d+) (%d+) (%d+) (%-?%d+)$')
    x = { p = tonumber(p), f = tonumber(f), e = tonumber(e), planned = tonumber(pl), first = tonumber(fo),
          bm = sub(v, bar + 1), exists = true, id = id, c = c, k = k, o = false, listed = false, maxRuns = false, bytes = false,
          rec = false }
  elseif create then
    -- Every field the call sets later is named here: no rehash as they are set.
    x = { p = 0, f = 0, e = 0, planned = 0, first = nil, bm = '', exists = false, id = id, c = c, k = k, o = false,
          listed = false, maxRuns = false, bytes = false, rec = false }
  else
    return nil
  end
  -- What the cell held before this call; never written. Every new cell shares one.
  x.o = x.exists and { p = x.p, f = x.f, e = x.e, planned = x.planned, first = x.first, exists = true } or NONE
  cells[k] = x
  return x
end
-- Bit i of a bitmap string (plain arithmetic: the embedded Redis of `repeatrate dev` has no bit
-- library).
local function hasBit(bm, i)
  local b = floor(i / 8) + 1
  if b > #bm then return false end
  return floor(byte(bm, b) / 2 ^ (i % 8)) % 2 == 1
end
-- A cell's bitmap is set, bit by bit, as a table of byte values while the call runs (x.bytes, made
-- into x.bm again when the cell is written): one string per cell and call, not per run. BIT[i % 8
-- + 1] is bit i's value in its byte.
local BIT = { 1, 2, 4, 8, 16, 32, 64, 128 }
local function missing(x) return x.planned - (x.p + x.f + x.e) end

-- Deltas, summed here and written once per field -----------------------------------------------------
local hd, dd = {}, {} -- per version hash: field -> delta; discrimination hash: field -> delta
local function hadd(id, f, n)
  local t = hd[id]
  if not t then t = {}; hd[id] = t end
  t[f] = (t[f] or 0) + n
end
local function dadd(f, n) dd[f] = (dd[f] or 0) + n end
local function flush(key, t)
  for f, n in pairs(t) do
    if n ~= 0 and call('HINCRBY', key, f, n) == 0 then call('HDEL', key, f) end
  end
end

-- Cases ---------------------------------------------------------------------------------------------
local caseVids = {}
local caseRaw = {} -- values of C read ahead: a string, or false when absent
local function vidsOf(c)
  local l = caseVids[c]
  if not l then
    l = {}
    local v = caseRaw[c]
    if v == nil then v = call('HGET', C, c) end
    if v then for id in gmatch(v, '%d+') do l[#l + 1] = id end end
    caseVids[c] = l
  end
  return l
end
local function byRank(a, b) return a.rank < b.rank end
-- judge classifies case c from its outcomes in the versions it has runs in: as the cells stand
-- now, or as they stood before this call when old is true.
local function judge(c, old)
  local outs = {}
  for _, id in ipairs(vidsOf(c)) do
    local x = cell(id, c, false)
    if x then
      local p, f = x.p, x.f
      if old then p, f = x.o.p, x.o.f end
      if p + f > 0 then outs[#outs + 1] = { id = id, pass = f == 0, rank = rank(id) } end
    end
  end
  local res = { outs = outs }
  if #outs == 0 then return res end
  if #outs > 1 then sort(outs, byRank) end
  local streak = 1
  while streak < #outs and outs[streak + 1].pass == outs[1].pass do streak = streak + 1 end
  if streak >= minHistory and streak < #outs then
    res.revived = { id = outs[streak + 1].id, from = outs[1].pass, to = outs[streak + 1].pass, streak = streak }
  end
  local pass, fail = 0, 0
  for _, o in ipairs(outs) do
    if judged(o.rank) then
      if o.pass then pass = pass + 1 else fail = fail + 1 end
    end
  end
  if pass + fail < minHistory then res.class = 'tn'
  elseif fail == 0 then res.class = 'ap'
  elseif pass == 0 then res.class = 'af'
  else res.class = 'di' end
  return res
end
-- dfields returns the discrimination fields of version id (n, p, dn, dp), named once per call.
local dnames = {}
local function dfields(id)
  local t = dnames[id]
  if not t then
    t = { id .. 'n', id .. 'p', id .. 'dn', id .. 'dp' }
    dnames[id] = t
  end
  return t
end
local function contribute(res, sign)
  if not res.class then return end
  dadd(res.class, sign)
  if res.class == 'tn' then return end
  local di = res.class == 'di'
  for _, o in ipairs(res.outs) do
    local fs = dfields(o.id)
    dadd(fs[1], sign)
    if o.pass then dadd(fs[2], sign) end
    if di then
      dadd(fs[3], sign)
      if o.pass then dadd(fs[4], sign) end
    end
  end
end

-- Missing runs: cases of a version mature once their first run is at or before the deadline ------
local dv = {} -- version id -> deadline in force this call
local function mature(id)
  if dv[id] then return end
  local H = B .. 'h' .. id
  local held = tonumber(call('HGET', H, 'D'))
  if held and held >= deadline then dv[id] = held; return end
  local dl = fmt('%.0f', deadline)
  local due = call('ZRANGEBYSCORE', B .. 'i' .. id, '-inf', dl)
  for _, c in ipairs(due) do
    local x = cell(id, c, false)
    hadd(id, 'M', missing(x))
    call('ZADD', B .. 'x' .. id, 0, c)
  end
  if #due > 0 then call('ZREMRANGEBYSCORE', B .. 'i' .. id, '-inf', dl) end
  call('HSET', H, 'D', fmt('%.0f', deadline))
  dv[id] = deadline
end

-- Per version sums by run index and reply length, keyed by number (field names are made once, at
-- the end).
local accs = {}
local function accOf(id)
  local a = accs[id]
  if not a then
    a = { p = {}, n = {}, l = {}, a = {} }
    accs[id] = a
  end
  return a
end
local function bump(t, k, n) t[k] = (t[k] or 0) + n end
-- num returns integer n in decimal, formatted once per call (a number concatenated to a string is
-- formatted with %.14g on every use).
local nums = {}
local function num(n)
  local s = nums[n]
  if not s then s = fmt('%d', n); nums[n] = s end
  return s
end
-- histName returns the field of the (n, c) histogram entry of prefix p ('c' or 't'), made once per
-- call: cells mostly fall in a few entries.
local histNames = { c = {}, t = {} }
local function histName(p, n, c)
  local byN = histNames[p][n]
  if not byN then byN = {}; histNames[p][n] = byN end
  local f = byN[c]
  if not f then f = p .. num(n) .. ',' .. num(c); byN[c] = f end
  return f
end
-- runDelta adds (sign 1) or takes back (-1) one run of flags fl (tokens*16 + result*4 + reply*2 +
-- trigger) at index idx: to cell x's counts unless x is nil, and to the version's sums acc unless
-- acc is nil.
local function runDelta(x, acc, idx, fl, sign)
  local low = fl % 16
  local res = (low - low % 4) / 4
  if x then
    if res == 0 then x.p = x.p + sign elseif res == 1 then x.f = x.f + sign else x.e = x.e + sign end
  end
  if not acc then return end
  if res == 0 then bump(acc.p, idx, sign) end
  if res <= 1 then bump(acc.n, idx, sign) end
  if low % 4 >= 2 then
    local tok = (fl - low) / 16
    bump(acc.l, tok, sign)
    if low % 2 == 1 then bump(acc.a, tok, sign) end
  end
end
local ENTRY = '^%d+ (%-?%d+) (%d+) (%d+);$'
-- ENTRIES matches each entry of a group's runs: the entry, its run_index, assessed, seq and flags.
local ENTRIES = '((%d+) (%-?%d+) (%d+) (%d+);)'
-- BLOCK is how many run indexes one field of B..'r' holds.
local BLOCK = 16

-- Stored runs (B..'r'). A block is { field, add = entries appended this call } while its held
-- entries are not needed, and { field, held = run_index -> entry, order = indexes } once parsed;
-- one table per field and call, whichever group reaches it.
local blockRaw, blockOf, blockWrites = {}, {}, {} -- values read ahead (false: absent); blocks; changed blocks
local fastBlocks, nfast = {}, 0 -- field, value, … of the blocks of new cells the group path wrote
local function block(f)
  local bt = blockOf[f]
  if not bt then
    bt = { field = f, add = {} }
    blockOf[f] = bt
  end
  return bt
end
-- parse makes a block's held entries a table: its stored value, then what this call appended.
-- held is keyed by -index: the embedded server's Lua (gopher-lua) stores a positive integer key in
-- a table's array part, filling every index below it.
local function parse(bt)
  local held, order = {}, {}
  for e, i in gmatch((blockRaw[bt.field] or '') .. concat(bt.add), '((%d+) [^;]*;)') do
    i = tonumber(i)
    held[-i] = e
    order[#order + 1] = i
  end
  bt.held, bt.order, bt.add = held, order, nil
end

-- groups iterates over the cell groups of ARGV: the index of each group's first argument and its
-- number of runs.
local function groups()
  local b, n = nil, 0
  return function()
    b = b and b + GROUP or FIRST
    if b > nargs then return nil end
    n = tonumber(ARGV[b + 2])
    return b, n
  end
end

-- Apply ---------------------------------------------------------------------------------------------
local out, nout = {}, 0
local changedRuns = false -- a run of the call was new or replaced one held: the suite changed
local bound0 = boundary()
local reorder = false
local cases, caseOrder, vidsChanged = {}, {}, {} -- case -> its touched cells; cases in order; cases given a version
local touchedVersions, versionOrder = {}, {}
local seqOf = {} -- version id -> version_seq, as this call left it
for b in groups() do
  local v = vid(ARGV[b], false)
  if v then mature(v) end
end
-- Read ahead, one HMGET each, what the runs will read one by one: their cases' version lists, the
-- cells of those versions and of the runs' own (existing) versions, and then the held records of
-- the blocks those cells hold runs in. A block's bits in its cell's bitmap (bits 16·blk to 16·blk +
-- 15: bytes 2·blk + 1 and 2·blk + 2) say whether it holds any: the field of a new cell or block is
-- absent and is not read.
if anyRuns then
  local cs, cseen = {}, {}
  for b in groups() do
    local c = ARGV[b + 1]
    if not cseen[c] then cseen[c] = true; cs[#cs + 1] = c end
  end
  local got = hmget(C, cs)
  for j, c in ipairs(cs) do caseRaw[c] = got[j] end
  local ks, kseen = {}, {}
  local function want(id, c)
    local k = id .. '|' .. c
    if not kseen[k] then kseen[k] = true; ks[#ks + 1] = k end
  end
  for _, c in ipairs(cs) do
    for _, id in ipairs(vidsOf(c)) do want(id, c) end
  end
  for b in groups() do
    local id = vidOf[ARGV[b]]
    if id then want(id, ARGV[b + 1]) end
  end
  got = hmget(M, ks)
  for j, k in ipairs(ks) do cellRaw[k] = got[j] end
  local fs = {}
  for b in groups() do
    local id, c = vidOf[ARGV[b]], ARGV[b + 1]
    local v = id and cellRaw[id .. '|' .. c]
    if v then
      local bm, last = sub(v, find(v, '|', 1, true) + 1), nil
      for idx in gmatch(ARGV[b + 6], '(%d+) [^;]*;') do
        idx = tonumber(idx)
        local blk = (idx - idx % BLOCK) / BLOCK
        if blk ~= last then
          last = blk
          local b1, b2 = byte(bm, 2 * blk + 1, 2 * blk + 2)
          if (b1 or 0) > 0 or (b2 or 0) > 0 then
            local f = id .. '|' .. c .. '|' .. num(blk)
            if blockRaw[f] == nil then blockRaw[f] = false; fs[#fs + 1] = f end
          end
        end
      end
    end
  end
  got = hmget(R, fs)
  for j, f in ipairs(fs) do blockRaw[f] = got[j] end
end
for b, n in groups() do
  local version, c = ARGV[b], ARGV[b + 1]
  local runs, occ, vseq = tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  -- The version's order: the greatest version_seq of any result.
  local id = vid(version, true)
  local cur = seqOf[id]
  if cur == nil then
    cur = tonumber(call('ZSCORE', VO, version) or '-1')
  end
  if cur < 0 or vseq > cur then
    call('ZADD', VO, fmt('%.0f', vseq), version)
    resetRanks()
    if cur >= 0 and not created[id] then reorder = true end
    cur = vseq
  end
  seqOf[id] = cur
  if created[id] and not dv[id] then
    call('HSET', B .. 'h' .. id, 'D', fmt('%.0f', deadline))
    dv[id] = deadline
  end
  if not touchedVersions[id] then touchedVersions[id] = true; versionOrder[#versionOrder + 1] = id end
  local cs = cases[c]
  if not cs then
    cs = {}
    cases[c] = cs
    caseOrder[#caseOrder + 1] = c
  end
  local ck = id .. '|' .. c
  local fresh = cells[ck] == nil -- no group of this call reached the cell yet
  local x = cell(id, c, true, ck)
  if not x.exists and not x.listed then
    x.listed = true
    local l = vidsOf(c)
    l[#l + 1] = id
    vidsChanged[c] = true
  end
  if not touchedCells[x] then
    touchedCells[x] = true; touchedCells[#touchedCells + 1] = x
    cs[#cs + 1] = x
  end
  x.planned = max(x.planned, runs)
  if not x.first or occ < x.first then x.first = occ end
  if runs > (x.maxRuns or 0) then x.maxRuns = runs end
  local entries, counts = ARGV[b + 6], ARGV[b + 7]
  if fresh and not x.exists and counts ~= '' then
    -- A new cell and runs of distinct indexes in one block: every run is new, the cell's counts
    -- and bitmap are the group's, its block holds the entries, and the version's sums already
    -- count them (ARGV's totals).
    local p, f, e, blk = match(counts, '^(%d+) (%d+) (%d+) (%d+)$')
    x.p, x.f, x.e, x.bm, x.rec = tonumber(p), tonumber(f), tonumber(e), ARGV[b + 8], ARGV[b + 9]
    -- The block is written as the entries, before any block table (one of a later group of this
    -- cell, which finds the entries as if stored and writes after them).
    local bf = ck .. '|' .. blk
    blockRaw[bf] = entries
    nfast = nfast + 1
    fastBlocks[nfast] = bf
    nfast = nfast + 1
    fastBlocks[nfast] = entries
    nout = nout + 1
    out[nout] = rep('N', n)
    changedRuns = true
  else
    x.rec = false -- its record is made from its counts
    local acc = accOf(id)
    -- The group's last block (runs of a group are usually all in one).
    local lastBlk, bt
    for entry, idx, asd, seq, fl in gmatch(entries, ENTRIES) do
      idx, fl = tonumber(idx), tonumber(fl)
      local blk = (idx - idx % BLOCK) / BLOCK -- floor(idx / BLOCK) without a call, as below
      if blk ~= lastBlk then
        lastBlk, bt = blk, block(ck .. '|' .. num(blk))
      end
      -- The run, under the re-assessment rule; the cell's bitmap (x.bytes once set in this call)
      -- says whether it is held, so a new run's block is appended to, never parsed.
      local code = 'N'
      local bi, bit = (idx - idx % 8) / 8 + 1, BIT[idx % 8 + 1]
      local t = x.bytes
      local v
      if t then v = t[bi] elseif bi <= #x.bm then v = byte(x.bm, bi) end
      if v and v % (2 * bit) >= bit then
        if not bt.held then parse(bt) end
        local ha, hs, hfl = match(bt.held[-idx], ENTRY)
        ha, hs, asd, seq = tonumber(ha), tonumber(hs), tonumber(asd), tonumber(seq)
        if asd > ha or (asd == ha and seq > hs) then
          code = 'R'
          runDelta(x, acc, idx, tonumber(hfl), -1)
        elseif asd == ha and seq == hs then
          code = 'D'
        else
          code = 'S'
        end
      end
      nout = nout + 1
      out[nout] = code
      if code == 'N' or code == 'R' then
        changedRuns = true
        if code == 'N' then
          if not t then
            t = { byte(x.bm, 1, -1) }
            x.bytes = t
          end
          for k = #t + 1, bi do t[k] = 0 end
          t[bi] = t[bi] + bit -- not set: code N
          if bt.held then
            bt.order[#bt.order + 1] = idx
            bt.held[-idx] = entry
          else
            bt.add[#bt.add + 1] = entry
          end
        else
          bt.held[-idx] = entry
        end
        -- The cell counts the run; the version's sums already do (ARGV's totals).
        runDelta(x, nil, idx, fl, 1)
        if not bt.dirty then bt.dirty = true; blockWrites[#blockWrites + 1] = bt end
      else
        -- Not stored: the totals counted it as new.
        runDelta(nil, acc, idx, fl, -1)
      end
    end
  end
end
for i = 1, nfast, CHUNK do
  call('HSET', R, unpack(fastBlocks, i, min(i + CHUNK - 1, nfast)))
end
for i = 1, #blockWrites, CHUNK do
  local args = {}
  for j = i, min(i + CHUNK - 1, #blockWrites) do
    local bt, v = blockWrites[j]
    if bt.held then
      local es = {}
      for k, idx in ipairs(bt.order) do es[k] = bt.held[-idx] end
      v = concat(es)
    else
      v = (blockRaw[bt.field] or '') .. concat(bt.add)
    end
    args[#args + 1] = bt.field
    args[#args + 1] = v
  end
  call('HSET', R, unpack(args))
end

-- Cells: their (n, c) histogram entry, missing-run sets and records (written in one HSET), and
-- each version's greatest planned runs.
local cellOrder, cellWrites, maxRunsOf, versionsRun = {}, {}, {}, {}
for _, x in ipairs(touchedCells) do
  local id, c, o = x.id, x.c, x.o
  local on, oc, nn, nc = o.p + o.f, o.p, x.p + x.f, x.p
  if on ~= nn or oc ~= nc then
    if on > 0 then hadd(id, histName('c', on, oc), -1) end
    if nn > 0 then hadd(id, histName('c', nn, nc), 1) end
  end
  local oa, na = on + o.e, nn + x.e -- every stored run, errored ones too
  if oa ~= na or oc ~= nc then
    if oa > 0 then hadd(id, histName('t', oa, oc), -1) end
    if na > 0 then hadd(id, histName('t', na, nc), 1) end
  end
  local om = o.exists and (o.planned - (o.p + o.f + o.e)) or 0
  local nm = missing(x)
  local omat, nmat = om > 0 and o.first <= dv[id], nm > 0 and x.first <= dv[id]
  if om > 0 and nm > 0 and omat == nmat and (omat or o.first == x.first) then
    -- Still missing runs, in the same set under the same score: only the count moves.
    if omat then hadd(id, 'M', nm - om) end
  else
    if om > 0 then
      if omat then
        call('ZREM', B .. 'x' .. id, c); hadd(id, 'M', -om)
      else
        call('ZREM', B .. 'i' .. id, c)
      end
    end
    if nm > 0 then
      if nmat then
        call('ZADD', B .. 'x' .. id, 0, c); hadd(id, 'M', nm)
      else
        call('ZADD', B .. 'i' .. id, fmt('%.0f', x.first), c)
      end
    end
  end
  local k = x.k
  if x.bytes then x.bm = char(unpack(x.bytes)); x.bytes = nil end
  cellOrder[#cellOrder + 1] = k
  cellWrites[k] = x.rec or fmt('%d %d %d %d %.0f', x.p, x.f, x.e, x.planned, x.first) .. '|' .. x.bm
  if x.maxRuns and x.maxRuns > (maxRunsOf[id] or 0) then
    if not maxRunsOf[id] then versionsRun[#versionsRun + 1] = id end
    maxRunsOf[id] = x.maxRuns
  end
end
hsetAll(M, cellOrder, cellWrites)
for _, id in ipairs(versionsRun) do
  local H = B .. 'h' .. id
  local held = tonumber(call('HGET', H, 'R') or '0')
  if maxRunsOf[id] > held then call('HSET', H, 'R', maxRunsOf[id]) end
end
local caseOrderChanged, caseWrites = {}, {}
for _, c in ipairs(caseOrder) do
  if vidsChanged[c] then
    caseOrderChanged[#caseOrderChanged + 1] = c
    caseWrites[c] = concat(vidsOf(c), ' ')
  end
end
hsetAll(C, caseOrderChanged, caseWrites)

-- Discrimination: the touched cases' changes, or every case after a reordering.
local after = {}
if reorder or boundary() ~= bound0 then
  for _, f in ipairs(call('HKEYS', D)) do
    if f ~= 'vn' and f ~= 'sv' then call('HDEL', D, f) end
  end
  dd = {}
  call('DEL', RL, PA)
  for _, c in ipairs(call('HKEYS', C)) do
    local res = judge(c)
    after[c] = res
    contribute(res, 1)
    if res.revived then
      call('ZADD', RL, 0, c)
      if call('SISMEMBER', AN, c) == 0 then call('ZADD', PA, 0, c) end
    end
  end
else
  -- A case is judged from its cells' outcomes (none, pass, fail) and the order of versions; with
  -- the order unchanged, a case none of whose cells changed outcome keeps its class and revival.
  -- Ranks are read now, after this call's versions were added: a version created by the call has
  -- no outcome before it, and adding one never reorders the others.
  local function outcome(p, f) return p + f == 0 and 0 or (f == 0 and 1 or 2) end
  for _, c in ipairs(caseOrder) do
    local changed = false
    local cs = cases[c]
    for _, x in ipairs(cs) do
      if outcome(x.o.p, x.o.f) ~= outcome(x.p, x.f) then changed = true; break end
    end
    if changed and minHistory > 1 and #vidsOf(c) == 1 then
      -- A case with runs in one version (its cell is the one touched) has at most one outcome:
      -- too new while it has one (min_history is above 1), unclassified while it has none, never
      -- revived. judge would find the same, at the cost of two judgements; this is every case of
      -- a suite's first version, and every case a later version adds.
      local x = cs[1]
      local d = (x.p + x.f > 0 and 1 or 0) - (x.o.p + x.o.f > 0 and 1 or 0)
      if d ~= 0 then dadd('tn', d) end
    elseif changed then
      local before, res = judge(c, true), judge(c)
      after[c] = res
      contribute(before, -1)
      contribute(res, 1)
      if res.revived and not before.revived then
        call('ZADD', RL, 0, c)
        if call('SISMEMBER', AN, c) == 0 then call('ZADD', PA, 0, c) end
      elseif before.revived and not res.revived then
        call('ZREM', RL, c)
        call('ZREM', PA, c)
      end
    end
  end
end
-- The version sums: the call's totals, then what runs found held took back or replaced.
for j = TOTALS, FIRST - 1, 3 do hadd(vidOf[ARGV[j]], ARGV[j + 1], tonumber(ARGV[j + 2])) end
for id, a in pairs(accs) do
  for _, f in ipairs({ 'p', 'n', 'l', 'a' }) do
    for k, n in pairs(a[f]) do
      if n ~= 0 then hadd(id, f .. k, n) end
    end
  end
end
flush(D, dd)
for id, t in pairs(hd) do flush(B .. 'h' .. id, t) end
hd = {}

-- The snapshot version: a call that changed the suite sets the greater of the last one + 1 and its
-- observation time in µs, as a batch does an aggregate's (strictly increasing whatever the clocks
-- of the processors); a call that changed nothing, and a read, leave it.
local sv = tonumber(call('HGET', D, 'sv') or '0')
if mode == 'a' and changedRuns then
  sv = max(sv + 1, observed)
  call('HSET', D, 'sv', fmt('%d', sv))
end

-- Read back ---------------------------------------------------------------------------------------
local revived = {}
for _, c in ipairs(call('ZRANGE', PA, 0, -1)) do
  local r = (after[c] or judge(c)).revived
  if r then revived[#revived + 1] = { c, label(r.id), r.from and 1 or 0, r.to and 1 or 0, r.streak } end
end
local disc = call('HMGET', D, 'ap', 'af', 'di', 'tn')
disc[5] = call('ZCARD', VO)
local latest = call('ZRANGE', VO, -1, -1)[1]
disc[6] = latest or ''
if latest then
  local lid = vid(latest, false)
  local l = call('HMGET', D, lid .. 'n', lid .. 'p', lid .. 'dn', lid .. 'dp')
  for j = 1, 4 do disc[6 + j] = l[j] end
end
disc[11] = call('ZCARD', RL)
disc[12] = call('ZRANGE', RL, 0, listN - 1)
for j = 1, 10 do if not disc[j] then disc[j] = '0' end end

if mode == 'r' then
  versionOrder = {}
  for _, l in ipairs(call('ZRANGE', VO, 0, -1)) do
    local id = vid(l, false)
    mature(id)
    versionOrder[#versionOrder + 1] = id
  end
  for id, t in pairs(hd) do flush(B .. 'h' .. id, t) end
  -- A read refreshes no expiry (it applies no run), but maturing may have created a version's
  -- matured set: it expires with the suite's runs, never after them (a set left behind would list
  -- cases of a suite that is gone to the version that reuses its id).
  local left = call('PTTL', R)
  if left > 0 then
    for _, id in ipairs(versionOrder) do
      for _, p in ipairs({ 'h', 'i', 'x' }) do
        if call('PTTL', B .. p .. id) == -1 then call('PEXPIRE', B .. p .. id, left) end
      end
    end
  end
end
local vs = {}
for _, id in ipairs(versionOrder) do
  local list = {}
  for _, c in ipairs(call('ZRANGE', B .. 'x' .. id, 0, listN - 1)) do
    local x = cell(id, c, false)
    local sample, n = {}, missing(x)
    local i = 0
    while i < x.planned and #sample < sampleN do
      local bi = floor(i / 8) + 1
      if i % 8 == 0 and bi <= #x.bm and byte(x.bm, bi) == 255 then
        i = i + 8
      else
        if not hasBit(x.bm, i) then sample[#sample + 1] = i end
        i = i + 1
      end
    end
    list[#list + 1] = { c, n, sample }
  end
  vs[#vs + 1] = { label(id), call('HGETALL', B .. 'h' .. id), list }
end

if anyRuns and ttl > 0 then
  for _, k in ipairs({ R, AN, VO, VI, VX, C, M, D, RL, PA }) do call('PEXPIRE', k, ttl) end
  for _, id in ipairs(call('HVALS', VI)) do
    for _, p in ipairs({ 'h', 'i', 'x' }) do call('PEXPIRE', B .. p .. id, ttl) end
  end
end
-- The outcomes joined a thousand at a time: the embedded server's table.concat pushes every element
-- (and separator) onto a registry of 5 120 slots, which a call of 2 560 runs overflowed.
local outcomes = concat(out, '', 1, min(#out, 1000))
for i = 1001, #out, 1000 do outcomes = outcomes .. concat(out, '', i, min(i + 999, #out)) end
return { outcomes, disc, revived, vs, fmt('%d', sv), tonumber(call('HGET', D, 'vn') or '0') }
