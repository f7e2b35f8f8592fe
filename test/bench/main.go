// Command bench measures repeatrate against the limits of the machine and of the Kafka and Redis
// it sits between, in one run on real services (make bench starts them), over three data shapes:
// today (400 aggregates), wide (60 aggregates, occurred times over 30 days) and eval (one suite
// version growing to BENCH_SUITE_RUNS runs). For every shape it runs the real `repeatrate run`
// binary over a pre-produced topic and reports throughput and the CPU per event of the processor,
// Redis and Kafka; for today also consume-only and Redis-only throughput, duplicates and AOF
// comparisons, produce→snapshot latency at half load and Redis bytes per opportunity; for eval how
// the rate holds as the suite grows. With BENCH_BASELINE it alternates every pipeline run between
// that build and the working tree's and reports their ratios. Progress goes to stderr; the last
// line on stdout is one JSON object with every figure, nested by shape (see BENCHMARKS.md).
// With BENCH_CLUSTER=1 it measures instead 1, 2 and 3 processors on the local Redis Cluster and
// three brokers (cluster.go).
//
// It does not start or stop services, and it deletes only the topics and Redis keys it created.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
)

// env is one harness run: its configuration and the builds it compares.
type env struct {
	brokers   []string
	redisAOF  string
	redisNone string
	bins      []binary // the current build, then the baseline when BENCH_BASELINE is set
	dir       string
	n         int // events of the today and wide inputs
	suiteRuns int // graded runs of the eval input
	rounds    int
	timeout   time.Duration // per pipeline run
	cores     int
	kafkaPID  int
	run       string // prefix of every topic, group and key prefix of this run
	latencies int    // latency runs so far: each gets topics, a group and keys of its own
	// brokerMicros is the broker's CPU per event sent in the last latency run (NaN when unknown).
	brokerMicros float64
}

func main() {
	if base := os.Getenv("BENCH_ISOLATION_ABUSER"); base != "" { // the abuser's process (isolation.go)
		abuserMain(base)
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func logf(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }

func atLeast(k, def string, lo int) (int, error) {
	v, err := strconv.Atoi(getenv(k, def))
	if err != nil || v < lo {
		return 0, fmt.Errorf("%s %q: want a number ≥ %d", k, os.Getenv(k), lo)
	}
	return v, nil
}

// pipelineConfig is one pipeline measurement: an input on a Redis, run with every binary.
type pipelineConfig struct {
	name  string
	in    *input
	redis string
	best  []pipelineResult // per binary, the faster of its runs
}

func run() error {
	ctx := context.Background()
	n, err := atLeast("BENCH_EVENTS", "1000000", 1000)
	if err != nil {
		return err
	}
	suiteRuns, err := atLeast("BENCH_SUITE_RUNS", "1000000", 1000)
	if err != nil {
		return err
	}
	latencyRuns, err := atLeast("BENCH_LATENCY_RUNS", "3", 1)
	if err != nil {
		return err
	}
	rounds, err := atLeast("BENCH_ROUNDS", "2", 1)
	if err != nil {
		return err
	}
	timeout, err := time.ParseDuration(getenv("BENCH_TIMEOUT", "30m"))
	if err != nil {
		return fmt.Errorf("BENCH_TIMEOUT: %w", err)
	}
	shapes := strings.Split(getenv("BENCH_SHAPES", strings.Join(allShapes, ",")), ",")
	for _, s := range shapes {
		if !slices.Contains(allShapes, s) {
			return fmt.Errorf("BENCH_SHAPES: unknown shape %q (want some of %s)", s, strings.Join(allShapes, ","))
		}
	}
	dir, err := os.MkdirTemp("", "repeatrate-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e := &env{
		brokers:   strings.Split(getenv("REPEATRATE_TEST_KAFKA", "127.0.0.1:19092"), ","),
		redisAOF:  getenv("REPEATRATE_TEST_REDIS", "127.0.0.1:16379"),
		redisNone: getenv("BENCH_REDIS_NOAOF", "127.0.0.1:16380"),
		dir:       dir,
		n:         n,
		suiteRuns: suiteRuns,
		rounds:    rounds,
		timeout:   timeout,
		cores:     runtime.NumCPU(),
		run:       fmt.Sprintf("bench-%d", time.Now().Unix()),
	}
	cur, err := buildCurrent(dir)
	if err != nil {
		return err
	}
	e.bins = []binary{cur}
	if spec := os.Getenv("BENCH_BASELINE"); spec != "" {
		base, err := baselineBinary(spec, dir)
		if err != nil {
			return err
		}
		e.bins = append(e.bins, base)
	}
	if getenv("BENCH_CLUSTER", "") == "1" { // 1, 2 and 3 processors on the local clusters (cluster.go)
		return e.clusterMode(ctx)
	}
	if getenv("BENCH_PREFILL", "") != "" { // the today stream on a store already holding many (prefill.go)
		return e.prefillMode(ctx)
	}
	if getenv("BENCH_ISOLATION", "") == "1" { // a normal tenant beside an abusive one (isolation.go)
		return e.isolationMode(ctx)
	}
	if rate := getenv("BENCH_LATENCY_RATE", ""); rate != "" { // latency alone, at a given rate
		r, err := strconv.ParseFloat(rate, 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("BENCH_LATENCY_RATE: want events per second, got %q", rate)
		}
		if err := e.warmBroker(ctx, r); err != nil {
			return err
		}
		p50, p99, err := e.transportFloor(ctx, r)
		if err != nil {
			return err
		}
		logf("transport floor at %.0f events/s (the harness's producer to a reader, no processor): p50 %.1f ms, p99 %.1f ms", r, p50, p99)
		_, err = e.alternatedLatency(ctx, r, rounds)
		return err
	}
	defer e.deleteTopics(ctx)
	var from string
	e.kafkaPID, from = kafkaBrokerPID(e.brokers[0])
	logf("machine: %s", machine())
	logf("events: %d, suite runs: %d, shapes: %s, rounds: %d", n, suiteRuns, strings.Join(shapes, ","), rounds)
	if e.kafkaPID > 0 {
		logf("kafka broker: pid %d (from %s)", e.kafkaPID, from)
	} else {
		logf("kafka broker: pid not found, Kafka CPU and the machine limit are not measured (set BENCH_KAFKA_PID)")
	}

	var configs []*pipelineConfig
	add := func(name string, in *input, redis string) {
		configs = append(configs, &pipelineConfig{name: name, in: in, redis: redis, best: make([]pipelineResult, len(e.bins))})
	}
	var in20 *input
	if slices.Contains(shapes, shapeToday) {
		// The same generator with and without 20 % duplicates (10 % re-assessments both).
		if in20, err = e.todayInput("dup20", 0.2); err != nil {
			return err
		}
		in0, err := e.todayInput("dup0", 0)
		if err != nil {
			return err
		}
		add("today dup20 aof", in20, e.redisAOF)
		add("today dup0 aof", in0, e.redisAOF)
		add("today dup20 no-aof", in20, e.redisNone)
	}
	if slices.Contains(shapes, shapeWide) {
		in, err := e.wideInput()
		if err != nil {
			return err
		}
		add("wide aof", in, e.redisAOF)
	}
	if slices.Contains(shapes, shapeEval) {
		in, err := e.evalInput()
		if err != nil {
			return err
		}
		add("eval aof", in, e.redisAOF)
	}

	// The limits, like the pipelines below, are the faster of the rounds.
	var consumeEPS, redisEPS float64
	if in20 != nil {
		for round := 1; round <= e.rounds; round++ {
			c, err := e.consumeOnly(ctx, in20)
			if err != nil {
				return err
			}
			r, err := e.redisOnly(ctx, in20)
			if err != nil {
				return err
			}
			logf("round %d consume-only: %.0f events/s, redis-only: %.0f events/s", round, c, r)
			consumeEPS, redisEPS = math.Max(consumeEPS, c), math.Max(redisEPS, r)
		}
	}

	// Every (configuration, binary) runs once per round, every other round in reverse order, and
	// keeps its faster run: a single run on two shared cores can lose a quarter of its speed to an
	// AOF rewrite, the JVM or another process, and the comparisons below are between
	// configurations and binaries, not disturbances or positions in the sequence. With a baseline
	// the two binaries alternate run by run (current then baseline, then in reverse).
	type job struct {
		c *pipelineConfig
		b int
	}
	var order []job
	for _, c := range configs {
		for b := range e.bins {
			order = append(order, job{c, b})
		}
	}
	for round := 1; round <= e.rounds; round++ {
		for _, j := range order {
			bin := e.bins[j.b]
			r, err := e.pipeline(ctx, bin, j.c.in, j.c.redis)
			if err != nil {
				return err
			}
			logf("pipeline %s %s: %s", j.c.name, bin.name, r.describe(e.cores))
			j.c.best[j.b] = faster(j.c.best[j.b], r)
		}
		slices.Reverse(order)
	}
	for _, c := range configs {
		for b, bin := range e.bins {
			logf("best of %d: %s %s: %.0f events/s", e.rounds, c.name, bin.name, c.best[b].eps)
		}
	}

	out := map[string]any{"events": n, "shapes": shapes, "cores": e.cores, "rounds": e.rounds}
	if slices.Contains(shapes, shapeEval) {
		out["suite_runs"] = suiteRuns
	}
	if len(e.bins) > 1 {
		out["baseline"] = os.Getenv("BENCH_BASELINE")
	}
	byName := map[string]*pipelineConfig{}
	for _, c := range configs {
		byName[c.name] = c
	}
	perBin := func(f func(b int) (map[string]any, error)) (map[string]any, error) {
		m, err := f(0)
		if err != nil || len(e.bins) == 1 {
			return m, err
		}
		base, err := f(1)
		if err != nil {
			return nil, err
		}
		m["baseline"] = base
		m["vs_baseline"] = versus(m, base)
		return m, nil
	}
	if c := byName["today dup20 aof"]; c != nil {
		p0, pNone := byName["today dup0 aof"], byName["today dup20 no-aof"]
		// Latency at half of the current build's speed, BENCH_LATENCY_RUNS runs of every build on a
		// warm broker.
		rate := c.best[0].eps / 2
		if err := e.warmBroker(ctx, rate); err != nil {
			return err
		}
		half, err := e.alternatedLatency(ctx, rate, latencyRuns)
		if err != nil {
			return err
		}
		m, err := perBin(func(b int) (map[string]any, error) {
			p20 := c.best[b]
			m := p20.figures(c.in, e.cores)
			m["dup20_vs_dup0"] = num(p20.eps/p0.best[b].eps, 3)
			m["aof_vs_noaof"] = num(p20.eps/pNone.best[b].eps, 3)
			all := pooled(half[b])
			m["p50_ms"], m["p99_ms"] = num(all.at(0.5), 1), num(all.at(0.99), 1)
			var p50s, p99s []any
			for _, l := range half[b] {
				p50s, p99s = append(p50s, num(l.at(0.5), 1)), append(p99s, num(l.at(0.99), 1))
			}
			m["p50_ms_runs"], m["p99_ms_runs"] = p50s, p99s
			// And near the pipeline's rate: 0.9 of it, where batches queue behind one another.
			rate := c.best[0].eps * 0.9
			lat, err := e.latency(ctx, e.bins[b], rate)
			if err != nil {
				return nil, err
			}
			logf("latency %s at %.0f events/s (0.9 of the pipeline's rate): p50 %.1f ms, p99 %.1f ms", e.bins[b].name, rate, lat.at(0.5), lat.at(0.99))
			m["p50_ms_at_0.9"], m["p99_ms_at_0.9"] = num(lat.at(0.5), 1), num(lat.at(0.99), 1)
			return m, nil
		})
		if err != nil {
			return err
		}
		m["consume_only_eps"] = num(consumeEPS, 0)
		m["redis_only_eps"] = num(redisEPS, 0)
		m["ratio"] = num(c.best[0].eps/math.Min(consumeEPS, redisEPS), 3)
		// Layout 10 over a day is what the pipeline's default writes (the figure make bench has
		// always reported); layout 11 (redis.state_layout 11) and 30 days beside it.
		for _, l := range []aggregator.Layout{aggregator.Layout10, aggregator.Layout11} {
			for _, days := range []int{1, 30} {
				bytesPer, err := e.redisBytes(ctx, l, time.Duration(days)*24*time.Hour)
				if err != nil {
					return err
				}
				logf("redis bytes per retained opportunity, layout %d, occurred over %d days: %.1f", int(l), days, bytesPer)
				name := "redis_bytes_per_opportunity"
				if l != aggregator.Layout10 {
					name += fmt.Sprintf("_layout%d", int(l))
				}
				if days != 1 {
					name += fmt.Sprintf("_%dd", days)
				}
				m[name] = num(bytesPer, 1)
			}
		}
		out[shapeToday] = m
	}
	for shape, name := range map[string]string{shapeWide: "wide aof", shapeEval: "eval aof"} {
		c := byName[name]
		if c == nil {
			continue
		}
		m, _ := perBin(func(b int) (map[string]any, error) { return c.best[b].figures(c.in, e.cores), nil })
		out[shape] = m
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// alternatedLatency runs latency n times for every build at rate, the builds alternating run by
// run (every other run in reverse order), as the pipeline runs do: this machine's speed moves
// within minutes, and one build's 13 runs within a few minutes read p50 51–154 and p99 201–898
// ms (2026-12-06), so one run says little. It logs each run and, for each build, the quantiles over
// all its runs' events with the spread of the runs' own; it returns each build's runs.
func (e *env) alternatedLatency(ctx context.Context, rate float64, n int) ([][]latencies, error) {
	runs := make([][]latencies, len(e.bins))
	for run := range n {
		for i := range e.bins {
			b := i
			if run%2 == 1 {
				b = len(e.bins) - 1 - i
			}
			lat, err := e.latency(ctx, e.bins[b], rate)
			if err != nil {
				return nil, err
			}
			runs[b] = append(runs[b], lat)
			logf("latency %s at %.0f events/s, run %d of %d: p50 %.1f ms, p99 %.1f ms", e.bins[b].name, rate, run+1, n, lat.at(0.5), lat.at(0.99))
		}
	}
	for b, bin := range e.bins {
		all := pooled(runs[b])
		logf("latency %s at %.0f events/s over its %d runs' events: p50 %.1f ms, p99 %.1f ms; the runs' p50 %s, p99 %s",
			bin.name, rate, n, all.at(0.5), all.at(0.99), spread(runs[b], 0.5), spread(runs[b], 0.99))
	}
	return runs, nil
}

// describe is a run's progress line.
func (r pipelineResult) describe(cores int) string {
	s := fmt.Sprintf("%.0f events/s, CPU µs/event processor %.1f, Redis %.1f, Kafka %.1f; machine limit %.0f events/s (%.2f of it); %.4f round trips/event, %.5f commits/event, peak RSS %.0f MB, %d AOF rewrites (%.2f CPU µs/event; %.2f of the machine limit counting them)",
		r.eps, r.cpuMicros, r.redisMicros, r.kafkaMicros, r.machineLimit(cores), r.eps/r.machineLimit(cores), r.roundTrips, r.commits, r.rssMB, r.aofRewrites,
		r.rewriteMicros, r.eps/r.machineLimitWithRewrites(cores))
	if !math.IsNaN(r.suiteScale()) {
		s += fmt.Sprintf(", suite scale %.3f (%.0f → %.0f eval results/s)", r.suiteScale(), r.suiteFirst, r.suiteLast)
		if r.suiteRewrite {
			s += fmt.Sprintf(" with an AOF rewrite in a measured quarter (%.3f outside the rewrite's samples)", r.suiteScaleOut)
		}
		if !math.IsNaN(r.windowScale()) {
			s += fmt.Sprintf("; over its first %d runs %.3f (%.0f → %.0f eval results/s)", suiteWindowRuns, r.windowScale(), r.windowFirst, r.windowLast)
			if r.windowRewrite {
				s += " with an AOF rewrite in a measured quarter"
			}
		}
	}
	if r.timedOut {
		s += fmt.Sprintf(", TIMED OUT after %d events", r.processed)
	}
	return s
}

// figures are the JSON figures every shape reports for its best run.
func (r pipelineResult) figures(in *input, cores int) map[string]any {
	m := map[string]any{
		"events":                     in.n,
		"pipeline_eps":               num(r.eps, 0),
		"processor_cpu_us_per_event": num(r.cpuMicros, 2),
		"redis_cpu_us_per_event":     num(r.redisMicros, 2),
		"kafka_cpu_us_per_event":     num(r.kafkaMicros, 2),
		"machine_limit_eps":          num(r.machineLimit(cores), 0),
		"pipeline_vs_machine":        num(r.eps/r.machineLimit(cores), 3),
		// Beside the figures of the issue, not instead of them: the rewrites' CPU is machine work
		// the machine limit above leaves out.
		"redis_rewrite_cpu_us_per_event":    num(r.rewriteMicros, 2),
		"pipeline_vs_machine_with_rewrites": num(r.eps/r.machineLimitWithRewrites(cores), 3),
		"redis_roundtrips_per_event":        num(r.roundTrips, 5),
		"commits_per_event":                 num(r.commits, 5),
		"rss_mb":                            num(r.rssMB, 1),
	}
	if in.runs > 0 {
		m["suite_runs"] = in.runs
		m["suite_scale_ratio"] = num(r.suiteScale(), 3)
		m["suite_first_quarter_rps"] = num(r.suiteFirst, 0)
		m["suite_last_quarter_rps"] = num(r.suiteLast, 0)
		m["suite_scale_aof_rewrite"] = r.suiteRewrite
		if r.suiteRewrite {
			m["suite_scale_ratio_outside_rewrites"] = num(r.suiteScaleOut, 3)
		}
		if in.runs > suiteWindowRuns {
			m["suite_scale_ratio_150k"] = num(r.windowScale(), 3)
			m["suite_scale_150k_aof_rewrite"] = r.windowRewrite
		}
	}
	if r.timedOut {
		m["timed_out_after_events"] = r.processed
	}
	return m
}

// versusKeys are the figures compared between the current build and the baseline.
var versusKeys = []string{"pipeline_eps", "processor_cpu_us_per_event", "redis_cpu_us_per_event", "kafka_cpu_us_per_event",
	"pipeline_vs_machine", "redis_rewrite_cpu_us_per_event", "suite_scale_ratio", "suite_scale_ratio_150k", "redis_roundtrips_per_event", "rss_mb", "p99_ms"}

// versus returns current ÷ baseline for each compared figure both have.
func versus(cur, base map[string]any) map[string]any {
	out := map[string]any{}
	for _, k := range versusKeys {
		c, ok1 := cur[k].(float64)
		b, ok2 := base[k].(float64)
		if ok1 && ok2 && b != 0 {
			out[k] = num(c/b, 3)
		}
	}
	return out
}

// num rounds x to digits decimals; NaN and infinities (a figure that could not be measured)
// become nil, JSON null.
func num(x float64, digits int) any {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

func machine() string {
	cpu := "?"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	out, _ := exec.Command("nproc").Output()
	return fmt.Sprintf("%s × %s cores", cpu, strings.TrimSpace(string(out)))
}
