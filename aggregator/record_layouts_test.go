package aggregator

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// recordLayoutAppendIndex is Lua that appends entries to the index of state key st as apply.lua
// keeps one: an open chunk, closed into a field of its own before it passes 480 bytes.
const recordLayoutAppendIndex = `
local function appendIndex(st, entries)
  local open = redis.call('HGET', st, 'open') or ''
  local closed = tonumber(redis.call('HGET', st, 'closed') or '0')
  for _, e in ipairs(entries) do
    if #open + #e > 480 then closed = closed + 1; redis.call('HSET', st, 'c' .. closed, open); open = '' end
    open = open .. e
  end
  redis.call('HSET', st, 'open', open, 'closed', closed)
end
`

// recordLayoutFill stores one aggregate's records and index entries in a candidate layout.
// KEYS: the keys the records go to, one per record (all the same key but in a bucketed layout),
// then the state key that holds the index. ARGV[1] the index entry width in bytes (0: the whole
// field, -1 none), then field, value pairs.
var recordLayoutFill = redis.NewScript(recordLayoutAppendIndex + `
local w, n = tonumber(ARGV[1]), (#ARGV - 1) / 2
local entries = {}
for i = 1, n do
  local f = ARGV[2 * i]
  redis.call('HSET', KEYS[i], f, ARGV[2 * i + 1])
  entries[i] = w == 0 and f or string.sub(f, 1, w)
end
if w >= 0 then appendIndex(KEYS[#KEYS], entries) end
return n
`)

// recordLayoutHot looks up and inserts records as apply.lua's hot path would in each layout:
// one HMGET and one HSET per call when every record shares a key, one HGET and HSET per record
// when each goes to its bucket. It returns the µs of server time the lookups and inserts took.
// KEYS one per record as in recordLayoutFill; ARGV field, value pairs.
var recordLayoutHot = redis.NewScript(`
local n = #ARGV / 2
local t0 = redis.call('TIME')
if KEYS[1] == KEYS[n] and n > 1 then
  local fs, sets = {}, {}
  for i = 1, n do fs[i] = ARGV[2 * i - 1] end
  local got = redis.call('HMGET', KEYS[1], unpack(fs))
  for i = 1, n do if not got[i] then sets[#sets + 1] = fs[i]; sets[#sets + 1] = ARGV[2 * i] end end
  if #sets > 0 then redis.call('HSET', KEYS[1], unpack(sets)) end
else
  for i = 1, n do
    if not redis.call('HGET', KEYS[i], ARGV[2 * i - 1]) then redis.call('HSET', KEYS[i], ARGV[2 * i - 1], ARGV[2 * i]) end
  end
end
local t1 = redis.call('TIME')
return (t1[1] - t0[1]) * 1000000 + (t1[2] - t0[2])
`)

// recordLayoutPacked looks up and inserts records kept packed: fixed-width records (a 16-byte
// fingerprint, then a 15-byte value) concatenated in the value of a bucket field of one hash per
// aggregate. It reads each bucket the call touches once, finds a fingerprint by a plain search
// that must land on a record's start, appends the absent records and writes the buckets it
// changed. It returns the µs of server time taken. KEYS[1] the hash; ARGV bucket field,
// fingerprint, value triples.
var recordLayoutPacked = redis.NewScript(`
local n, key = #ARGV / 3, KEYS[1]
local t0 = redis.call('TIME')
local names, slot = {}, {}
for i = 1, n do
  local b = ARGV[3 * i - 2]
  if not slot[b] then names[#names + 1] = b; slot[b] = #names end
end
local got = redis.call('HMGET', key, unpack(names))
local changed = {}
for i = 1, n do
  local b, fp = ARGV[3 * i - 2], ARGV[3 * i - 1]
  local s = slot[b]
  local v = got[s] or ''
  local at, found = 1, false
  while true do
    local p = string.find(v, fp, at, true)
    if not p then break end
    if (p - 1) % 31 == 0 then found = true; break end
    at = p + 1
  end
  if not found then got[s] = v .. fp .. ARGV[3 * i]; changed[s] = true end
end
local sets = {}
for s, _ in pairs(changed) do sets[#sets + 1] = names[s]; sets[#sets + 1] = got[s] end
if #sets > 0 then redis.call('HSET', key, unpack(sets)) end
local t1 = redis.call('TIME')
return (t1[1] - t0[1]) * 1000000 + (t1[2] - t0[2])
`)

// recordLayoutStore looks up and inserts records through the packed record store that layout 11
// will use (packed_records.lua: linear hashing, 4 to 8 records a bucket), as recordLayoutPacked
// does by hand. The store's shape comes in ARGV[1..3] and goes back in the reply, as layout 11
// keeps it in the head its calls read and write anyway. It returns the µs of server time taken
// and the shape. KEYS[1] the hash; then fingerprint, value pairs (values of 15 bytes, tag 'c').
var recordLayoutStore = redis.NewScript(packedRecordsSource + `
local t0 = redis.call('TIME')
local s = newPackedRecords(KEYS[1], {[99] = 15}, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
local fps = {}
for i = 4, #ARGV, 2 do fps[#fps + 1] = ARGV[i] end
s.load(fps)
for i = 4, #ARGV, 2 do
  if not s.get(ARGV[i]) then s.put(ARGV[i], ARGV[i + 1]) end
end
s.flush()
local t1 = redis.call('TIME')
local L, p, n = s.shape()
return {(t1[1] - t0[1]) * 1000000 + (t1[2] - t0[2]), L, p, n}
`)

// recordLayoutIndex appends index entries to the open chunk of KEYS[1], as recordLayoutFill does,
// for layouts whose records are written by another script. ARGV the entries.
var recordLayoutIndex = redis.NewScript(recordLayoutAppendIndex + `
appendIndex(KEYS[1], ARGV)
return #ARGV
`)

// layoutTag is the key of aggregate a under prefix, as the layout measurements name it (its hash
// tag an aggregate's); each layout's keys add a suffix.
func layoutTag(prefix string, a int) string {
	return fmt.Sprintf("%s:{live/acme/support-bot/2026-11/ckpt-42/prod/fix-%d}", prefix, a)
}

// TestRecordLayoutCandidates measures what an opportunity's record and its index entry cost in
// Redis in the layouts a smaller state could take (docs/performance.md, "Toward 48 bytes"): the
// id as the field (layout 10), a 16-byte fingerprint as the field of one hash per aggregate, and
// fingerprints in buckets of a bounded number of records (small hashes Redis keeps as listpacks),
// indexed by an 8-byte prefix. It reports bytes per opportunity (records and index only; the
// hours, minutes and head are the same in each) and the server µs per event of looking up and
// inserting new records in calls of 10 per aggregate.
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestRecordLayoutCandidates -v ./aggregator
//
// REPEATRATE_LAYOUT_CANDIDATES=packed measures only the candidates whose name holds "packed".
func TestRecordLayoutCandidates(t *testing.T) {
	rdb := redisOfItsOwn(t)
	ctx := context.Background()
	used := func() float64 { return usedMemory(ctx, rdb) }
	entries := 0
	if v, err := rdb.ConfigGet(ctx, "hash-max-listpack-entries").Result(); err == nil {
		entries, _ = strconv.Atoi(v["hash-max-listpack-entries"])
	}
	const aggregates, perAggregate, hot = 100, 5000, 200
	type candidate struct {
		name    string
		fp      bool // a 16-byte fingerprint as the field, a 15-byte binary value
		bucket  int  // records per bucket at most (0: one hash per aggregate)
		indexed int  // bytes of an index entry (0: the whole field, -1: no index)
		packed  bool // buckets are fields of one hash, their records concatenated in its value
		store   bool // through packed_records.lua (the buckets are its own)
	}
	cands := []candidate{{"layout 10: id field, hex value, one hash", false, 0, 0, false, false},
		{"fingerprint, one hash", true, 0, 0, false, false}}
	for _, b := range []int{16, 32, 64, 100} {
		cands = append(cands, candidate{fmt.Sprintf("fingerprint buckets of ~%d, 8-byte index", b), true, b, 8, false, false})
	}
	cands = append(cands, candidate{"fingerprint buckets of ~32, 4-byte index", true, 32, 4, false, false},
		candidate{"fingerprint buckets of ~32, no record index", true, 32, -1, false, false})
	for _, b := range []int{8, 16, 32, 64, 128} {
		cands = append(cands, candidate{fmt.Sprintf("packed buckets of ~%d in one hash, no record index", b), true, b, -1, true, false})
	}
	for _, b := range []int{8, 16} {
		cands = append(cands, candidate{fmt.Sprintf("packed buckets of ~%d in one hash, 4-byte index", b), true, b, 4, true, false})
	}
	cands = append(cands, candidate{"packed record store (packed_records.lua), 4-byte index", true, 8, 4, true, true})
	t.Logf("Redis hash-max-listpack-entries %d", entries)
	only := os.Getenv("REPEATRATE_LAYOUT_CANDIDATES") // measure only the candidates whose name holds it
	for _, c := range cands {
		if !strings.Contains(c.name, only) {
			continue
		}
		prefix := fmt.Sprintf("layouts-%d", time.Now().UnixNano())
		before := used()
		record := func(a, i int) (key, field, value string) {
			id := fmt.Sprintf("conv-%07d/turn-%d", i/3, i%3)
			occ := int64(1_764_000_000_000_000) + int64(i)*1000
			tag := layoutTag(prefix, a)
			if !c.fp {
				return tag + ":o", fmt.Sprintf("%03x%s", len(id), id), fmt.Sprintf("c%x,%x", occ, occ+1e6)
			}
			sum := sha256.Sum256([]byte(id))
			// The class, then occurred and assessed in 7 bytes each.
			v := make([]byte, 16)
			v[0] = 'c'
			binary.LittleEndian.PutUint64(v[1:], uint64(occ))
			binary.LittleEndian.PutUint64(v[8:], uint64(occ+1e6)<<8)
			v = v[:15]
			key = tag + ":o"
			if c.packed {
				nb := (perAggregate + c.bucket - 1) / c.bucket
				return key, fmt.Sprint(binary.LittleEndian.Uint32(sum[:4]) % uint32(nb)), string(sum[:16]) + string(v)
			}
			if c.bucket > 0 {
				nb := (perAggregate + c.bucket - 1) / c.bucket
				key = fmt.Sprintf("%s:b%d", tag, binary.LittleEndian.Uint32(sum[:4])%uint32(nb))
			}
			return key, string(sum[:16]), string(v)
		}
		shapes := map[int][3]int64{} // the packed record store's shape per aggregate
		call := func(s *redis.Script, a, from, to int, extra ...any) int64 {
			if c.packed {
				var key string
				var args, entries []any
				if c.store {
					sh := shapes[a]
					args = []any{sh[0], sh[1], sh[2]} // the store names its own buckets
				}
				for i := from; i < to; i++ {
					k, b, r := record(a, i)
					key = k
					if !c.store {
						args = append(args, b)
					}
					args = append(args, r[:16], r[16:])
					if c.indexed > 0 {
						entries = append(entries, r[:c.indexed])
					}
				}
				var got int64
				if c.store {
					reply, err := recordLayoutStore.Run(ctx, rdb, []string{key}, args...).Int64Slice()
					if err != nil {
						t.Fatal(err)
					}
					got, shapes[a] = reply[0], [3]int64(reply[1:])
				} else {
					var err error
					if got, err = recordLayoutPacked.Run(ctx, rdb, []string{key}, args...).Int64(); err != nil {
						t.Fatal(err)
					}
				}
				if s == recordLayoutFill && c.indexed > 0 {
					st := layoutTag(prefix, a) + ":s"
					if err := recordLayoutIndex.Run(ctx, rdb, []string{st}, entries...).Err(); err != nil {
						t.Fatal(err)
					}
				}
				return got
			}
			var keys []string
			args := extra
			for i := from; i < to; i++ {
				k, f, v := record(a, i)
				keys = append(keys, k)
				args = append(args, f, v)
			}
			if s == recordLayoutFill {
				keys = append(keys, layoutTag(prefix, a)+":s")
			}
			got, err := s.Run(ctx, rdb, keys, args...).Int64()
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		for a := 0; a < aggregates; a++ {
			for i := 0; i < perAggregate; i += 500 {
				call(recordLayoutFill, a, i, i+500, c.indexed)
			}
		}
		after := used()
		var us int64
		for r := 0; r < hot; r++ {
			for a := 0; a < aggregates; a++ {
				from := perAggregate + r*10
				us += call(recordLayoutHot, a, from, from+10)
			}
		}
		t.Logf("%-48s %6.1f bytes per opportunity, %5.2f µs per new record looked up and inserted",
			c.name, (after-before)/(aggregates*perAggregate), float64(us)/float64(hot*aggregates*10))
		deleteUnder(ctx, rdb, prefix)
	}
}

// TestRecordLayoutCostByAggregateSize measures, for the record layouts a state could take, what a
// new record costs Redis in a young aggregate and in a grown one (docs/performance.md, "The
// thirteenth slice"): the prefilled store's target compares a stream on grown aggregates with the
// same stream on an empty store, whose aggregates are young. Each candidate fills 100 aggregates
// with 200 to 400 records (among about 900 more of 300, so that Redis holds as many records in
// both cases), then 100 with 2 000 to 4 000 (its buckets as many as hold them and the new records
// at about the bucket's size), and inserts 200 new records into each of the 100 in calls of 25, as
// the bench's calls do; it reports Redis's CPU (used_cpu) and bytes in a new record, and their
// ratios grown ÷ young, with the bytes per opportunity of the grown fill (records and index
// entries only).
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestRecordLayoutCostByAggregateSize -v ./aggregator
func TestRecordLayoutCostByAggregateSize(t *testing.T) {
	rdb := redisOfItsOwn(t)
	ctx := context.Background()
	const aggregates, perCall, calls = 100, 25, 8
	const youngSize, grownSize = 200, 2000 // the least records an aggregate holds before the calls
	type candidate struct {
		name    string
		fp      bool // a 16-byte fingerprint as the field, a 15-byte binary value
		bucket  int  // records per bucket (0: one hash per aggregate)
		packed  bool // buckets are fields of one hash, their records concatenated
		indexed int  // bytes of an index entry (0: the whole field)
	}
	cands := []candidate{
		{"layout 10: id field, one hash", false, 0, false, 0},
		{"packed buckets of ~8 in one hash, 4-byte index", true, 8, true, 4},
		{"listpack buckets (keys) of ~32, 4-byte index", true, 32, false, 4},
		{"listpack buckets (keys) of ~64, 4-byte index", true, 64, false, 4},
		{"listpack buckets (keys) of ~100, 4-byte index", true, 100, false, 4},
	}
	if v, err := rdb.ConfigGet(ctx, "hash-max-listpack-entries").Result(); err == nil {
		t.Logf("Redis hash-max-listpack-entries %s (buckets past it are hash tables)", v["hash-max-listpack-entries"])
	}
	only := os.Getenv("REPEATRATE_LAYOUT_CANDIDATES")
	for _, c := range cands {
		if !strings.Contains(c.name, only) {
			continue
		}
		type figures struct{ cpu, in, bytes float64 }
		// measure fills aggregates of base to 2·base records (aggregate a of the first 100 holds
		// base + a·base/100: a hash table doubles its buckets as it passes a power of two, step
		// by step on the commands that follow, so sizes spread over a doubling charge its cost
		// to every size alike), then times the calls on those.
		measure := func(base int) figures {
			prefix := fmt.Sprintf("layoutsize-%d", time.Now().UnixNano())
			defer deleteUnder(ctx, rdb, prefix)
			var sizes []int
			total := 0
			for a := range aggregates {
				sizes = append(sizes, base+a*base/aggregates)
				total += sizes[a]
			}
			// The young aggregates lie among others, so that Redis holds as many records as
			// in the grown case.
			for want := aggregates * grownSize * 3 / 2; total+base*3/2 <= want; total += base * 3 / 2 {
				sizes = append(sizes, base*3/2)
			}
			nb := func(a int) uint32 { return uint32((sizes[a] + calls*perCall + c.bucket - 1) / max(c.bucket, 1)) }
			tag := func(a int) string { return layoutTag(prefix, a) }
			record := func(a, i int) (key, bucket, field, value string) {
				id := fmt.Sprintf("conv-%07d/turn-%d", i/3, i%3)
				occ := int64(1_764_000_000_000_000) + int64(i)*1000
				if !c.fp {
					return tag(a) + ":o", "", fmt.Sprintf("%03x%s", len(id), id), fmt.Sprintf("c%x,%x", occ, occ+1e6)
				}
				sum := sha256.Sum256([]byte(fmt.Sprint(a, "/", id)))
				v := make([]byte, 16)
				v[0] = 'c'
				binary.LittleEndian.PutUint64(v[1:], uint64(occ))
				binary.LittleEndian.PutUint64(v[8:], uint64(occ+1e6)<<8)
				b := fmt.Sprint(binary.LittleEndian.Uint32(sum[:4]) % nb(a))
				if c.packed {
					return tag(a) + ":o", b, string(sum[:16]), string(v[:15])
				}
				return tag(a) + ":b" + b, b, string(sum[:16]), string(v[:15])
			}
			// call runs one call of records from..to of aggregate a: through s, or, packed, the
			// packed script (which finds each record's bucket and appends the absent ones) and,
			// when index is set, the index entries after it.
			call := func(s *redis.Script, a, from, to int, index bool) {
				var keys []string
				var args []any
				if c.packed {
					for i := from; i < to; i++ {
						k, b, f, v := record(a, i)
						keys = []string{k}
						args = append(args, b, f, v)
					}
					if err := recordLayoutPacked.Run(ctx, rdb, keys, args...).Err(); err != nil {
						t.Fatal(err)
					}
					if index {
						var entries []any
						for i := from; i < to; i++ {
							_, _, f, _ := record(a, i)
							entries = append(entries, f[:c.indexed])
						}
						if err := recordLayoutIndex.Run(ctx, rdb, []string{tag(a) + ":s"}, entries...).Err(); err != nil {
							t.Fatal(err)
						}
					}
					return
				}
				if s == recordLayoutFill {
					args = append(args, c.indexed)
				}
				for i := from; i < to; i++ {
					k, _, f, v := record(a, i)
					keys = append(keys, k)
					args = append(args, f, v)
				}
				if s == recordLayoutFill {
					keys = append(keys, tag(a)+":s")
				}
				if err := s.Run(ctx, rdb, keys, args...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			before := usedMemory(ctx, rdb)
			for a, size := range sizes {
				// Layout 10 makes its record hash a hash table (a listpack's lookups are scans):
				// a field past any listpack's bound converts it for good. Set before the fill and
				// deleted after it, so that every aggregate's table grows through its doublings
				// as the fill goes, the young as the grown.
				k := tag(a) + ":o"
				if !c.fp {
					if err := rdb.HSet(ctx, k, "convert", strings.Repeat("x", 1<<12)).Err(); err != nil {
						t.Fatal(err)
					}
				}
				for i := 0; i < size; i += 500 {
					call(recordLayoutFill, a, i, min(i+500, size), true)
				}
				if !c.fp {
					rdb.HDel(ctx, k, "convert")
				}
			}
			held := usedMemory(ctx, rdb) - before
			heldPer := held / float64(total)
			c0, err := readCost(ctx, rdb)
			if err != nil {
				t.Fatal(err)
			}
			for k := range calls {
				for a := range aggregates {
					from := sizes[a] + k*perCall
					call(recordLayoutHot, a, from, from+perCall, false)
				}
			}
			c1, err := readCost(ctx, rdb)
			if err != nil {
				t.Fatal(err)
			}
			n := float64(aggregates * calls * perCall)
			return figures{(c1.cpu - c0.cpu) * 1e6 / n, (c1.in - c0.in) / n, heldPer}
		}
		var young, grown figures
		for range 2 { // alternated, the lower of each kept
			y, g := measure(youngSize), measure(grownSize)
			if young.cpu == 0 || y.cpu < young.cpu {
				young = y
			}
			if grown.cpu == 0 || g.cpu < grown.cpu {
				grown = g
			}
		}
		t.Logf("%-48s Redis CPU µs a new record young / grown %5.2f / %5.2f (%.2f), bytes in %4.0f / %4.0f (%.2f); grown fill %5.1f bytes an opportunity",
			c.name, young.cpu, grown.cpu, grown.cpu/young.cpu, young.in, grown.in, grown.in/young.in, grown.bytes)
	}
}
