-- Replays the apply-script calls TestRecordApplyCalls wrote, under a stand-alone Lua 5.1 with an
-- in-memory stand-in for the Redis commands the script uses, checks every reply against the one
-- real Redis gave, and reports where the script's time goes by line and by function (a count hook
-- reads os.clock every few hundred VM instructions and charges the time since the last one to the
-- script line running, or calling the stand-in, at that moment). See docs/performance.md.
--
--   lua5.1 replay.lua <apply.lua> <calls file> [skip calls] [hook every N instructions]
local script_path, calls_path = arg[1], arg[2]
local skip, every = tonumber(arg[3] or '0'), tonumber(arg[4] or '200')

local src = assert(io.open(script_path)):read('*a')
local chunk = assert(loadstring(src, '=apply'))
local lines = {}
for l in (src .. '\n'):gmatch('([^\n]*)\n') do lines[#lines + 1] = l end

-- The stand-in: hashes and sorted sets, the commands and replies apply.lua relies on.
local db = {}
local function hash(k) local h = db[k]; if not h then h = {}; db[k] = h end; return h end
local cmd = {}
function cmd.HMGET(k, ...) local h, out = db[k] or {}, {}; for i, f in ipairs({...}) do out[i] = h[f] or false end; return out end
function cmd.HGET(k, f) local h = db[k]; return h and h[f] or false end
function cmd.HKEYS(k) local out = {}; for f in pairs(db[k] or {}) do out[#out + 1] = f end; return out end
function cmd.HSET(k, ...)
  local h, a, n = hash(k), {...}, 0
  for i = 1, #a, 2 do if h[a[i]] == nil then n = n + 1 end; h[a[i]] = a[i + 1] end
  return n
end
function cmd.HDEL(k, ...)
  local h, n = db[k], 0
  if not h then return 0 end
  for _, f in ipairs({...}) do if h[f] ~= nil then h[f] = nil; n = n + 1 end end
  if next(h) == nil then db[k] = nil end
  return n
end
function cmd.PEXPIRE() return 1 end
function cmd.TIME() local t = os.time(); return {tostring(t), '0'} end
function cmd.ZADD(k, ...)
  local z, a, n = hash(k), {...}, 0
  for i = 1, #a, 2 do if z[a[i + 1]] == nil then n = n + 1 end; z[a[i + 1]] = tonumber(a[i]) end
  return n
end
function cmd.ZREM(k, ...) return cmd.HDEL(k, ...) end
local function sorted(k)
  local l = {}
  for m, s in pairs(db[k] or {}) do l[#l + 1] = {m, s} end
  table.sort(l, function(x, y) if x[2] ~= y[2] then return x[2] < y[2] end return x[1] < y[1] end)
  return l
end
function cmd.ZRANGEBYSCORE(k, lo, hi, _, off, cnt)
  assert(lo == '-inf' and hi:sub(1, 1) == '(', 'ZRANGEBYSCORE form not supported')
  local lim, out = tonumber(hi:sub(2)), {}
  for i, e in ipairs(sorted(k)) do
    if e[2] >= lim or #out >= cnt then break end
    if i > off then out[#out + 1] = e[1] end
  end
  return out
end
function cmd.ZRANGE(k, a, b, ws)
  assert(a == 0 and b == 0 and ws == 'WITHSCORES', 'ZRANGE form not supported')
  local l = sorted(k)
  if #l == 0 then return {} end
  return {l[1][1], string.format('%.17g', l[1][2])}
end

local clock = os.clock
local stubTime, stubCalls = 0, 0
redis = {call = function(name, ...)
  local t0 = clock()
  local f = assert(cmd[name], name)
  local r = f(...)
  stubTime, stubCalls = stubTime + clock() - t0, stubCalls + 1
  return r
end}
redis.pcall = redis.call
package.cpath = '/tmp/?.so;' .. package.cpath
struct = require('struct')

-- The calls file: per call, three length-prefixed lists (keys, arguments, the reply as one string).
local f = assert(io.open(calls_path, 'rb'))
local function u32()
  local s = f:read(4)
  if not s then return nil end
  local a, b, c, d = s:byte(1, 4)
  return a + b * 256 + c * 65536 + d * 16777216
end
local function list()
  local n = u32()
  if not n then return nil end
  local out = {}
  for i = 1, n do out[i] = f:read(u32()) end
  return out
end
local function replyText(r)
  local parts = {}
  for i, v in ipairs(r) do
    if type(v) == 'number' then parts[i] = string.format('%d', v)
    elseif v == false then parts[i] = '<nil>'
    else parts[i] = tostring(v) end
  end
  return table.concat(parts, '|')
end

local byLine, byFn, fnName = {}, {}, {}
local last = clock()
local function hook()
  local now = clock()
  local d = now - last
  for level = 2, 12 do
    local info = debug.getinfo(level, 'Sl')
    if not info then break end
    if info.source == '=apply' then
      local l = info.currentline
      byLine[l] = (byLine[l] or 0) + d
      byFn[info.linedefined] = (byFn[info.linedefined] or 0) + d
      break
    end
  end
  last = clock()
end

local n, profiled, total = 0, 0, 0
while true do
  local keys = list()
  if not keys then break end
  local args, want = list(), list()[1]
  KEYS, ARGV = keys, args
  n = n + 1
  local r
  if n > skip then
    last = clock()
    local t0 = clock()
    if every > 0 then debug.sethook(hook, '', every) end
    r = chunk()
    if every > 0 then debug.sethook() end
    total = total + clock() - t0
    profiled = profiled + 1
  else
    r = chunk()
  end
  local got = replyText(r)
  if got ~= want then error(string.format('call %d: reply %s, Redis gave %s', n, got, want)) end
end

local function top(t, k, label)
  local l = {}
  for key, v in pairs(t) do l[#l + 1] = {key, v} end
  table.sort(l, function(a, b) return a[2] > b[2] end)
  local sum = 0
  for _, e in ipairs(l) do sum = sum + e[2] end
  print(string.format('%s (of %.1f µs a call charged):', label, sum * 1e6 / profiled))
  for i = 1, math.min(k, #l) do
    local line = l[i][1]
    print(string.format('  %6.2f µs %5.1f %%  %4d  %s', l[i][2] * 1e6 / profiled, 100 * l[i][2] / sum, line,
      (lines[line] or ''):gsub('^%s+', ''):sub(1, 90)))
  end
end
print(string.format('%d calls replayed, every reply equal to Redis\'s; %d profiled: %.1f µs a call with the hook, stand-in %.1f µs in %.2f commands a call',
  n, profiled, total * 1e6 / profiled, stubTime * 1e6 / n, stubCalls / n))
if every == 0 then return end
top(byFn, 25, 'by function (line where it is defined; 0 is the main chunk)')
top(byLine, 60, 'by line')
