package aggregator

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// hashWrite is what one apply call did to one of its aggregate's hashes: the fields a processor
// computing the call's new state would have read, those it set (field, value, ...) and those it
// deleted. key is the hash's key after the store's prefix.
type hashWrite struct {
	key  string
	read []string
	set  []any
	del  []string
}

// storeOnlyScript is the one script a processor that computed each call's new state itself would
// still need: it refuses the call unless the aggregate's version is the one the state was computed
// from (another processor wrote meanwhile), then stores the writes and refreshes the TTLs.
// KEYS: the hashes; ARGV: the version read, the TTL in ms, then per key its number of pairs, its
// number of deletions, the pairs and the deleted fields.
const storeOnlyScript = `
if (redis.call('HGET', KEYS[1], 'v') or '') ~= ARGV[1] then return 0 end
local i = 3
for k = 1, #KEYS do
  local n, d = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
  i = i + 2
  if n > 0 then redis.call('HSET', KEYS[k], unpack(ARGV, i, i + 2 * n - 1)) end
  i = i + 2 * n
  if d > 0 then redis.call('HDEL', KEYS[k], unpack(ARGV, i, i + d - 1)) end
  i = i + d
  redis.call('PEXPIRE', KEYS[k], ARGV[2])
end
return 1
`

// storeIfUnchangedScript is storeOnlyScript with another check: instead of a version, every field the
// state was computed from must still hold what was read (or still be absent), which stops a stale
// write whatever wrote meanwhile, a processor of an older release included. All checks come before
// the first write, so a refused call writes nothing. KEYS: the hashes; ARGV: the TTL in ms, then per
// key the number of fields read, of pairs and of deletions, a string with a byte per field read
// ('1' present, '0' absent), the fields read, what they held (empty when absent), the pairs and the
// deleted fields.
const storeIfUnchangedScript = `
local byte = string.byte
local at = {}
local i = 2
for k = 1, #KEYS do
  local r, n, d, has = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  i = i + 4
  if r > 0 then
    local got = redis.call('HMGET', KEYS[k], unpack(ARGV, i, i + r - 1))
    for j = 1, r do
      local v = got[j]
      if byte(has, j) == 49 then
        if v ~= ARGV[i + r + j - 1] then return 0 end
      elseif v then return 0 end
    end
  end
  i = i + 2 * r
  at[k] = {i, n, d}
  i = i + 2 * n + d
end
for k = 1, #KEYS do
  local j, n, d = at[k][1], at[k][2], at[k][3]
  if n > 0 then redis.call('HSET', KEYS[k], unpack(ARGV, j, j + 2 * n - 1)) end
  j = j + 2 * n
  if d > 0 then redis.call('HDEL', KEYS[k], unpack(ARGV, j, j + d - 1)) end
  redis.call('PEXPIRE', KEYS[k], ARGV[1])
end
return 1
`

// TestRedisCostOfStateComputedInProcessor projects what Redis would spend per call and per record
// if the processor computed each call's new state (the work apply.lua does in Lua) and Redis only
// read and stored it, against the script today, on the Redis REPEATRATE_APPLY_MEMORY_REDIS names
// (nothing else may use it meanwhile):
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestRedisCostOfStateComputedInProcessor -v ./aggregator
//
// The workload is TestRedisCostPerCallAndPerRecord's (100 aggregates, 100 000 new opportunities in
// calls of 5 and of 80, on empty aggregates and on aggregates holding 2 000 records), in layouts 10
// and 11. The script runs it first on a prefix of its own, and every call's writes are recorded by
// reading the aggregate's state before and after each batch. Three ways of storing those same writes
// are then timed on a fresh prefix filled the same way:
//   - "read + store": one pipeline reads, for every call, the records of its ids (layout 10) and
//     the state fields and buckets it changes, then a second pipeline sends each call's writes to
//     storeOnlyScript, which checks the version first;
//   - "read + store if unchanged": the same, but the script checks every field read instead of a
//     version (storeIfUnchangedScript), which needs no version that every writer moves;
//   - "WATCH + MULTI": the same reads and writes as plain commands in one optimistic transaction
//     per batch, no Lua at all (a single Redis only: in a cluster a transaction holds one slot).
//
// It also logs this process's CPU per call: for the script, encoding the batch and its pipeline;
// for the other ways, their pipelines with the arguments built beforehand. What it leaves out: the
// processor's cost of computing the state, the index's sorted set (its ZADDs and TTL), and what a
// refused check costs (a read and a compute again).
func TestRedisCostOfStateComputedInProcessor(t *testing.T) {
	rdb := redisOfItsOwn(t)
	ctx := context.Background()
	const aggs, measured, filled, ret = 100, 100_000, 2_000, 30 * 24 * time.Hour
	now := time.Now()
	ttl := int64(ret / time.Millisecond)
	sha, err := rdb.ScriptLoad(ctx, storeOnlyScript).Result()
	if err != nil {
		t.Fatal(err)
	}
	shaUnchanged, err := rdb.ScriptLoad(ctx, storeIfUnchangedScript).Result()
	if err != nil {
		t.Fatal(err)
	}
	batches := func(total, per int, id string, occ func(i int) int64) [][]Observation {
		var out [][]Observation
		obs := make([]Observation, 0, per*aggs)
		for i := 0; i < total; i++ {
			o := occ(i)
			obs = append(obs, Observation{Key: costKey(i % aggs), OpportunityID: fmt.Sprintf("%s-%07d", id, i), Class: Class(1 + i%3), Occurred: o, Assessed: o + 1e6})
			if len(obs) == cap(obs) || i == total-1 {
				out = append(out, obs)
				obs = make([]Observation, 0, per*aggs)
			}
		}
		return out
	}
	apply := func(s *Redis, bs [][]Observation) {
		for _, b := range bs {
			if _, err := s.Apply(ctx, b, now); err != nil {
				t.Fatal(err)
			}
		}
	}
	// opened returns a store on a fresh prefix whose aggregates hold fill records each. For the
	// ways without the script, layout 10's empty record hashes are made hash tables first, as the
	// script makes them (a listpack scans itself on every lookup), with a field of their own.
	opened := func(layout Layout, fill int, script bool) (*Redis, string) {
		prefix := fmt.Sprintf("storecost-%d", time.Now().UnixNano())
		s := costStore(t, rdb, layout, prefix, ret)
		if fill > 0 {
			apply(s, batches(fill*aggs, 20, "pre", func(i int) int64 { return Micros(now) - 60e6 - int64(i)*(86400e6/int64(fill*aggs+1)) }))
		} else if layout == Layout10 && !script {
			long := strings.Repeat("x", 100)
			for i := 0; i < aggs; i++ {
				o := s.keys(costKey(i))[0]
				rdb.HSet(ctx, o, long, "", "made", "")
				rdb.HDel(ctx, o, long)
			}
		}
		return s, prefix
	}
	// record runs bs through the script and returns, per batch and call, what each call wrote.
	record := func(layout Layout, fill int, bs [][]Observation) [][][]hashWrite {
		s, prefix := opened(layout, fill, true)
		defer deleteUnder(ctx, rdb, prefix)
		hashes := []int{1} // the state hash, and (layout 11) the packed store, read whole
		if layout == Layout11 {
			hashes = append(hashes, 2)
		}
		var out [][][]hashWrite
		for _, b := range bs {
			byKey, order := groupByKey(b)
			before := make([][]map[string]string, len(order))
			for i, k := range order {
				for _, h := range hashes {
					before[i] = append(before[i], rdb.HGetAll(ctx, s.keys(k)[h]).Val())
				}
			}
			if _, err := s.Apply(ctx, b, now); err != nil {
				t.Fatal(err)
			}
			calls := make([][]hashWrite, len(order))
			for i, k := range order {
				keys := s.keys(k)
				// The version hash first: storeOnlyScript checks its v.
				var ws []hashWrite
				for j, h := range hashes {
					w := hashWrite{key: strings.TrimPrefix(keys[h], prefix)}
					if h == 1 {
						w.read = []string{"H", "v"}
					}
					after := rdb.HGetAll(ctx, keys[h]).Val()
					for f, v := range after {
						if before[i][j][f] != v {
							w.set = append(w.set, f, v)
							if f != "H" && f != "v" {
								w.read = append(w.read, f)
							}
						}
					}
					for f := range before[i][j] {
						if _, ok := after[f]; !ok {
							w.del = append(w.del, f)
							w.read = append(w.read, f)
						}
					}
					ws = append(ws, w)
				}
				if layout == Layout10 {
					w := hashWrite{key: strings.TrimPrefix(keys[0], prefix)}
					for _, o := range byKey[k] {
						w.read = append(w.read, b[o].OpportunityID)
					}
					for j, v := range rdb.HMGet(ctx, keys[0], w.read...).Val() {
						w.set = append(w.set, w.read[j], v)
					}
					ws = append(ws, w)
				}
				calls[i] = ws
			}
			out = append(out, calls)
		}
		return out
	}
	// readAll queues every call's reads, a command per hash with fields to read (nil for one
	// without); a call's first hash is its state hash, whose second field read is the version.
	readAll := func(p redis.Pipeliner, prefix string, calls [][]hashWrite) [][]*redis.SliceCmd {
		out := make([][]*redis.SliceCmd, len(calls))
		for i, ws := range calls {
			out[i] = make([]*redis.SliceCmd, len(ws))
			for j, w := range ws {
				if len(w.read) > 0 {
					out[i][j] = p.HMGet(ctx, prefix+w.key, w.read...)
				}
			}
		}
		return out
	}
	// storeAll sends each call's writes to the script sha with the arguments args makes.
	storeAll := func(sha, prefix string, calls [][]hashWrite, args func(i int) []any) {
		p := rdb.Pipeline()
		for i, ws := range calls {
			keys := make([]string, len(ws))
			for j, w := range ws {
				keys[j] = prefix + w.key
			}
			p.EvalSha(ctx, sha, keys, args(i)...)
		}
		cmds, err := p.Exec(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			if n, _ := c.(*redis.Cmd).Int(); n != 1 {
				t.Fatalf("the store script refused a call: %v", c)
			}
		}
	}
	writes := func(args []any, w hashWrite) []any {
		args = append(args, w.set...)
		for _, f := range w.del {
			args = append(args, f)
		}
		return args
	}
	stores := map[string]func(prefix string, calls [][]hashWrite){
		"read + store": func(prefix string, calls [][]hashWrite) {
			p := rdb.Pipeline()
			read := readAll(p, prefix, calls)
			if _, err := p.Exec(ctx); err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			storeAll(sha, prefix, calls, func(i int) []any {
				v, _ := read[i][0].Val()[1].(string)
				args := []any{v, ttl}
				for _, w := range calls[i] {
					args = writes(append(args, len(w.set)/2, len(w.del)), w)
				}
				return args
			})
		},
		"read + store if unchanged": func(prefix string, calls [][]hashWrite) {
			p := rdb.Pipeline()
			read := readAll(p, prefix, calls)
			if _, err := p.Exec(ctx); err != nil && err != redis.Nil {
				t.Fatal(err)
			}
			storeAll(shaUnchanged, prefix, calls, func(i int) []any {
				args := []any{ttl}
				for j, w := range calls[i] {
					var got []any
					if read[i][j] != nil {
						got = read[i][j].Val()
					}
					has := make([]byte, len(got))
					args = append(args, len(got), len(w.set)/2, len(w.del), "")
					at := len(args) - 1
					for _, f := range w.read {
						args = append(args, f)
					}
					for k, v := range got {
						s, ok := v.(string)
						has[k] = '0'
						if ok {
							has[k] = '1'
						}
						args = append(args, s)
					}
					args[at] = string(has)
					args = writes(args, w)
				}
				return args
			})
		},
		"WATCH + MULTI": func(prefix string, calls [][]hashWrite) {
			var watched []string
			for _, ws := range calls {
				watched = append(watched, prefix+ws[0].key)
			}
			err := rdb.Watch(ctx, func(tx *redis.Tx) error {
				if _, err := tx.Pipelined(ctx, func(p redis.Pipeliner) error { readAll(p, prefix, calls); return nil }); err != nil && err != redis.Nil {
					return err
				}
				_, err := tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
					for _, ws := range calls {
						for _, w := range ws {
							if len(w.set) > 0 {
								p.HSet(ctx, prefix+w.key, w.set...)
							}
							if len(w.del) > 0 {
								p.HDel(ctx, prefix+w.key, w.del...)
							}
							p.PExpire(ctx, prefix+w.key, ret)
						}
					}
					return nil
				})
				return err
			}, watched...)
			if err != nil {
				t.Fatal(err)
			}
		},
	}
	ways := []string{"script", "read + store", "read + store if unchanged", "WATCH + MULTI"}
	for _, layout := range []Layout{Layout10, Layout11} {
		for _, fill := range []int{0, filled} {
			perRecord := map[string][2]float64{}
			for c, per := range []int{5, 80} {
				bs := batches(measured, per, "new", func(i int) int64 { return Micros(now) - int64(i%30)*1e6 })
				rec := record(layout, fill, bs)
				var line, client []string
				for _, way := range ways {
					s, prefix := opened(layout, fill, way == "script")
					before, err := readCost(ctx, rdb)
					if err != nil {
						t.Fatal(err)
					}
					own := processCPU(t)
					if way == "script" {
						apply(s, bs)
					} else {
						for _, calls := range rec {
							stores[way](prefix, calls)
						}
					}
					own = processCPU(t) - own
					after, err := readCost(ctx, rdb)
					if err != nil {
						t.Fatal(err)
					}
					deleteUnder(ctx, rdb, prefix)
					us := (after.cpu - before.cpu) * 1e6 / measured
					r := perRecord[way]
					r[c] = us
					perRecord[way] = r
					line = append(line, fmt.Sprintf("%s %.1f", way, us*float64(per)))
					client = append(client, fmt.Sprintf("%s %.1f", way, own.Seconds()*1e6/float64(measured/per)))
				}
				t.Logf("layout %d, %d records an aggregate before, calls of %d: Redis µs a call: %s", layout, fill, per, strings.Join(line, ", "))
				t.Logf("layout %d, %d records an aggregate before, calls of %d: this process's µs a call: %s", layout, fill, per, strings.Join(client, ", "))
			}
			for _, way := range ways {
				c5, c80 := perRecord[way][0], perRecord[way][1]
				f := (c5 - c80) / (1.0/5 - 1.0/80)
				t.Logf("layout %d, %d records an aggregate before, %s: F %.1f µs a call, R %.2f µs a record, a call of 10: %.1f µs", layout, fill, way, f, c80-f/80, f+10*(c80-f/80))
			}
		}
	}
}

// processCPU is the test process's user and system CPU time so far.
func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
