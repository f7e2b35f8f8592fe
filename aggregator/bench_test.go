package aggregator

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// go test -run '^$' -bench ApplyBatch -benchmem ./aggregator   (needs the test Redis)
//
// Batches of 2 000 new opportunities (REPEATRATE_BENCH_BATCH to change) over 100 aggregates
// (REPEATRATE_BENCH_AGGREGATES: 400 gives, with batches of 2 000, the 5 records a call of make
// bench's half load, and batches stored in chunks), applied
// by apply.lua alone and with the processor computing the calls it can (RedisConfig.ComputeCalls),
// in one run. REPEATRATE_BENCH_PREFILL=n first gives each aggregate n records, occurred over the
// day before, untimed: what a call costs in aggregates with history (docs/performance.md, "The
// fourteenth slice", runs it over sizes). REPEATRATE_BENCH_NO_BUCKET_CACHE, set, has layout 11
// read every bucket a call needs, as a processor whose cache misses does.
func BenchmarkApplyBatch(b *testing.B) {
	for _, layout11 := range []bool{false, true} {
		for _, compute := range []bool{false, true} {
			name := "script"
			if compute {
				name = "computed"
			}
			if layout11 {
				name += ", layout 11"
			}
			b.Run(name, func(b *testing.B) { benchmarkApplyBatch(b, compute, layout11) })
		}
	}
}

func benchmarkApplyBatch(b *testing.B, compute, layout11 bool) {
	ctx := context.Background()
	cfg := RedisConfig{Retention: 30 * 24 * time.Hour, ComputeCalls: compute}
	if layout11 {
		cfg.Fingerprint = testFingerprinter(b)
	}
	store, client := testStore(b, "bench", cfg)
	if os.Getenv("REPEATRATE_BENCH_NO_BUCKET_CACHE") != "" {
		store.buckets.max = 1 // past it at once: every aggregate's buckets are forgotten when kept
	}
	batch := positiveEnv("REPEATRATE_BENCH_BATCH", 2000)
	r := rand.New(rand.NewPCG(1, 2))
	var keys []Key
	for i := range positiveEnv("REPEATRATE_BENCH_AGGREGATES", 100) {
		k := keyLive
		k.CorrectionID = fmt.Sprint("fix-", i)
		keys = append(keys, k)
	}
	obs := make([]Observation, batch)
	if n := positiveEnv("REPEATRATE_BENCH_PREFILL", 0); n > 0 {
		// n records an aggregate, occurred over the day before they are observed, from a source
		// of their own, so that the timed batches are those of a run without them.
		pr := rand.New(rand.NewPCG(3, 4))
		day, seen := int64(24*time.Hour/time.Microsecond), t0.Add(-time.Minute)
		for done := 0; done < n*len(keys); done += batch {
			m := min(batch, n*len(keys)-done)
			for j := range obs[:m] {
				occ := Micros(seen) - day + pr.Int64N(day)
				obs[j] = Observation{Key: keys[(done+j)%len(keys)], OpportunityID: fmt.Sprint("p", done+j), Class: Class(1 + pr.IntN(3)), Occurred: occ, Assessed: occ}
			}
			if _, err := store.Apply(ctx, obs[:m], seen); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC() // the prefill's garbage, before the timer
	}
	// calls returns how many calls the processor computed and the store wrote, and how many in all.
	calls := func() (stored, all int64) {
		stored, refused := store.ComputedCalls()
		offPath, unread := store.ComputedCallsLeft()
		return stored, stored + refused + offPath + unread
	}
	stored0, all0 := calls()
	cost0, _ := readCost(ctx, client)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for j := range obs {
			occ := Micros(t0) + int64(i*batch+j)*1000
			obs[j] = Observation{Key: keys[r.IntN(len(keys))], OpportunityID: fmt.Sprint("o", i*batch+j), Class: Class(1 + r.IntN(3)), Occurred: occ, Assessed: occ}
		}
		b.StartTimer()
		// Observed once the batch's last event has occurred.
		if _, err := store.Apply(ctx, obs, t0.Add(time.Duration((i+1)*batch)*time.Millisecond)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "events/s")
	// What went over the wire, both ways: a call's bytes are Redis's cost that grows with them
	// (its Lua hashes every string it makes). Server-wide, so the shared test Redis's other
	// clients would count too.
	cost1, _ := readCost(ctx, client)
	b.ReportMetric((cost1.cpu-cost0.cpu)*1e6/float64(b.N*batch), "redis-cpu-µs/event")
	b.ReportMetric((cost1.in-cost0.in)/float64(b.N*batch), "redis-in-B/event")
	b.ReportMetric((cost1.out-cost0.out)/float64(b.N*batch), "redis-out-B/event")
	// Where Redis's time went, by command (INFO commandstats: time inside the command, not CPU; a
	// script's time holds the commands it calls, so the three are not to be summed): records
	// stored in larger aggregates can cost more a command, the same commands.
	for _, c := range []string{"evalsha", "hset", "hmget"} {
		b.ReportMetric(float64(cost1.usec[c]-cost0.usec[c])/float64(b.N*batch), "redis-"+c+"-µs/event")
	}
	if compute {
		// The share of the timed calls the processor computed and the store wrote.
		stored, all := calls()
		b.ReportMetric(float64(stored-stored0)/float64(max(all-all0, 1)), "computed/call")
	}
}

// positiveEnv is the positive integer the environment variable name holds, or def.
func positiveEnv(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func BenchmarkModelApplyBatch(b *testing.B) {
	m := NewModel(30 * 24 * time.Hour)
	obs := make([]Observation, 2000)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for j := range obs {
			occ := Micros(t0) + int64(i*2000+j)*1000
			obs[j] = Observation{Key: keyLive, OpportunityID: fmt.Sprint("o", (i*2000+j)%50000), Class: Passed, Occurred: occ, Assessed: occ}
		}
		m.ApplyBatch(obs)
	}
}

// usedMemory is Redis's used_memory after MEMORY PURGE (jemalloc's dirty pages returned).
func usedMemory(ctx context.Context, rdb *redis.Client) float64 {
	rdb.Do(ctx, "MEMORY", "PURGE")
	s, _ := rdb.Info(ctx, "memory").Result()
	for _, l := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// redisOfItsOwn returns a client of the Redis REPEATRATE_APPLY_MEMORY_REDIS names, for the
// measurements that read its memory or CPU (nothing else may use it meanwhile), or skips.
func redisOfItsOwn(t *testing.T) *redis.Client {
	addr := os.Getenv("REPEATRATE_APPLY_MEMORY_REDIS")
	if addr == "" {
		t.Skip("set REPEATRATE_APPLY_MEMORY_REDIS to a Redis of its own")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// costStore opens a store of layout under prefix, layout 11's with the tests' fingerprinter.
func costStore(t *testing.T, rdb *redis.Client, layout Layout, prefix string, ret time.Duration) *Redis {
	cfg := RedisConfig{Prefix: prefix, Retention: ret}
	if layout == Layout11 {
		cfg.Fingerprint = testFingerprinter(t)
	}
	s, err := NewRedis(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// deleteUnder deletes every key under prefix with DEL, not UNLINK, so that the next measurement
// starts once Redis has freed what this one held.
func deleteUnder(ctx context.Context, rdb *redis.Client, prefix string) {
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 1000 {
			rdb.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}

// TestRedisBytesPerOpportunity measures what make bench reports as redis_bytes_per_opportunity
// (used_memory growth over 500 000 distinct opportunities in 100 aggregates, occurred over a day),
// and the same occurred over 30 days (7 opportunities per aggregate and hour), for the current store,
// the layout-4 script and layout 11 (a store with a fingerprinter), with Redis's CPU per opportunity applied (in
// batches of 2 000, 20 per script call), on the Redis REPEATRATE_APPLY_MEMORY_REDIS names; nothing
// else may use that Redis meanwhile (REPEATRATE_APPLY_MEMORY_RUNS="current/1,layout 11/30" runs
// only those layouts and spans in days):
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestRedisBytesPerOpportunity -v ./aggregator
func TestRedisBytesPerOpportunity(t *testing.T) {
	rdb := redisOfItsOwn(t)
	ctx := context.Background()
	used := func() float64 { return usedMemory(ctx, rdb) }
	const total, ret = 500_000, 30 * 24 * time.Hour
	old := redis.NewScript(layout4Source)
	if err := old.Load(ctx, rdb).Err(); err != nil { // applyLayout4 pipelines EVALSHA alone
		t.Fatal(err)
	}
	for _, run := range []struct {
		layout string
		span   int64 // seconds
	}{{"current", 86400}, {"layout 4", 86400}, {"layout 11", 86400}, {"current", 30 * 86400}, {"layout 4", 30 * 86400}, {"layout 11", 30 * 86400}} {
		layout := run.layout
		if only := os.Getenv("REPEATRATE_APPLY_MEMORY_RUNS"); only != "" && !slices.Contains(strings.Split(only, ","), fmt.Sprintf("%s/%d", layout, run.span/86400)) {
			continue
		}
		prefix := fmt.Sprintf("membench-%d", time.Now().UnixNano())
		cfg := RedisConfig{Prefix: prefix, Retention: ret}
		if layout == "layout 11" {
			cfg.Fingerprint = testFingerprinter(t)
		}
		store, err := NewRedis(rdb, cfg)
		if err != nil {
			t.Fatal(err)
		}
		before := used()
		cost0, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		obs := make([]Observation, 0, 2000)
		var obs0 Observation
		for i := 0; i < total; i++ {
			occ := Micros(now) - int64(i)*run.span/total*1e6
			k := costKey(i % 100)
			obs = append(obs, Observation{Key: k, OpportunityID: fmt.Sprintf("conv-%07d/turn-%d", i/3, i%3),
				Class: Class(1 + i%3), Occurred: occ, Assessed: occ + 1e6})
			obs0 = obs[0]
			if len(obs) == cap(obs) {
				if layout != "layout 4" {
					_, err = store.Apply(ctx, obs, now)
				} else {
					_, err = applyLayout4(ctx, rdb, old, prefix, ret, ret, obs, now)
				}
				if err != nil {
					t.Fatal(err)
				}
				obs = obs[:0]
			}
		}
		recordKey := recordHash
		if layout == "layout 11" {
			recordKey = packedStore
		}
		cost1, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		after := used()
		// What the script's own commands took (Redis times a script's commands apart), against
		// the script calls in all: the rest is the script's Lua and its conversions.
		per := func(cmd string) float64 { return float64(cost1.usec[cmd]-cost0.usec[cmd]) / total }
		t.Logf("%s, occurred over %d days: %.1f bytes per retained opportunity (used_memory %.0f → %.0f, %d record or bucket fields in fix-0), %.1f µs of Redis CPU per opportunity applied (evalsha %.2f, of which hmget %.2f, hset %.2f, hdel %.2f)",
			layout, run.span/86400, (after-before)/total, before, after,
			rdb.HLen(ctx, store.keys(obs0.Key)[recordKey]).Val(), (cost1.cpu-cost0.cpu)*1e6/total,
			per("evalsha"), per("hmget"), per("hset"), per("hdel"))
		deleteUnder(ctx, rdb, prefix)
	}
}

// TestRedisCostPerCallAndPerRecord splits Redis's CPU for applying new opportunities into what a
// script call costs whatever it carries (F) and what each new record adds (R), for layouts 10 and
// 11, on the Redis REPEATRATE_APPLY_MEMORY_REDIS names (nothing else may use it meanwhile): 100
// aggregates take 100 000 new opportunities, occurred within the last 30 s, in calls of 5 and of
// 80 (a batch's share of an aggregate at light and at full load), on empty aggregates and on
// aggregates already holding 2 000 records occurred over the last day; F and R solve
// cost per record = F / (records per call) + R from the two. The layouts alternate, two rounds:
//
//	REPEATRATE_APPLY_MEMORY_REDIS=127.0.0.1:16479 go test -count=1 -run TestRedisCostPerCallAndPerRecord -v ./aggregator
func TestRedisCostPerCallAndPerRecord(t *testing.T) {
	rdb := redisOfItsOwn(t)
	ctx := context.Background()
	const aggs, measured, filled, ret = 100, 100_000, 2_000, 30 * 24 * time.Hour
	// usPerRecord applies the measured opportunities in calls of per records, after fill records
	// per aggregate, and returns Redis's CPU µs per measured record.
	usPerRecord := func(layout Layout, per, fill int) float64 {
		prefix := fmt.Sprintf("costsplit-%d", time.Now().UnixNano())
		store := costStore(t, rdb, layout, prefix, ret)
		defer deleteUnder(ctx, rdb, prefix)
		now := time.Now()
		apply := func(total, batch int, id string, occ func(i int) int64) {
			obs := make([]Observation, 0, batch)
			for i := 0; i < total; i++ {
				o := occ(i)
				obs = append(obs, Observation{Key: costKey(i % aggs), OpportunityID: fmt.Sprintf("%s-%07d", id, i), Class: Class(1 + i%3), Occurred: o, Assessed: o + 1e6})
				if len(obs) == cap(obs) || i == total-1 {
					if _, err := store.Apply(ctx, obs, now); err != nil {
						t.Fatal(err)
					}
					obs = obs[:0]
				}
			}
		}
		apply(fill*aggs, 20*aggs, "pre", func(i int) int64 { return Micros(now) - 60e6 - int64(i)*(86400e6/int64(fill*aggs+1)) })
		before, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		apply(measured, per*aggs, "conv", func(i int) int64 { return Micros(now) - int64(i%30)*1e6 })
		after, err := readCost(ctx, rdb)
		if err != nil {
			t.Fatal(err)
		}
		return (after.cpu - before.cpu) * 1e6 / measured
	}
	for round := 0; round < 2; round++ {
		for _, fill := range []int{0, filled} {
			for _, layout := range []Layout{Layout10, Layout11} {
				c5, c80 := usPerRecord(layout, 5, fill), usPerRecord(layout, 80, fill)
				f := (c5 - c80) / (1.0/5 - 1.0/80)
				t.Logf("round %d, layout %d, %d records an aggregate before: %.2f µs per record in calls of 5, %.2f in calls of 80: F %.1f µs a call, R %.2f µs a record",
					round, layout, fill, c5, c80, f, c80-f/80)
			}
		}
	}
}
