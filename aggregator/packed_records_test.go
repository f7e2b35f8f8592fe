package aggregator

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// packedShapeLua opens the packed record store of KEYS[1] with the shape KEYS[2] keeps ("L,p,n",
// standing in for the state a real caller reads anyway), and closes it: a flush, then the shape
// written back when it changed (deleted when the store is empty).
const packedShapeLua = `
local function openPacked(len)
  local shape = redis.call('GET', KEYS[2])
  local L, p, n = 0, 0, 0
  if shape then
    local a, b, c = string.match(shape, '^(%d+),(%d+),(%d+)$')
    L, p, n = tonumber(a), tonumber(b), tonumber(c)
  end
  return newPackedRecords(KEYS[1], len, L, p, n), L .. ',' .. p .. ',' .. n
end
local function closePacked(s, was)
  s.flush()
  local L, p, n = s.shape()
  local now = L .. ',' .. p .. ',' .. n
  if now == was then return end
  if now == '0,0,0' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], now) end
end
`

// packedRecordsDriver runs a call's operations on the packed record store of KEYS[1] (its shape
// in KEYS[2]): ARGV[1]
// "load", "lazy" or "all", then triples of op ("g" get, "p" put, "d" delete, "e" each),
// fingerprint (for "e" a 4-byte prefix) and payload (for "p"). Tags a, b and c mean payloads of
// 15, 22 and 29 bytes ("r" takes no operand). It loads every bucket the call names first (unless
// lazy: each is then read when first needed; "all" looks up every fingerprint of the call's "g",
// "p" and "d" first, with getAll), runs the operations in order, flushes, and returns one reply
// per operation: the payload or false, 1 or 0 for a delete, the matching records end to end for
// "e", the bucket fields read so far for "r"; after them, for "all", what getAll found for each
// of those fingerprints, in the order of the operations.
var packedRecordsDriver = redis.NewScript(packedRecordsSource + packedShapeLua + `
local s, was = openPacked({[97] = 15, [98] = 22, [99] = 29})
local fps = {}
for i = 3, #ARGV, 3 do if ARGV[i] ~= '' then fps[#fps + 1] = ARGV[i] end end
if ARGV[1] == 'load' then s.load(fps) end
local pre, preList = {}, {}
if ARGV[1] == 'all' then
  for i = 2, #ARGV, 3 do
    if ARGV[i] == 'g' or ARGV[i] == 'p' or ARGV[i] == 'd' then preList[#preList + 1] = ARGV[i + 1] end
  end
  s.getAll(preList, 1, #preList, pre)
end
local out = {}
for i = 2, #ARGV, 3 do
  local op, fp = ARGV[i], ARGV[i + 1]
  local r
  if op == 'g' then r = s.get(fp) or false
  elseif op == 'p' then s.put(fp, ARGV[i + 2]); r = 1
  elseif op == 'd' then r = s.delete(fp) and 1 or 0
  elseif op == 'r' then r = s.fieldsRead()
  else
    local got = {}
    s.each(fp, function(f, v) got[#got + 1] = f .. v end)
    table.sort(got)
    r = table.concat(got)
  end
  out[#out + 1] = r
end
for _, fp in ipairs(preList) do out[#out + 1] = pre[fp] end
closePacked(s, was)
return out
`)

var packedLen = map[byte]int{'a': 15, 'b': 22, 'c': 29}

// TestPackedRecordsMatchModel holds the packed record store's promises against a map, on the test
// Redis and on the embedded one of `repeatrate dev`: a record put is found until deleted, with
// the payload last put, whatever other records' payloads hold (some carry other fingerprints
// inside them); a delete reports whether there was a record; each finds exactly the records of a
// 4-byte prefix; and what the hash stores after every call is exactly the model's records, each
// in the bucket its fingerprint addresses, with the count in its meta field, no empty bucket, and
// the bucket count within the load's bounds. A store emptied is a key that no longer exists.
func TestPackedRecordsMatchModel(t *testing.T) {
	backends := map[string]func(t *testing.T) *redis.Client{
		"embedded": func(t *testing.T) *redis.Client {
			c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
			t.Cleanup(func() { c.Close() })
			return c
		},
		"redis": func(t *testing.T) *redis.Client { return testenv.Redis(t) },
	}
	for name, client := range backends {
		t.Run(name, func(t *testing.T) {
			seeds := 6
			if name == "embedded" {
				seeds = 2
			}
			for seed := range seeds {
				t.Run(fmt.Sprint(seed), func(t *testing.T) {
					c := client(t)
					keys := packedKeys(t, c, "packed")
					checkPackedRecords(t, c, keys, uint64(seed))
				})
			}
		})
	}
}

// packedKeys names a record hash and the key of its shape under a prefix of the test's own,
// deleted when the test ends.
func packedKeys(t *testing.T, c *redis.Client, what string) []string {
	prefix := testenv.Name(t, what)
	testenv.CleanPrefix(t, c, prefix)
	return []string{prefix + ":{p}:o", prefix + ":{p}:shape"}
}

func checkPackedRecords(t *testing.T, c *redis.Client, keys []string, seed uint64) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 7))
	// Fingerprints: random, some sharing their first 4 bytes (one bucket, one index prefix).
	pool := make([]string, 3000)
	for i := range pool {
		b := make([]byte, 16)
		for j := range b {
			b[j] = byte(r.IntN(256))
		}
		if i > 0 && r.IntN(10) == 0 {
			copy(b, pool[r.IntN(i)][:4])
		}
		pool[i] = string(b)
	}
	payload := func() string {
		tag := "abc"[r.IntN(3)]
		b := []byte{tag}
		for len(b) < packedLen[tag] {
			b = append(b, byte(r.IntN(256)))
		}
		// A fingerprint inside a payload: a search that does not check where a record starts
		// would find it there.
		if tag == 'c' && r.IntN(2) == 0 {
			copy(b[1+r.IntN(12):], pool[r.IntN(len(pool))])
		}
		return string(b)
	}
	model := map[string]string{}
	before := map[string]string{} // the model as the store holds it before the call being made
	call := func(args []any) []any {
		t.Helper()
		if len(args) == 0 {
			args = []any{"g", pool[0], ""}
		}
		mode := []string{"load", "lazy", "all"}[r.IntN(3)]
		// What getAll must find: each fingerprint the call gets, puts or deletes, as the store
		// holds it before the call.
		var pre []any
		if mode == "all" {
			for i := 0; i+2 < len(args); i += 3 {
				if op := args[i]; op == "g" || op == "p" || op == "d" {
					if v, ok := before[args[i+1].(string)]; ok {
						pre = append(pre, v)
					} else {
						pre = append(pre, nil)
					}
				}
			}
		}
		got, err := packedRecordsDriver.Run(ctx, c, keys, append([]any{mode}, args...)...).Slice()
		if err != nil {
			t.Fatal(err)
		}
		ops := len(args) / 3
		if len(got) != ops+len(pre) {
			t.Fatalf("%d replies to %d operations and %d lookups", len(got), ops, len(pre))
		}
		for i, w := range pre {
			if got[ops+i] != w {
				t.Fatalf("getAll's lookup %d: got %q, want %q", i, got[ops+i], w)
			}
		}
		return got[:ops]
	}
	asString := func(v any) string {
		s, _ := v.(string)
		return s
	}
	run := func(calls, maxOps int, putShare, delShare int) {
		for range calls {
			var args []any
			var want []any
			before = maps.Clone(model)
			ops := 1 + r.IntN(maxOps)
			for range ops {
				fp := pool[r.IntN(len(pool))]
				switch x := r.IntN(100); {
				case x < putShare:
					p := payload()
					model[fp] = p
					args, want = append(args, "p", fp, p), append(want, int64(1))
				case x < putShare+delShare:
					_, had := model[fp]
					delete(model, fp)
					args = append(args, "d", fp, "")
					if had {
						want = append(want, int64(1))
					} else {
						want = append(want, int64(0))
					}
				case x < putShare+delShare+5:
					var recs []string
					for f, p := range model {
						if f[:4] == fp[:4] {
							recs = append(recs, f+p)
						}
					}
					sort.Strings(recs)
					args, want = append(args, "e", fp[:4], ""), append(want, strings.Join(recs, ""))
				default:
					p, had := model[fp]
					args = append(args, "g", fp, "")
					if had {
						want = append(want, p)
					} else {
						want = append(want, nil)
					}
				}
			}
			got := call(args)
			for i := range want {
				if w, ok := want[i].(string); ok {
					if asString(got[i]) != w {
						t.Fatalf("op %d (%s): got %q, want %q", i, args[3*i], got[i], w)
					}
				} else if want[i] != got[i] {
					t.Fatalf("op %d (%s): got %v, want %v", i, args[3*i], got[i], want[i])
				}
			}
			checkPackedHash(t, c, keys, model)
		}
	}
	run(200, 40, 60, 10) // growing
	run(20, 3000, 70, 5) // large calls
	run(300, 20, 30, 30) // steady
	run(100, 60, 10, 60) // shrinking
	var all []any
	before = maps.Clone(model)
	for fp := range model {
		all = append(all, "d", fp, "")
	}
	call(all)
	if n, _ := c.Exists(ctx, keys...).Result(); n != 0 {
		t.Fatalf("emptied, the store still holds %v and shape %q", c.HGetAll(ctx, keys[0]).Val(), c.Get(ctx, keys[1]).Val())
	}
}

// checkPackedHash requires the hash to hold exactly model's records, each in its bucket under
// its name (the bucket's little-endian bytes, as few as it takes), and a bucket count within the
// load's bounds.
func checkPackedHash(t *testing.T, c *redis.Client, keys []string, model map[string]string) {
	t.Helper()
	if n, buckets := checkPackedPlaces(t, c, keys, model); n > 8*buckets || (buckets > 1 && 2*n < 8*(buckets-1)) {
		t.Fatalf("%d records in %d buckets", n, buckets)
	}
}

// checkPackedPlaces is checkPackedHash without the load's bounds; it returns the records and
// buckets the shape says.
func checkPackedPlaces(t *testing.T, c *redis.Client, keys []string, model map[string]string) (int, int) {
	t.Helper()
	ctx := context.Background()
	h, err := c.HGetAll(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	shape, _ := c.Get(ctx, keys[1]).Result()
	if len(model) == 0 && len(h) == 0 && shape == "" {
		return 0, 1
	}
	var level, split, n int
	if _, err := fmt.Sscanf(shape, "%d,%d,%d", &level, &split, &n); err != nil {
		t.Fatalf("shape %q: %v", shape, err)
	}
	if n != len(model) {
		t.Fatalf("the shape counts %d records, the model %d", n, len(model))
	}
	size := 1 << level
	buckets := size + split
	seen := map[string]bool{}
	for f, v := range h {
		b := 0
		for i := len(f) - 1; i >= 0; i-- {
			b = b*256 + int(f[i])
		}
		if f == "" || len(f) > 4 || (len(f) > 1 && f[len(f)-1] == 0) || b >= buckets {
			t.Fatalf("field %x is no name of the %d buckets", f, buckets)
		}
		if v == "" {
			t.Fatalf("bucket %d stored empty", b)
		}
		for at := 0; at < len(v); {
			if at+17 > len(v) {
				t.Fatalf("bucket %d: a record cut short at %d", b, at)
			}
			fp := v[at : at+16]
			end := at + 16 + packedLen[v[at+16]]
			if packedLen[v[at+16]] == 0 || end > len(v) {
				t.Fatalf("bucket %d: a bad record at %d", b, at)
			}
			x := int(binary.LittleEndian.Uint32([]byte(fp[:4])))
			want := x % size
			if want < split {
				want = x % (2 * size)
			}
			if want != b {
				t.Fatalf("a record in bucket %d belongs in %d", b, want)
			}
			if seen[fp] {
				t.Fatalf("fingerprint %x stored twice", fp)
			}
			seen[fp] = true
			if model[fp] != v[at+16:end] {
				t.Fatalf("fingerprint %x holds %x, the model %x", fp, v[at+16:end], model[fp])
			}
			at = end
		}
	}
	if len(seen) != len(model) {
		t.Fatalf("the hash holds %d records, the model %d", len(seen), len(model))
	}
	return n, buckets
}

// TestPackedRecordsNameEveryBucket: buckets far apart (a store opened at level 26, as one of
// hundreds of millions of records would be) get fields of 1 to 4 bytes that name each exactly, on
// Redis and on the embedded server (whose Lua tables would fill every index below a bucket
// number used as a key: seconds and gigabytes at this level).
func TestPackedRecordsNameEveryBucket(t *testing.T) {
	onBackends(t, true, func(t *testing.T, addr string) {
		c := packedClient(t, addr)
		checkPackedNames(t, c, packedKeys(t, c, "packed-names"))
	})
}

// packedClient is a client of addr, closed when the test ends.
func packedClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	return c
}

func checkPackedNames(t *testing.T, c *redis.Client, keys []string) {
	ctx := context.Background()
	for _, level := range []int{7, 15, 23, 26} {
		c.Del(ctx, keys...)
		// A shape the store could leave: about 4 records a bucket, none of them stored here.
		stated := 4 * ((1 << level) + 4)
		c.Set(ctx, keys[1], fmt.Sprintf("%d,5,%d", level, stated), 0)
		r := rand.New(rand.NewPCG(uint64(level), 3))
		model := map[string]string{}
		args := []any{"load"}
		for i := range 3000 {
			b := make([]byte, 16)
			binary.LittleEndian.PutUint32(b, r.Uint32())
			if i < 20 {
				binary.LittleEndian.PutUint32(b, uint32(i)) // the lowest buckets, split and not
			}
			b[4] = byte(i)
			model[string(b)] = fmt.Sprintf("a%014d", i)
			args = append(args, "p", string(b), model[string(b)])
		}
		if err := packedRecordsDriver.Run(ctx, c, keys, args...).Err(); err != nil {
			t.Fatal(err)
		}
		// The shape counts the stated records too; the hash holds the model's alone.
		var l, sp, n int
		fmt.Sscanf(c.Get(ctx, keys[1]).Val(), "%d,%d,%d", &l, &sp, &n)
		if n != stated+len(model) {
			t.Fatalf("level %d: the shape counts %d records, want %d", level, n, stated+len(model))
		}
		c.Set(ctx, keys[1], fmt.Sprintf("%d,%d,%d", l, sp, len(model)), 0)
		checkPackedPlaces(t, c, keys, model)
	}
}

// TestPackedRecordsLargeCalls: a call that touches more buckets than one command can carry out
// of a script (Lua's unpack stops near 8 000 values) reads and writes them all, in chunks.
func TestPackedRecordsLargeCalls(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	keys := packedKeys(t, c, "packed-large")
	r := rand.New(rand.NewPCG(1, 2))
	model := map[string]string{}
	var fps []string
	put := func(fresh int) {
		var args []any
		for i := range fresh + 12000 {
			var fp string
			if i < fresh {
				b := make([]byte, 16)
				for j := range b {
					b[j] = byte(r.IntN(256))
				}
				fp = string(b)
				fps = append(fps, fp)
			} else if len(fps) > 0 {
				fp = fps[r.IntN(len(fps))]
			} else {
				continue
			}
			p := fmt.Sprintf("a%014d", r.IntN(1e9))
			model[fp] = p
			args = append(args, "p", fp, p)
		}
		if err := packedRecordsDriver.Run(ctx, c, keys, append([]any{"load"}, args...)...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for range 30 {
		put(7000)
	}
	put(0) // 12 000 records over about 26 000 buckets
	checkPackedHash(t, c, keys, model)
}

// packedRecordsSteps puts the records ARGV[2:] gives (fingerprint, payload pairs) into KEYS[1]'s
// store, then looks up ARGV[1], and returns the records that lookup alone walked past.
var packedRecordsSteps = redis.NewScript(packedRecordsSource + `
local s = newPackedRecords(KEYS[1], {[97] = 15, [98] = 22, [99] = 29}, 0, 0, 0)
for i = 2, #ARGV, 2 do s.put(ARGV[i], ARGV[i + 1]) end
local before = s.steps()
s.get(ARGV[1])
return s.steps() - before
`)

// TestPackedRecordsLookupReadsABucketOnce: a lookup walks each record of its bucket at most once,
// however many false matches of the fingerprint the records' bytes hold (here every record's
// payload holds the zero fingerprint twice over, in a bucket of 512 records).
func TestPackedRecordsLookupReadsABucketOnce(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer c.Close()
	zero := strings.Repeat("\x00", 16)
	args := []any{zero}
	const k = 512
	for i := range k {
		b := make([]byte, 16)
		binary.LittleEndian.PutUint32(b, uint32(i+1)<<20) // one bucket while L < 20
		b[15] = 1
		args = append(args, string(b), "c"+strings.Repeat("\x00", 28))
	}
	steps, err := packedRecordsSteps.Run(context.Background(), c, []string{"k"}, args...).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if steps > k {
		t.Fatalf("a lookup walked %d records in a bucket of %d", steps, k)
	}
}

// TestPackedRecordsReadsWriteNothing: a call that only reads writes nothing, so a read-only
// script (EVAL_RO) can use the store.
func TestPackedRecordsReadsWriteNothing(t *testing.T) {
	ctx := context.Background()
	c := testenv.Redis(t)
	keys := packedKeys(t, c, "packed-ro")
	args := []any{"load"}
	for i := range 100 {
		args = append(args, "p", fmt.Sprintf("%016d", i), fmt.Sprintf("a%014d", i))
	}
	if err := packedRecordsDriver.Run(ctx, c, keys, args...).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := packedRecordsDriver.RunRO(ctx, c, keys, "load", "g", fmt.Sprintf("%016d", 7), "", "e", "0000", "").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != fmt.Sprintf("a%014d", 7) {
		t.Fatalf("read %q", got[0])
	}
	// Calls that end with every bucket as it was: a record put again as it is, a record put and
	// deleted again. A prefix of 16 bytes finds its one record.
	fp7, fp8 := fmt.Sprintf("%016d", 7), fmt.Sprintf("%016d", 8)
	got, err = packedRecordsDriver.RunRO(ctx, c, keys, "load",
		"p", fp7, fmt.Sprintf("a%014d", 7),
		"p", "new-fingerprint!", "b"+strings.Repeat("x", 21), "d", "new-fingerprint!", "",
		"e", fp8, "").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if got[3] != fp8+fmt.Sprintf("a%014d", 8) {
		t.Fatalf("each of a whole fingerprint found %q", got[3])
	}
}

// TestPackedRecordsSplitInOneRead: a call whose new records split buckets reads the buckets that
// split in the same command as the ones its fingerprints name (one HMGET, no HGET or second
// HMGET), on a Redis of the test's own (commandstats are server-wide).
func TestPackedRecordsSplitInOneRead(t *testing.T) {
	ctx := context.Background()
	c := testenv.OwnRedis(t)
	keys := []string{"{p}:o", "{p}:shape"}
	r := rand.New(rand.NewPCG(5, 5))
	fresh := func(k int) []any {
		args := []any{"load"}
		for i := range k {
			b := make([]byte, 16)
			for j := range b {
				b[j] = byte(r.IntN(256))
			}
			args = append(args, "p", string(b), fmt.Sprintf("a%014d", i))
		}
		return args
	}
	if err := packedRecordsDriver.Run(ctx, c, keys, fresh(8*64)...).Err(); err != nil { // 64 full buckets
		t.Fatal(err)
	}
	for range 20 {
		c.ConfigResetStat(ctx)
		if err := packedRecordsDriver.Run(ctx, c, keys, fresh(10)...).Err(); err != nil {
			t.Fatal(err)
		}
		stats, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(stats, "cmdstat_hmget:calls=1,") || strings.Contains(stats, "cmdstat_hget:") {
			t.Fatalf("a call of 10 new records read with:\n%s", stats)
		}
	}
	var level, split, n int
	fmt.Sscanf(c.Get(ctx, keys[1]).Val(), "%d,%d,%d", &level, &split, &n)
	if n != 8*64+200 || (1<<level)+split < 64+20 {
		t.Fatalf("shape %d,%d,%d: the calls did not split", level, split, n)
	}
}

// packedOpen opens the store of KEYS[1] on the shape ARGV gives (numbers as they come) and reads
// nothing.
var packedOpen = redis.NewScript(packedRecordsSource + `
newPackedRecords(KEYS[1], {}, tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
return 1
`)

// TestPackedRecordsRefuseForeignShapes: the store opens only on a shape it could have left (any
// other would address records where they are not), and takes only records of the lengths their
// tags say, with the same error on Redis and on the embedded server.
func TestPackedRecordsRefuseForeignShapes(t *testing.T) {
	ctx := context.Background()
	onBackends(t, true, func(t *testing.T, addr string) {
		c := packedClient(t, addr)
		keys := packedKeys(t, c, "packed-shapes")
		for _, shape := range []string{"0,1,0", "5,6,0", "0,0,9", "1,0,0", "2,1,41", "32,0,0"} {
			c.Set(ctx, keys[1], shape, 0)
			err := packedRecordsDriver.Run(ctx, c, keys, "load", "g", strings.Repeat("f", 16), "").Err()
			if err == nil || !strings.Contains(err.Error(), "is none the store leaves") {
				t.Errorf("shape %s: %v", shape, err)
			}
		}
		for _, shape := range []string{"0,0,0", "0,0,8", "1,0,5", "2,3,40"} {
			c.Set(ctx, keys[1], shape, 0)
			if err := packedRecordsDriver.Run(ctx, c, keys, "load", "g", strings.Repeat("f", 16), "").Err(); err != nil {
				t.Errorf("shape %s: %v", shape, err)
			}
		}
		for _, shape := range [][3]any{{1, 0, -1}, {0.5, 0, 0}, {1, 0.5, 4}, {2, 1, 39.5}} {
			err := packedOpen.Run(ctx, c, keys[:1], shape[:]...).Err()
			if err == nil || !strings.Contains(err.Error(), "is none the store leaves") {
				t.Errorf("shape %v: %v", shape, err)
			}
		}
		c.Del(ctx, keys...)
		for _, rec := range [][2]string{{"short", "a" + strings.Repeat("x", 14)}, {strings.Repeat("f", 16), "a" + strings.Repeat("x", 13)}, {strings.Repeat("f", 16), "z" + strings.Repeat("x", 14)}} {
			err := packedRecordsDriver.Run(ctx, c, keys, "load", "p", rec[0], rec[1]).Err()
			if err == nil || !strings.Contains(err.Error(), "a record is a 16-byte fingerprint") {
				t.Errorf("record %q %q: %v", rec[0], rec[1], err)
			}
		}
	})
}

// TestPackedRecordsGrowFromEmptyReadsOnce: a call that fills an empty store reads the one bucket
// there is, not the buckets its splits will make.
func TestPackedRecordsGrowFromEmptyReadsOnce(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: miniredis.RunT(t).Addr()})
	defer c.Close()
	keys := []string{"{p}:o", "{p}:shape"}
	args := []any{"load"}
	for i := range 2000 {
		args = append(args, "p", fmt.Sprintf("%016x", uint64(i)*0x9e3779b97f4a7c15), fmt.Sprintf("a%014d", i))
	}
	args = append(args, "r", "", "")
	got, err := packedRecordsDriver.Run(ctx, c, keys, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if read := got[len(got)-1]; read != int64(1) {
		t.Fatalf("filling an empty store read %v bucket fields", read)
	}
}

// TestPackedRecordsLookupFollowsSplitsAndMerges: a fingerprint looked up and found absent, then
// put after another record's put split its bucket, lands in the bucket it addresses after the
// split, even when the split moved no record and left its old bucket's bytes as they were; and
// one put after deletes merged its bucket away lands in the bucket it was merged into. Whether it
// was looked up alone (get) or with the call's others (getAll, whose put appends without a search).
func TestPackedRecordsLookupFollowsSplitsAndMerges(t *testing.T) {
	onBackends(t, true, func(t *testing.T, addr string) {
		ctx := context.Background()
		c := packedClient(t, addr)
		// fp names a fingerprint whose address word is w.
		fp := func(w uint32, tail byte) string {
			b := make([]byte, 16)
			binary.LittleEndian.PutUint32(b, w)
			b[15] = tail
			return string(b)
		}
		for _, mode := range []string{"lazy", "all"} {
			keys := packedKeys(t, c, "packed-follow-"+mode)
			model := map[string]string{}
			args := []any{"lazy"}
			// 8 records addressing 0 mod 4 and 8 addressing 1 mod 4: the ninth put splits bucket 0
			// by bit 0, so the store leaves level 1, split pointer 0, 16 records (the next put
			// splits bucket 0 by bit 1, which moves none of these).
			for i := 0; i < 16; i++ {
				f, v := fp(uint32(4*(i/2)+i%2), byte(i)), fmt.Sprintf("a%014d", i)
				args = append(args, "p", f, v)
				model[f] = v
			}
			if err := packedRecordsDriver.Run(ctx, c, keys, args...).Err(); err != nil {
				t.Fatal(err)
			}
			if sh := c.Get(ctx, keys[1]).Val(); sh != "1,0,16" {
				t.Fatalf("shape %q, want 1,0,16", sh)
			}
			x, y := fp(2, 100), fp(5, 101) // x: bucket 0 now, bucket 2 after the split; y: bucket 1
			got, err := packedRecordsDriver.Run(ctx, c, keys, mode, "g", x, "", "p", y, "a00000000000101", "p", x, "a00000000000100").Slice()
			if err != nil {
				t.Fatal(err)
			}
			if got[0] != nil {
				t.Fatalf("%s: x found before it was put: %v", mode, got[0])
			}
			model[x], model[y] = "a00000000000100", "a00000000000101"
			checkPackedHash(t, c, keys, model)

			// 18 records in buckets 0, 1 and 2 (level 1, split pointer 1). z addresses bucket 2, the
			// last; deleting 11 records merges bucket 2 back into bucket 0, where z then belongs.
			if sh := c.Get(ctx, keys[1]).Val(); sh != "1,1,18" {
				t.Fatalf("shape %q, want 1,1,18", sh)
			}
			z := fp(6, 102)
			args = []any{mode}
			deleted := 0
			for f := range model {
				if deleted == 11 {
					break
				}
				args = append(args, "d", f, "")
				delete(model, f)
				deleted++
			}
			args = append(args, "p", z, "a00000000000102")
			model[z] = "a00000000000102"
			if err := packedRecordsDriver.Run(ctx, c, keys, args...).Err(); err != nil {
				t.Fatal(err)
			}
			if sh := c.Get(ctx, keys[1]).Val(); sh != "1,0,8" {
				t.Fatalf("shape %q, want 1,0,8", sh)
			}
			checkPackedHash(t, c, keys, model)
		}
	})
}
