package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"math/rand/v2"
)

// Prefilled store (BENCH_PREFILL=<opportunities>): the today stream (BENCH_EVENTS events, 400
// aggregates) on an empty store, then on one that already retains that many opportunities over
// 10 000 live aggregates — among them the today stream's 200 live ones, each then holding
// total/10 000, occurred over the last 24 hours — and on an empty store again. Cost per event must
// not depend on history: events/s and Redis CPU per event, prefilled ÷ empty (the mean of the two
// empty runs, which bracket it). Redis without AOF, so that no rewrite of the prefilled state
// lands in a measured run. The prefill is processed by the same binary, written aggregate by
// aggregate so that it takes minutes, not hours: spread over 10 000 aggregates, a batch holds one
// or two events of each, and each costs a script call of its own.
const (
	prefillAggregates  = 10_000 // 50 workspaces × 2 models × 100 corrections, live
	prefillCorrections = 100
	prefillSpread      = 24 * time.Hour
)

// prefillLine is the j-th prefilled opportunity of aggregate a, named as the today shape's
// generator names its scopes (internal/synth), occurred within prefillSpread before now.
func prefillLine(r *rand.Rand, a, j int, now time.Time) []byte {
	occ := now.Add(-time.Duration(r.Int64N(int64(prefillSpread))))
	outcome := "passed"
	switch q := r.Float64(); {
	case q < 0.1:
		outcome = "unscored"
	case q < 0.28:
		outcome = "confirmed_repeat"
	}
	reason := ""
	if outcome == "unscored" {
		reason = `,"unscored_reason":"grader_error"`
	}
	ws := fmt.Sprintf("ws-%d", a/(2*prefillCorrections))
	model := []string{"m:large", "m|small"}[(a/prefillCorrections)%2]
	return fmt.Appendf(nil, `{"specversion":"1.0","id":"pre-%d-%d","source":"synth/%s","type":"repeatrate.live.attempt.v1","time":%q,"datacontenttype":"application/json","data":{"scope":{"workspace":%q,"model":%q,"run":"run-1","checkpoint":"ckpt-7","artifact":"prod"},"correction_id":"fix-%d","opportunity_id":"pre-%d-%d","occurred_at":%q,"assessed_at":%q,"outcome":%q%s}}`,
		a, j, ws, occ.Add(time.Second).UTC().Format(time.RFC3339Nano), ws, model, a%prefillCorrections, a, j,
		occ.UTC().Format(time.RFC3339Nano), occ.Add(time.Second).UTC().Format(time.RFC3339Nano), outcome, reason)
}

func (e *env) prefillMode(ctx context.Context) error {
	total, err := atLeast("BENCH_PREFILL", "10000000", 1000)
	if err != nil {
		return err
	}
	defer e.deleteTopics(ctx)
	e.kafkaPID, _ = kafkaBrokerPID(e.brokers[0])
	logf("machine: %s", machine())
	logf("prefill: %d opportunities over %d aggregates, then %d events of the today shape", total, prefillAggregates, e.n)
	measured, err := e.todayInput("dup20", 0.2)
	if err != nil {
		return err
	}
	per := max(1, total/prefillAggregates)
	total = per * prefillAggregates
	r := rand.New(rand.NewPCG(41, 42))
	now, a, j := time.Now(), 0, 0
	fill, err := e.input(shapeToday, "prefill", func() ([]byte, bool) {
		if a == prefillAggregates {
			return nil, false
		}
		l := prefillLine(r, a, j, now)
		if j++; j == per {
			a, j = a+1, 0
		}
		return l, true
	})
	if err != nil {
		return err
	}
	bin := e.bins[0]
	rdb := redis.NewClient(&redis.Options{Addr: e.redisNone})
	defer rdb.Close()
	memory := func(field string) float64 {
		rdb.Do(ctx, "MEMORY", "PURGE")
		return infoField(ctx, e.redisNone, "memory", field)
	}

	empty1, err := e.pipeline(ctx, bin, measured, e.redisNone)
	if err != nil {
		return err
	}
	logf("empty store: %s", empty1.describe(e.cores))
	name := e.run + "-prefilled"
	defer cleanup(rdb, name)
	before := memory("used_memory")
	ticks := time.NewTicker(100 * time.Millisecond)
	defer ticks.Stop()
	stopPeak := samplePeak(func() float64 {
		info, err := rdb.Info(ctx, "memory").Result()
		if err != nil {
			return 0
		}
		return infoValue(info, "used_memory")
	}, ticks.C)
	defer stopPeak() // on an early return too: the sampler's goroutine ends
	filled, err := e.pipelineIn(ctx, bin, fill, e.redisNone, name, true)
	if err != nil {
		return err
	}
	held := memory("used_memory") - before
	logf("prefill: %s; Redis holds %.0f MB more, %.1f bytes per retained opportunity", filled.describe(e.cores), held/1e6, held/float64(total))
	full, err := e.pipelineIn(ctx, bin, measured, e.redisNone, name, true)
	if err != nil {
		return err
	}
	peak := stopPeak()
	logf("prefilled store: %s", full.describe(e.cores))
	empty2, err := e.pipeline(ctx, bin, measured, e.redisNone)
	if err != nil {
		return err
	}
	logf("empty store again: %s", empty2.describe(e.cores))
	emptyEPS, emptyRedis := (empty1.eps+empty2.eps)/2, (empty1.redisMicros+empty2.redisMicros)/2
	logf("prefilled ÷ empty: events/s %.3f (%.0f ÷ %.0f), Redis CPU µs/event %.3f (%.2f ÷ %.2f); Redis peak %.0f MB, processor peak RSS %.0f MB",
		full.eps/emptyEPS, full.eps, emptyEPS, full.redisMicros/emptyRedis, full.redisMicros, emptyRedis, peak/1e6, full.rssMB)
	b, _ := json.Marshal(map[string]any{"prefill": map[string]any{
		"opportunities": total, "events": e.n, "eps_empty": num(emptyEPS, 0), "eps_prefilled": num(full.eps, 0),
		"eps_ratio": num(full.eps/emptyEPS, 3), "redis_us_ratio": num(full.redisMicros/emptyRedis, 3),
		"redis_bytes_per_opportunity": num(held/float64(total), 1), "redis_peak_mb": num(peak/1e6, 0), "processor_rss_mb": num(full.rssMB, 0),
	}})
	fmt.Println(string(b))
	return nil
}

// samplePeak calls read at once and on every tick until the returned stop is first called, which
// reads once more and returns the largest reading (and so does every later call). The prefill
// samples Redis's used_memory so: INFO's used_memory_peak is the server's since it started, and
// CONFIG RESETSTAT leaves it (Redis 7.0), so a larger store an earlier run left (the other
// layout's prefill) stood in for this one's.
func samplePeak(read func() float64, tick <-chan time.Time) (stop func() float64) {
	done, out := make(chan struct{}), make(chan float64, 1)
	go func() {
		peak := read()
		for {
			select {
			case <-tick:
				peak = max(peak, read())
			case <-done:
				out <- max(peak, read())
				return
			}
		}
	}()
	return sync.OnceValue(func() float64 {
		close(done)
		return <-out
	})
}
