package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/synth"
)

// Prefilled store (BENCH_PREFILL=<opportunities>): the today stream (BENCH_EVENTS events, 400
// aggregates) on an empty store, then on one that already retains that many opportunities over
// 10 000 live aggregates — among them the today stream's 200 live ones, each then holding
// total/10 000, occurred over the last 24 hours — and on an empty store again, in
// BENCH_PREFILL_ROUNDS rounds (3 by default, at most 5) of a new today stream each, every
// prefilled run between two empty ones. Each round's stream counts in workspaces of its own
// (roundWorkspaces), so that its live aggregates are 200 that no round before it wrote: every
// round meets them as the prefill left them, not grown by the rounds before. Cost per event must
// not depend on history: events/s and Redis CPU per event, prefilled ÷ empty (the means over the
// rounds; one empty run's Redis CPU an event varies by a tenth or more from the next). With
// BENCH_PREFILL_CONTROL set, a second store holds only what the prefill put in the rounds'
// streams' live aggregates (200 a round), and each round also runs on it, before the empty run
// and after or before the prefilled one, alternately: prefilled ÷ control is what the rest of the
// history costs, the stream's aggregates alike in both; control ÷ empty what those aggregates'
// records cost. With BENCH_PREFILL_WARM=<events>, every run's input is that many more events of
// its round's stream, which the processor runs first, unmeasured: the runs then measure a
// processor that has been running (its bucket cache filled, its aggregates met) on each store,
// not one that starts. Redis without AOF, so that no rewrite of the prefilled state lands in a
// measured run. The prefill is processed by the same binary, written aggregate by aggregate so that it
// takes minutes, not hours: spread over 10 000 aggregates, a batch holds one or two events of
// each, and each costs a script call of its own.
const (
	prefillAggregates  = 10_000 // 50 workspaces × 2 models × 100 corrections, live
	prefillCorrections = 100
	prefillSpread      = 24 * time.Hour
)

// prefillLines yields the prefill's lines of the aggregates keep takes, per lines each, occurred
// before now: every input made by it holds the same lines of the aggregates it takes (one seed,
// every line drawn in the same order, those of the aggregates not taken too).
func prefillLines(per int, keep func(a int) bool, now time.Time) func() ([]byte, bool) {
	r := rand.New(rand.NewPCG(41, 42))
	a, j := 0, 0
	return func() ([]byte, bool) {
		for a < prefillAggregates {
			l := prefillLine(r, a, j, now)
			at := a
			if j++; j == per {
				a, j = a+1, 0
			}
			if keep(at) {
				return l, true
			}
		}
		return nil, false
	}
}

// roundWorkspaces is how many workspaces a round's today stream counts in (todayConfig): round k
// (from 0) takes ws-10k to ws-(10k+9), and 5 rounds take the prefill's 50.
const roundWorkspaces = 10

// maxPrefillRounds is how many rounds meet live aggregates of their own: the prefill's
// workspaces, roundWorkspaces a round.
const maxPrefillRounds = prefillAggregates / (2 * prefillCorrections) / roundWorkspaces

// prefillRounds is BENCH_PREFILL_ROUNDS, 3 by default, from 1 to maxPrefillRounds.
func prefillRounds() (int, error) {
	rounds, err := atLeast("BENCH_PREFILL_ROUNDS", "3", 1)
	if err == nil && rounds > maxPrefillRounds {
		err = fmt.Errorf("BENCH_PREFILL_ROUNDS=%d: at most %d rounds each meet live aggregates of their own", rounds, maxPrefillRounds)
	}
	return rounds, err
}

// roundConfig is round k's (from 0) today stream, 20 % duplicates: its ids numbered apart from
// every other round's (each of the same length), so that no round reads another's as duplicates
// and layout 10, which keeps the ids, stores as many bytes in each; its workspaces of its own,
// so that it meets its aggregates as the prefill left them.
func roundConfig(k int) synth.Config {
	return todayConfig(0.2, (k+1)*1_000_000_000, k*roundWorkspaces)
}

// roundInputs makes each round's input (roundConfig) with newInput: warm events of its stream,
// which the processor runs first, then the n measured.
func roundInputs(rounds, n, warm int, newInput func(name string, cfg synth.Config, n int) (*input, error)) ([]*input, error) {
	out := []*input{}
	for k := range rounds {
		in, err := newInput(fmt.Sprintf("dup20-%d", k+1), roundConfig(k), warm+n)
		if err != nil {
			return nil, err
		}
		in.warm = warm
		out = append(out, in)
	}
	return out, nil
}

// controlLines is the control store's prefill (BENCH_PREFILL_CONTROL) when the bench runs rounds
// rounds: the prefill's lines, per an aggregate, of the rounds' streams' live aggregates alone.
func controlLines(per, rounds int, now time.Time) func() ([]byte, bool) {
	return prefillLines(per, inRoundStreams(rounds), now)
}

// inRoundStreams returns whether prefilled aggregate a is one of the 200 live ones of the today
// stream of one of the first rounds rounds: workspaces ws-0 to ws-(10·rounds-1), corrections fix-0
// to fix-9 (todayInput), both models.
func inRoundStreams(rounds int) func(a int) bool {
	return func(a int) bool {
		return a/(2*prefillCorrections) < roundWorkspaces*rounds && a%prefillCorrections < 10
	}
}

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
	rounds, err := prefillRounds()
	if err != nil {
		return err
	}
	warm, err := atLeast("BENCH_PREFILL_WARM", "0", 0)
	if err != nil {
		return err
	}
	if warm > 0 {
		logf("prefill: each run measures %d events after a warm-up of %d of the same stream in the same process", e.n, warm)
	}
	measured, err := roundInputs(rounds, e.n, warm, e.todayInputOf)
	if err != nil {
		return err
	}
	per := max(1, total/prefillAggregates)
	total = per * prefillAggregates
	now := time.Now()
	fill, err := e.input(shapeToday, "prefill", prefillLines(per, func(int) bool { return true }, now))
	if err != nil {
		return err
	}
	var control *input // the stream's live aggregates' prefill alone (BENCH_PREFILL_CONTROL)
	if getenv("BENCH_PREFILL_CONTROL", "") != "" {
		if control, err = e.input(shapeToday, "prefill-control", controlLines(per, rounds, now)); err != nil {
			return err
		}
	}
	bin := e.bins[0]
	name, controlName := e.run+"-prefilled", e.run+"-control"
	rdb := redis.NewClient(&redis.Options{Addr: e.redisNone})
	defer rdb.Close()
	memory := func(field string) float64 {
		rdb.Do(ctx, "MEMORY", "PURGE")
		return infoField(ctx, e.redisNone, "memory", field)
	}

	// run measures one input on the kept store of namespace store, or on a new empty one when
	// store is "", with what Redis did by command.
	run := func(what string, in *input, store string) (pipelineResult, error) {
		was := activity(ctx, e.redisNone)
		var r pipelineResult
		var err error
		if store != "" {
			r, err = e.pipelineIn(ctx, bin, in, e.redisNone, store, true)
		} else {
			r, err = e.pipeline(ctx, bin, in, e.redisNone)
		}
		if r.startActivity != nil {
			was = *r.startActivity // the measured interval began after a warm-up
		}
		if err == nil {
			logf("%s: %s", what, r.describe(e.cores))
			// Per event of the measured interval: after a warm-up it begins at the first scrape
			// past it, so it holds fewer than e.n events by up to the batches of a poll.
			logf("%s, Redis by command: %s", what, was.since(activity(ctx, e.redisNone), r.processed))
		}
		return r, err
	}
	empty := make([]pipelineResult, 0, len(measured)+1)
	full := make([]pipelineResult, 0, len(measured))
	first, err := run("empty store", measured[0], "")
	if err != nil {
		return err
	}
	empty = append(empty, first)
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
	if control != nil {
		defer cleanup(rdb, controlName)
		before := memory("used_memory")
		filled, err := e.pipelineIn(ctx, bin, control, e.redisNone, controlName, true)
		if err != nil {
			return err
		}
		held := memory("used_memory") - before
		logf("control prefill (the rounds' streams' %d live aggregates alone): %s; Redis holds %.0f MB more, %.1f bytes per retained opportunity",
			control.n/per, filled.describe(e.cores), held/1e6, held/float64(control.n))
	}
	if getenv("BENCH_PREFILL_RESTORE", "") != "" { // the prefilled store's keys, not the control's
		n, err := restoreAll(ctx, rdb, name)
		if err != nil {
			return err
		}
		logf("prefill: %d keys dumped and restored, each now in memory allocated at once", n)
	}
	// Round k+1 (as the log counts them): input k on the prefilled store and on the control store
	// when there is one (the control after the prefilled store in the log's odd rounds, k even,
	// before it in the even ones), then on an empty one; every prefilled run lies between two
	// empty runs.
	rss := 0.0
	var controls []pipelineResult
	for k, in := range measured {
		runControl := func() error {
			r, err := run(fmt.Sprintf("control store, round %d", k+1), in, controlName)
			controls = append(controls, r)
			return err
		}
		if control != nil && k%2 == 1 { // the two stores' order alternates round by round
			if err := runControl(); err != nil {
				return err
			}
		}
		r, err := run(fmt.Sprintf("prefilled store, round %d", k+1), in, name)
		if err != nil {
			return err
		}
		full, rss = append(full, r), max(rss, r.rssMB)
		if control != nil && k%2 == 0 {
			if err := runControl(); err != nil {
				return err
			}
		}
		if r, err = run(fmt.Sprintf("empty store, round %d", k+1), in, ""); err != nil {
			return err
		}
		empty = append(empty, r)
		logf("round %d: prefilled ÷ empty (the runs either side): events/s %.3f, Redis CPU µs/event %.3f", k+1,
			full[k].eps/meanOf(empty[k:k+2], eventsPerSecond), full[k].redisMicros/meanOf(empty[k:k+2], redisPerEvent))
		if control != nil {
			c := controls[k]
			logf("round %d: prefilled ÷ control: events/s %.3f, Redis CPU µs/event %.3f; control ÷ empty (either side): events/s %.3f, Redis CPU µs/event %.3f", k+1,
				full[k].eps/c.eps, full[k].redisMicros/c.redisMicros,
				c.eps/meanOf(empty[k:k+2], eventsPerSecond), c.redisMicros/meanOf(empty[k:k+2], redisPerEvent))
		}
	}
	peak := stopPeak()
	emptyEPS, emptyRedis := meanOf(empty, eventsPerSecond), meanOf(empty, redisPerEvent)
	fullEPS, fullRedis := meanOf(full, eventsPerSecond), meanOf(full, redisPerEvent)
	logf("prefilled ÷ empty over %d rounds (means of %d prefilled and %d empty runs): events/s %.3f (%.0f ÷ %.0f), Redis CPU µs/event %.3f (%.2f ÷ %.2f); Redis peak %.0f MB, processor peak RSS %.0f MB",
		len(full), len(full), len(empty), fullEPS/emptyEPS, fullEPS, emptyEPS, fullRedis/emptyRedis, fullRedis, emptyRedis, peak/1e6, rss)
	out := map[string]any{
		"opportunities": total, "events": e.n, "warm_up_events": warm, "rounds": len(full), "eps_empty": num(emptyEPS, 0), "eps_prefilled": num(fullEPS, 0),
		"eps_ratio": num(fullEPS/emptyEPS, 3), "redis_us_ratio": num(fullRedis/emptyRedis, 3),
		"redis_bytes_per_opportunity": num(held/float64(total), 1), "redis_peak_mb": num(peak/1e6, 0), "processor_rss_mb": num(rss, 0),
	}
	if control != nil {
		controlEPS, controlRedis := meanOf(controls, eventsPerSecond), meanOf(controls, redisPerEvent)
		out["eps_ratio_to_control"], out["redis_us_ratio_to_control"] = num(fullEPS/controlEPS, 3), num(fullRedis/controlRedis, 3)
		out["control_eps_ratio"], out["control_redis_us_ratio"] = num(controlEPS/emptyEPS, 3), num(controlRedis/emptyRedis, 3)
		logf("over %d rounds: prefilled ÷ control (the history beyond the stream's aggregates) events/s %.3f, Redis CPU µs/event %.3f (%.2f ÷ %.2f); control ÷ empty events/s %.3f, Redis CPU µs/event %.3f (%.2f ÷ %.2f)",
			len(full), fullEPS/controlEPS, fullRedis/controlRedis, fullRedis, controlRedis,
			controlEPS/emptyEPS, controlRedis/emptyRedis, controlRedis, emptyRedis)
	}
	b, _ := json.Marshal(map[string]any{"prefill": out})
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

// meanOf is the mean of a figure over runs.
func meanOf(runs []pipelineResult, figure func(pipelineResult) float64) float64 {
	sum := 0.0
	for _, r := range runs {
		sum += figure(r)
	}
	return sum / float64(len(runs))
}

// eventsPerSecond and redisPerEvent are figures meanOf takes.
func eventsPerSecond(r pipelineResult) float64 { return r.eps }
func redisPerEvent(r pipelineResult) float64   { return r.redisMicros }

// restoreAll dumps every key under prefix, deletes them all, and restores them one after another
// with their TTLs (BENCH_PREFILL_RESTORE). The prefill writes its 10 000 aggregates in turn, so
// each key's memory lies scattered among the others'; restored into the memory the deletion freed,
// each key's lies together, as after Redis loads a snapshot. It tells cost that comes from where
// the state lies in memory apart from cost that comes from its size.
func restoreAll(ctx context.Context, rdb *redis.Client, prefix string) (int, error) {
	type dumped struct {
		key   string
		value string
		ttl   time.Duration
	}
	var all []dumped
	seen := map[string]bool{} // SCAN may return a key twice
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if seen[k] {
			continue
		}
		seen[k] = true
		// Read together, so that a key that expires meanwhile is missing from both.
		p := rdb.TxPipeline()
		dump, pttl := p.Dump(ctx, k), p.PTTL(ctx, k)
		if _, err := p.Exec(ctx); errors.Is(err, redis.Nil) {
			continue // gone since the scan
		} else if err != nil {
			return 0, fmt.Errorf("dump %s: %w", k, err)
		}
		ttl := pttl.Val()
		switch {
		case ttl == -2: // go-redis gives -2 and -1 as they come, not in milliseconds
			continue // gone since the scan
		case ttl < 0:
			ttl = 0 // no expiry: RESTORE's 0
		case ttl == 0:
			continue // expiring now
		}
		all = append(all, dumped{k, dump.Val(), ttl})
	}
	if err := iter.Err(); err != nil {
		return 0, err
	}
	for i := 0; i < len(all); i += 1000 {
		keys := make([]string, 0, 1000)
		for _, d := range all[i:min(i+1000, len(all))] {
			keys = append(keys, d.key)
		}
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			return 0, err
		}
	}
	rdb.Do(ctx, "MEMORY", "PURGE")
	for _, d := range all {
		if err := rdb.Restore(ctx, d.key, d.ttl, d.value).Err(); err != nil {
			return 0, fmt.Errorf("restore %s: %w", d.key, err)
		}
	}
	return len(all), nil
}
