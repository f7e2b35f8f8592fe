package aggregator

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// The aggregate's hashes the projection below records, as indexes into Redis.keys.
const (
	recordHash  = 0 // layout 10's records
	stateHash   = 1
	packedStore = 2 // layout 11's records
)

// hashWrite is what one apply call did to one of its aggregate's hashes: the fields a processor
// computing the call's new state would have read (on a stream of new records: the call's ids and
// what the call changes), those it set (field, value, ...) and those it deleted. key is the hash's
// key after the store's prefix.
type hashWrite struct {
	key  string
	read []string
	set  []any
	del  []string
	// before is the hash as the call found it: the state hash whole, layout 10's record hash at
	// the call's record fields (nil for layout 11's packed store).
	before map[string]string
	// records are the call's records, in the order of read (layout 10's record hash only).
	records []string
}

// appendWrites appends w's pairs, then its deleted fields, to args.
func appendWrites(args []any, w hashWrite) []any {
	args = append(args, w.set...)
	for _, f := range w.del {
		args = append(args, f)
	}
	return args
}

// storeIfVersionScript is the one script a processor that computed each call's new state itself
// would still need: it refuses the call unless the aggregate's version is the one the state was
// computed from (another processor wrote meanwhile), then stores the writes and refreshes the TTLs.
// KEYS: the hashes, the state hash first; ARGV: the version read, the TTL in ms, then per key its
// number of pairs, its number of deletions, the pairs and the deleted fields.
const storeIfVersionScript = `
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

// storeIfUnchangedScript checks, instead of a version, that every field the state was computed from
// still holds what was read (or is still absent), which stops a stale write whatever wrote
// meanwhile, a processor of an older release included. All checks come before the first write, so
// a refused call writes nothing. KEYS: the hashes; ARGV: the TTL in ms, then per key the number of
// fields read, of pairs and of deletions, a string with a byte per field read ('1' present, '0'
// absent), the fields read, what they held (empty when absent), the pairs and the deleted fields.
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

// storeCostRig is what the steps of TestRedisCostOfStateComputedInProcessor share.
type storeCostRig struct {
	t    *testing.T
	ctx  context.Context
	rdb  *redis.Client
	aggs int
	ret  time.Duration
	// now is every batch's observation time. Fixed, so an aggregate's window sums stay cached
	// after its first call: the minute's and the hour's turns are not measured.
	now time.Time
}

// batches returns total observations over the rig's aggregates, in batches of per a call, ids made
// from id, occurred at occ(i): all of new opportunities, or with mixed, from the second batch on, 20 %
// duplicates of the previous batch's observations and 10 % reassessments of them (assessed a
// second later, in the next class), as the bench's today shape has.
func (r *storeCostRig) batches(total, per int, id string, mixed bool, occ func(i int) int64) [][]Observation {
	var out [][]Observation
	all := make([]Observation, 0, total)
	obs := make([]Observation, 0, per*r.aggs)
	for i := 0; i < total; i++ {
		o := occ(i)
		ob := Observation{Key: costKey(i % r.aggs), OpportunityID: fmt.Sprintf("%s-%07d", id, i), Class: Class(1 + i%3), Occurred: o, Assessed: o + 1e6}
		// Which of ten kinds: by the observation's index and its aggregate's, so a call mixes them.
		kind := (i/r.aggs + i) % 10
		if earlier := i - per*r.aggs; mixed && earlier >= 0 && kind < 3 { // the same aggregate, a batch before
			ob = all[earlier]
			if kind == 2 {
				ob.Assessed += 1e6
				ob.Class = 1 + ob.Class%3
			}
		}
		all = append(all, ob)
		obs = append(obs, ob)
		if len(obs) == cap(obs) || i == total-1 {
			out = append(out, obs)
			obs = make([]Observation, 0, per*r.aggs)
		}
	}
	return out
}

func (r *storeCostRig) apply(s *Redis, bs [][]Observation) {
	for _, b := range bs {
		if _, err := s.Apply(r.ctx, b, r.now); err != nil {
			r.t.Fatal(err)
		}
	}
}

// opened returns a store on a fresh prefix whose aggregates hold fill records each, occurred over
// the last day.
func (r *storeCostRig) opened(layout Layout, fill int) (*Redis, string) {
	prefix := fmt.Sprintf("storecost-%d", time.Now().UnixNano())
	s := costStore(r.t, r.rdb, layout, prefix, r.ret)
	if fill > 0 {
		span := 86400e6 / int64(fill*r.aggs+1)
		r.apply(s, r.batches(fill*r.aggs, 20, "pre", false, func(i int) int64 { return Micros(r.now) - 60e6 - int64(i)*span }))
	}
	return s, prefix
}

// recordHashTables makes the layout-10 record hashes not made yet hash tables, as the script makes
// a new aggregate's (a listpack scans itself on every lookup): a field longer than
// hash-max-listpack-value converts the hash, and a second field keeps it once that one is deleted.
func (r *storeCostRig) recordHashTables(s *Redis) {
	for i := 0; i < r.aggs; i++ {
		o := s.keys(costKey(i))[recordHash]
		n, err := r.rdb.Exists(r.ctx, o).Result()
		if err != nil {
			r.t.Fatal(err)
		}
		if n == 0 {
			long := strings.Repeat("x", 100)
			if err := r.rdb.HSet(r.ctx, o, long, "", "kept", "").Err(); err != nil {
				r.t.Fatal(err)
			}
			if err := r.rdb.HDel(r.ctx, o, long).Err(); err != nil {
				r.t.Fatal(err)
			}
		}
	}
}

func (r *storeCostRig) hgetall(key string) map[string]string {
	m, err := r.rdb.HGetAll(r.ctx, key).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// record runs bs through the script on a store filled with fill records an aggregate, and returns
// per batch and call what the call wrote: the state hash first (storeIfVersionScript checks its
// v), found by reading the aggregate's hashes before and after every batch.
func (r *storeCostRig) record(layout Layout, fill int, bs [][]Observation) [][][]hashWrite {
	s, prefix := r.opened(layout, fill)
	defer deleteUnder(r.ctx, r.rdb, prefix)
	hashes := []int{stateHash} // read whole
	if layout == Layout11 {
		hashes = append(hashes, packedStore)
	}
	var out [][][]hashWrite
	for _, b := range bs {
		byKey, order := groupByKey(b)
		before := make([][]map[string]string, len(order))
		records := make([]hashWrite, len(order)) // layout 10's record hash, before the call
		for i, k := range order {
			for _, h := range hashes {
				before[i] = append(before[i], r.hgetall(s.keys(k)[h]))
			}
			if layout == Layout10 {
				records[i] = r.recordsOf(s, prefix, k, b, byKey[k])
			}
		}
		if _, err := s.Apply(r.ctx, b, r.now); err != nil {
			r.t.Fatal(err)
		}
		calls := make([][]hashWrite, len(order))
		for i, k := range order {
			keys := s.keys(k)
			var ws []hashWrite
			for j, h := range hashes {
				w := hashWrite{key: strings.TrimPrefix(keys[h], prefix)}
				if h == stateHash {
					w.read, w.before = []string{"H", "v"}, before[i][j]
				}
				after := r.hgetall(keys[h])
				for f, v := range after {
					if old, ok := before[i][j][f]; !ok || old != v {
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
				w := records[i]
				after, err := r.rdb.HMGet(r.ctx, keys[recordHash], w.read...).Result()
				if err != nil {
					r.t.Fatal(err)
				}
				for j, v := range after {
					if v == nil {
						r.t.Fatalf("record %s was not written", w.read[j])
					}
					if old, ok := w.before[w.read[j]]; !ok || old != v {
						w.set = append(w.set, w.read[j], v)
					}
				}
				ws = append(ws, w)
			}
			calls[i] = ws
		}
		out = append(out, calls)
	}
	return out
}

// recordsOf returns the record hash of aggregate k of store s as the call of observations b[at]
// finds it: its key after prefix, the call's record fields (read), those already held (before)
// and the call's records.
func (r *storeCostRig) recordsOf(s *Redis, prefix string, k Key, b []Observation, at []int) hashWrite {
	obs := make([]Observation, 0, len(at))
	for _, o := range at {
		obs = append(obs, b[o])
	}
	fields, err := recordFields(obs)
	if err != nil {
		r.t.Fatal(err)
	}
	key := s.keys(k)[recordHash]
	held, err := r.rdb.HMGet(r.ctx, key, fields...).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	w := hashWrite{key: strings.TrimPrefix(key, prefix), read: fields, before: map[string]string{}, records: encodeRecords(obs)}
	for j, v := range held {
		if v, ok := v.(string); ok {
			w.before[fields[j]] = v
		}
	}
	return w
}

// read reads what every call read, in one pipeline: a reply per hash with fields to read (nil for
// one without).
func (r *storeCostRig) read(prefix string, calls [][]hashWrite) [][]*redis.SliceCmd {
	p := r.rdb.Pipeline()
	out := make([][]*redis.SliceCmd, len(calls))
	for i, ws := range calls {
		out[i] = make([]*redis.SliceCmd, len(ws))
		for j, w := range ws {
			if len(w.read) > 0 {
				out[i][j] = p.HMGet(r.ctx, prefix+w.key, w.read...)
			}
		}
	}
	if _, err := p.Exec(r.ctx); err != nil {
		r.t.Fatal(err)
	}
	return out
}

// store sends each call's writes to the script sha in one pipeline, with the arguments args makes,
// and fails unless the script stored every call.
func (r *storeCostRig) store(sha, prefix string, calls [][]hashWrite, args func(i int) []any) {
	p := r.rdb.Pipeline()
	for i, ws := range calls {
		keys := make([]string, len(ws))
		for j, w := range ws {
			keys[j] = prefix + w.key
		}
		p.EvalSha(r.ctx, sha, keys, args(i)...)
	}
	cmds, err := p.Exec(r.ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, c := range cmds {
		if n, _ := c.(*redis.Cmd).Int(); n != 1 {
			r.t.Fatalf("the store script refused a call: %v", c)
		}
	}
}

func (r *storeCostRig) loaded(script string) string {
	sha, err := r.rdb.ScriptLoad(r.ctx, script).Result()
	if err != nil {
		r.t.Fatal(err)
	}
	return sha
}

// storeWay is one way of applying the measured batches: run is timed, on a store that prepare (when
// set) readied untimed.
type storeWay struct {
	name    string
	prepare func(s *Redis)
	run     func(s *Redis, prefix string, bs [][]Observation, rec [][][]hashWrite)
}

func (r *storeCostRig) ways() []storeWay {
	version, unchanged := r.loaded(storeIfVersionScript), r.loaded(storeIfUnchangedScript)
	ttl := int64(r.ret / time.Millisecond)
	return []storeWay{
		{name: "script", run: func(s *Redis, _ string, bs [][]Observation, _ [][][]hashWrite) { r.apply(s, bs) }},
		{name: "read + store", prepare: r.recordHashTables, run: func(_ *Redis, prefix string, _ [][]Observation, rec [][][]hashWrite) {
			for _, calls := range rec {
				got := r.read(prefix, calls)
				r.store(version, prefix, calls, func(i int) []any {
					v, _ := got[i][0].Val()[1].(string) // the state hash's second field read
					args := []any{v, ttl}
					for _, w := range calls[i] {
						args = appendWrites(append(args, len(w.set)/2, len(w.del)), w)
					}
					return args
				})
			}
		}},
		{name: "read + store if unchanged", prepare: r.recordHashTables, run: func(_ *Redis, prefix string, _ [][]Observation, rec [][][]hashWrite) {
			for _, calls := range rec {
				got := r.read(prefix, calls)
				r.store(unchanged, prefix, calls, func(i int) []any {
					args := []any{ttl}
					for j, w := range calls[i] {
						var vals []any
						if got[i][j] != nil {
							vals = got[i][j].Val()
						}
						has := make([]byte, len(vals))
						args = append(args, len(vals), len(w.set)/2, len(w.del), "")
						hasAt := len(args) - 1
						for _, f := range w.read {
							args = append(args, f)
						}
						for k, v := range vals {
							s, ok := v.(string)
							has[k] = '0'
							if ok {
								has[k] = '1'
							}
							args = append(args, s)
						}
						args[hasAt] = string(has)
						args = appendWrites(args, w)
					}
					return args
				})
			}
		}},
		{name: "WATCH + MULTI", prepare: r.recordHashTables, run: func(_ *Redis, prefix string, _ [][]Observation, rec [][][]hashWrite) {
			for _, calls := range rec {
				var watched []string
				for _, ws := range calls {
					watched = append(watched, prefix+ws[0].key)
				}
				err := r.rdb.Watch(r.ctx, func(tx *redis.Tx) error {
					if _, err := tx.Pipelined(r.ctx, func(p redis.Pipeliner) error {
						for _, ws := range calls {
							for _, w := range ws {
								if len(w.read) > 0 {
									p.HMGet(r.ctx, prefix+w.key, w.read...)
								}
							}
						}
						return nil
					}); err != nil {
						return err
					}
					_, err := tx.TxPipelined(r.ctx, func(p redis.Pipeliner) error {
						for _, ws := range calls {
							for _, w := range ws {
								if len(w.set) > 0 {
									p.HSet(r.ctx, prefix+w.key, w.set...)
								}
								if len(w.del) > 0 {
									p.HDel(r.ctx, prefix+w.key, w.del...)
								}
								p.PExpire(r.ctx, prefix+w.key, r.ret)
							}
						}
						return nil
					})
					return err
				}, watched...)
				if err != nil {
					r.t.Fatal(err)
				}
			}
		}},
	}
}

// computeInGo runs the processor's computation (computeRecorded) on every layout-10 call recorded in rec, fails the test unless
// each call it computes sets exactly what the script set, and returns how many calls it computed
// of how many, and its CPU µs per computed call (the state parsed from the strings a read returns,
// as a processor would get them).
func (r *storeCostRig) computeInGo(rec [][][]hashWrite) (computed, calls int, us float64) {
	type call struct {
		state, held  map[string]string
		fields, recs []string
	}
	var todo []call
	at, ret, ttl := Micros(r.now), int64(r.ret/time.Microsecond), int64(r.ret/time.Millisecond)
	for _, batch := range rec {
		for _, ws := range batch {
			calls++
			st, records := ws[0], ws[len(ws)-1]
			c := call{state: st.before, held: records.before, fields: records.read, recs: records.records}
			got, ok := computeRecorded(c.state, c.held, c.fields, c.recs, at, ret, ttl)
			if !ok {
				continue
			}
			want := map[string]string{}
			for i := 0; i < len(st.set); i += 2 {
				want[st.set[i].(string)] = st.set[i+1].(string)
			}
			if len(st.del) > 0 || !maps.Equal(got, want) {
				r.t.Fatalf("computed in Go: %q, the script set %q and deleted %q", got, want, st.del)
			}
			todo = append(todo, c)
		}
	}
	if len(todo) == 0 {
		return 0, calls, 0
	}
	const reps = 20
	began := testenv.OwnCPU(r.t)
	for range reps {
		for _, c := range todo {
			computeRecorded(c.state, c.held, c.fields, c.recs, at, ret, ttl)
		}
	}
	return len(todo), calls, (testenv.OwnCPU(r.t) - began).Seconds() * 1e6 / float64(reps*len(todo))
}

// TestRedisCostOfStateComputedInProcessor projects what Redis would spend per call and per record
// if the processor computed each call's new state (the work apply.lua does in Lua) and Redis only
// read and stored it, against the script today, on the Redis REPEATRATE_APPLY_MEMORY_REDIS names
// (nothing else may use it meanwhile):
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestRedisCostOfStateComputedInProcessor -v ./aggregator
//
// The workload has TestRedisCostPerCallAndPerRecord's shape: 100 aggregates, 96 000 new
// opportunities occurred within the last 30 s in calls of 5 and of 80, on empty aggregates and on
// aggregates holding 2 000 records, in layouts 10 and 11; and in layout 10 with 2 000 held, the
// today shape's mix (20 % duplicates, 10 % reassessments). The script runs it first on a prefix of
// its own, and every call's writes are recorded by reading the aggregate's state before and after
// each batch. The script and three ways of storing those same writes are then timed in turn, each
// on a fresh prefix filled the same way, in the reverse order in the second round:
//   - "read + store": one pipeline reads, for every call, the records of its ids (layout 10) and
//     the state fields and buckets it changes, then a second pipeline sends each call's writes to
//     storeIfVersionScript;
//   - "read + store if unchanged": the same, with storeIfUnchangedScript, which checks every field
//     read instead of a version;
//   - "WATCH + MULTI": the same reads and writes as plain commands in one optimistic transaction
//     per batch, no Lua at all (a single Redis only: in a cluster a transaction holds one slot).
//
// It logs Redis's CPU per call, and for the script the time Redis gave the script calls and the
// commands they issued (INFO commandstats), and this process's CPU per call: for the script,
// encoding the batch and its pipeline; for the other ways, their pipelines with the arguments built
// beforehand. In layout 10 it also times the processor's computation (computed.go) on the calls it
// computes, which must set exactly what the script set.
//
// What it leaves out: the computation in layout 11 and of a reassessment; what the streams do not
// do (a reassessment into another hour or index group, a move that makes an hour's bounds exact,
// garbage collection), whose reads of fields they do not change the replay would miss; the
// minute's and hour's turns of the window sums; layout 11's read of the head before its buckets (a
// round trip, not Redis CPU); the index's sorted set (its ZADDs and TTL); and what a refused check
// costs (a read and a compute again).
func TestRedisCostOfStateComputedInProcessor(t *testing.T) {
	r := &storeCostRig{t: t, ctx: context.Background(), rdb: redisOfItsOwn(t), aggs: 100, ret: 30 * 24 * time.Hour, now: time.Now()}
	const measured, filled = 96_000, 2_000 // whole batches at both call sizes
	ways := r.ways()
	for round := 0; round < 2; round++ {
		for _, run := range []struct {
			layout Layout
			fill   int
			mixed  bool
		}{{Layout10, 0, false}, {Layout10, filled, false}, {Layout10, filled, true}, {Layout11, 0, false}, {Layout11, filled, false}} {
			layout, fill := run.layout, run.fill
			stream := "new records"
			if run.mixed {
				stream = "20 % duplicates, 10 % reassessed"
			}
			perRecord := map[string][2]float64{}
			for c, per := range []int{5, 80} {
				bs := r.batches(measured, per, "new", run.mixed, func(i int) int64 { return Micros(r.now) - int64(i%30)*1e6 })
				rec := r.record(layout, fill, bs)
				if layout == Layout10 {
					computed, calls, us := r.computeInGo(rec)
					t.Logf("round %d, layout %d, %d records an aggregate before, %s, calls of %d: computed in Go as the script wrote them, %d calls of %d, %.2f µs of CPU a call",
						round, layout, fill, stream, per, computed, calls, us)
				}
				calls := float64(measured) / float64(per)
				var line, client []string
				for k := range ways {
					way := ways[k]
					if round%2 == 1 {
						way = ways[len(ways)-1-k]
					}
					s, prefix := r.opened(layout, fill)
					if way.prepare != nil {
						way.prepare(s)
					}
					before, err := readCost(r.ctx, r.rdb)
					if err != nil {
						t.Fatal(err)
					}
					own := testenv.OwnCPU(t)
					way.run(s, prefix, bs, rec)
					own = testenv.OwnCPU(t) - own
					after, err := readCost(r.ctx, r.rdb)
					if err != nil {
						t.Fatal(err)
					}
					deleteUnder(r.ctx, r.rdb, prefix)
					us := (after.cpu - before.cpu) * 1e6 / measured
					pr := perRecord[way.name]
					pr[c] = us
					perRecord[way.name] = pr
					line = append(line, fmt.Sprintf("%s %.1f", way.name, us*float64(per)))
					client = append(client, fmt.Sprintf("%s %.1f", way.name, own.Seconds()*1e6/calls))
					if way.name == "script" {
						var d redisCost
						d.calls, d.usec = map[string]int64{}, map[string]int64{}
						d.add(before, after)
						inner := int64(0)
						for cmd, us := range d.usec {
							if cmd != "evalsha" {
								inner += us
							}
						}
						t.Logf("round %d, layout %d, %d records an aggregate before, %s, calls of %d: the script calls took %.1f µs a call by INFO commandstats, %.1f of them in the commands they issued",
							round, layout, fill, stream, per, float64(d.usec["evalsha"])/calls, float64(inner)/calls)
					}
				}
				t.Logf("round %d, layout %d, %d records an aggregate before, %s, calls of %d: Redis µs a call: %s", round, layout, fill, stream, per, strings.Join(line, ", "))
				t.Logf("round %d, layout %d, %d records an aggregate before, %s, calls of %d: this process's µs a call: %s", round, layout, fill, stream, per, strings.Join(client, ", "))
			}
			for _, way := range ways {
				c5, c80 := perRecord[way.name][0], perRecord[way.name][1]
				f := (c5 - c80) / (1.0/5 - 1.0/80)
				t.Logf("round %d, layout %d, %d records an aggregate before, %s, %s: F %.1f µs a call, R %.2f µs a record, a call of 10: %.1f µs", round, layout, fill, stream, way.name, f, c80-f/80, f+10*(c80-f/80))
			}
		}
	}
}

// computeRecorded runs the processor's computation (planRead, computeCall) on a recorded call,
// given the state hash and the records held at the call's record fields as the call found them, and
// returns the state fields it sets that differ from what they held, or false for a call off its
// path.
func computeRecorded(state, held map[string]string, fields, recs []string, at, ret, ttl int64) (map[string]string, bool) {
	fs, rs := make([]any, len(fields)), make([]any, len(recs))
	class, occs := make([]int8, len(recs)), make([]int64, len(recs))
	for i := range fields {
		fs[i], rs[i] = fields[i], recs[i]
		cls, occ, _, _, _, err := retainedRecord(recs[i])
		if err != nil {
			return nil, false
		}
		class[i], occs[i] = int8(strings.IndexByte("CPU", cls)), occ
	}
	plan, ok := planRead(fs, class, occs, groupSpan(ret), at, false, -1)
	if !ok {
		return nil, false
	}
	st := make([]any, len(plan.state))
	for i, name := range plan.state {
		if v, ok := state[name.(string)]; ok {
			st[i] = v
		}
	}
	hd := make([]any, len(fields))
	for i, f := range fields {
		if v, ok := held[f]; ok {
			hd[i] = v
		}
	}
	cc, ok := computeCall(plan, st, hd, rs, ret, at, ttl, nil)
	if !ok {
		return nil, false
	}
	sets := map[string]string{}
	for i := 0; i < len(cc.state); i += 2 {
		if f, v := cc.state[i].(string), cc.state[i+1].(string); state[f] != v {
			sets[f] = v
		}
	}
	return sets, true
}
