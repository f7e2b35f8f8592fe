package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// pipelineResult is one run of the processor binary over an input topic. Per-event figures divide
// by the input's messages; CPU figures cover the same interval as eps (first processed batch to
// last). Unknown figures are NaN.
type pipelineResult struct {
	eps, roundTrips, commits float64
	cpuMicros                float64 // processor user+system CPU µs per event
	redisMicros              float64 // Redis used_cpu_user+used_cpu_sys µs per event (main process)
	kafkaMicros              float64 // broker user+system CPU µs per event (NaN without its pid)
	rewriteMicros            float64 // Redis's AOF-rewrite children: user+system CPU µs per event
	rssMB                    float64
	suiteFirst, suiteLast    float64 // eval results/s over the first and the last quarter (NaN without eval results)
	suiteRewrite             bool    // Redis rewrote its AOF during the first or the last quarter
	suiteScaleOut            float64 // suite scale over the samples without a rewrite (NaN when none fell in a quarter)
	// The same over the first suiteWindowRuns graded runs of the suite (NaN when the run has fewer).
	windowFirst, windowLast float64
	windowRewrite           bool
	aofRewrites             int  // AOF rewrites Redis started during the run
	processed               int  // messages processed: in.n unless timedOut
	timedOut                bool // BENCH_TIMEOUT passed first; figures cover what was processed
	// startActivity is what Redis had done when the measured interval began after the input's
	// warm-up (nil without one: the caller reads it before the processor starts).
	startActivity *redisActivity
}

// machineLimit is the events per second the machine's cores could carry at this run's CPU cost
// per event of processor, Redis and Kafka together (NaN when one is unknown).
func (r pipelineResult) machineLimit(cores int) float64 {
	return float64(cores) * 1e6 / (r.cpuMicros + r.redisMicros + r.kafkaMicros)
}

// machineLimitWithRewrites is machineLimit with the CPU of Redis's AOF-rewrite children added:
// a rewrite takes a core for a second or more, work the run's writes caused that machineLimit
// does not count.
func (r pipelineResult) machineLimitWithRewrites(cores int) float64 {
	return float64(cores) * 1e6 / (r.cpuMicros + r.redisMicros + r.kafkaMicros + r.rewriteMicros)
}

// faster returns whichever of two runs of one configuration processed events faster.
func faster(a, b pipelineResult) pipelineResult {
	if b.eps > a.eps || a.eps == 0 {
		return b
	}
	return a
}

// countSample is a cumulative counter read from the processor's /metrics at a moment.
type countSample struct {
	at        time.Time
	n         float64
	rewriting bool // Redis was seen rewriting its AOF since the previous sample
}

// suiteWindowRuns is the suite size of the first suite_scale figure: eval results/s over the
// last quarter ÷ over the first of a suite version filled with 150 000 runs. The eval shape grows
// its version further (BENCH_SUITE_RUNS, 10⁶ by default); this figure is read from the same run,
// over the samples up to the 150 000th run.
const suiteWindowRuns = 150000

// windowPoll is the wait between two scrapes while the suite has fewer than suiteWindowRuns runs:
// its quarters last a few batches each, and a quarter is bracketed by samples (quarterRates).
const windowPoll = 20 * time.Millisecond

// upTo returns the samples up to the first one that counts at least n items in all, nil when
// none does.
func upTo(s []countSample, n float64) []countSample {
	for i, x := range s {
		if x.n >= n {
			return s[:i+1]
		}
	}
	return nil
}

// pollInterval is the wait between two scrapes of the processor's metrics: short before its first
// batch and near the end, so the measured interval's bounds are exact to ~10 ms, and longer in
// between, where a scrape (the processor renders every metric) would otherwise take a few
// percent of its CPU and count as its cost per event. The samples of graded runs taken in between
// still give exact rates, over intervals a little longer than a quarter.
func pollInterval(waiting bool, done, total float64) time.Duration {
	if waiting || done >= 0.95*total {
		return 10 * time.Millisecond
	}
	return 200 * time.Millisecond
}

// quarterBounds returns the index of the sample that ends the first quarter of the counted items
// and of the one that starts the last, from cumulative samples (the first taken at the first
// processed batch, the last at the end); false when the samples cannot tell.
func quarterBounds(s []countSample) (ia, ib int, ok bool) {
	if len(s) < 3 {
		return 0, 0, false
	}
	s0, s1 := s[0], s[len(s)-1]
	q := (s1.n - s0.n) / 4
	if q <= 0 {
		return 0, 0, false
	}
	for i, x := range s {
		if x.n-s0.n >= q {
			ia = i
			break
		}
	}
	for i, x := range s {
		if s1.n-x.n < q {
			break
		}
		ib = i
	}
	return ia, ib, ia > 0 && ib < len(s)-1
}

// quarterRates returns the rate over the first quarter of the counted items and over the last. A
// quarter is a quarter of the items counted between the first and last sample; each rate runs
// between the samples that bracket it, so it is exact to the batch at which the counter moved.
func quarterRates(s []countSample) (first, last float64) {
	nan := math.NaN()
	ia, ib, ok := quarterBounds(s)
	if !ok {
		return nan, nan
	}
	s0, a, b, s1 := s[0], s[ia], s[ib], s[len(s)-1]
	da, db := a.at.Sub(s0.at).Seconds(), s1.at.Sub(b.at).Seconds()
	if da <= 0 || db <= 0 {
		return nan, nan
	}
	return (a.n - s0.n) / da, (s1.n - b.n) / db
}

// quarterRatesOutsideRewrites is quarterRates over only the intervals between samples in which
// Redis was not seen rewriting its AOF: the rates the suite's own cost allows, apart from the core
// a rewrite took (NaN when a quarter has no such interval).
func quarterRatesOutsideRewrites(s []countSample) (first, last float64) {
	ia, ib, ok := quarterBounds(s)
	if !ok {
		return math.NaN(), math.NaN()
	}
	rate := func(from, to int) float64 {
		var n, d float64
		for i := from + 1; i <= to; i++ {
			if !s[i].rewriting {
				n += s[i].n - s[i-1].n
				d += s[i].at.Sub(s[i-1].at).Seconds()
			}
		}
		if d <= 0 {
			return math.NaN()
		}
		return n / d
	}
	return rate(0, ia), rate(ib, len(s)-1)
}

// rewriteInQuarters reports whether Redis was seen rewriting its AOF during the first or the last
// quarter: the rewrite takes a core for a second or more, so a quarter it falls in runs slower
// for a reason that has nothing to do with the suite's size.
func rewriteInQuarters(s []countSample) bool {
	ia, ib, ok := quarterBounds(s)
	if !ok {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i].rewriting && (i <= ia || i > ib) {
			return true
		}
	}
	return false
}

// suiteScale is eval results/s over the last quarter ÷ over the first (NaN when unknown).
func (r pipelineResult) suiteScale() float64 { return r.suiteLast / r.suiteFirst }

// windowScale is suiteScale over the first suiteWindowRuns runs (NaN when unknown).
func (r pipelineResult) windowScale() float64 { return r.windowLast / r.windowFirst }

// sumSeries adds every series of a metric (all label sets) in a scrape.
func sumSeries(m map[string]float64, name string) float64 {
	var t float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

// pipeline runs bin's run command over the input topic and measures from its first processed
// batch to its last (startup and group join excluded), from its own /metrics; Redis and Kafka CPU
// over the same interval.
func (e *env) pipeline(ctx context.Context, bin binary, in *input, redisAddr string) (pipelineResult, error) {
	name := fmt.Sprintf("%s-%s-%d", e.run, filepath.Base(in.topic), time.Now().UnixNano()%1e6)
	return e.pipelineIn(ctx, bin, in, redisAddr, name, false)
}

// pipelineIn is pipeline in the namespace name (its key prefix, consumer group and output
// topics), which it deletes afterwards unless keep is set.
func (e *env) pipelineIn(ctx context.Context, bin binary, in *input, redisAddr, name string, keep bool) (pipelineResult, error) {
	port, err := freePort()
	if err != nil {
		return pipelineResult{}, err
	}
	settle(ctx, redisAddr)
	cmd := exec.Command(bin.path, "run", "--kafka-create-topics", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
	cmd.Env = append(os.Environ(), e.processorEnv(name, in.topic, redisAddr)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return pipelineResult{}, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	defer func() {
		cmd.Process.Kill()
		<-exited
		if !keep {
			rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
			cleanup(rdb, name)
			rdb.Close()
		}
	}()
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	pid := cmd.Process.Pid
	rewrites0 := aofRewrites(ctx, redisAddr)
	deadline := time.Now().Add(e.timeout)
	var (
		first, end           time.Time
		cpu0, redis0, kafka0 float64
		cpu1, redis1, kafka1 float64
		child0               float64     // Redis's children's CPU (AOF rewrites) at first
		sched0, sched1       threadTimes // Redis's main thread, when Redis runs on this machine
		done                 float64
		m                    = map[string]float64{} // the last successful scrape
		evals                []countSample          // graded runs applied, when they change
		rewriting            bool                   // Redis rewrote its AOF since the last sample
		wasRewriting         bool                   // … and was rewriting at the last poll
		rewritesSeen         = math.NaN()           // INFO's aof_rewrites at the last poll
		timedOut             bool
		base                 = map[string]float64{} // the scrape the measured interval began at, after a warm-up
		startActivity        *redisActivity
	)
	for {
		select {
		case <-exited:
			return pipelineResult{}, fmt.Errorf("pipeline %s exited: %s", bin.name, stderr.String())
		default:
		}
		now := time.Now()
		if now.After(deadline) {
			if first.IsZero() {
				return pipelineResult{}, fmt.Errorf("pipeline %s processed nothing within %s: %s", bin.name, e.timeout, stderr.String())
			}
			timedOut = true
		} else if s, err := scrape(url); err == nil {
			m = s
			done = m["repeatrate_batch_messages_sum"]
			if done > float64(in.warm) && first.IsZero() {
				first, cpu0, redis0, kafka0 = now, cpuSeconds(pid), redisCPU(ctx, redisAddr), cpuSeconds(e.kafkaPID)
				if in.warm > 0 {
					base = m
					a := activity(ctx, redisAddr)
					startActivity = &a
				}
				child0 = redisChildCPU(ctx, redisAddr)
				sched0 = redisThread(ctx, redisAddr)
				if dir := os.Getenv("BENCH_PPROF"); dir != "" {
					go saveProfile(fmt.Sprintf("http://127.0.0.1:%d", port), filepath.Join(dir, name+".pprof"))
				}
			}
			if !first.IsZero() && in.runs > 0 {
				// An interval was rewriting if a rewrite ran at either of its ends or ended within it.
				busy := infoField(ctx, redisAddr, "persistence", "aof_rewrite_in_progress") == 1
				rewrites := infoField(ctx, redisAddr, "persistence", "aof_rewrites")
				ended := !math.IsNaN(rewritesSeen) && rewrites != rewritesSeen
				rewriting = rewriting || busy || wasRewriting || ended
				wasRewriting, rewritesSeen = busy, rewrites
				// A counter: a sample is kept when it grew.
				if n := sumSeries(m, "repeatrate_graded_runs_total"); len(evals) == 0 || n > evals[len(evals)-1].n {
					evals = append(evals, countSample{at: now, n: n, rewriting: rewriting})
					rewriting = false
				}
			}
		}
		if timedOut || done >= float64(in.n) {
			end, cpu1, redis1, kafka1 = time.Now(), cpuSeconds(pid), redisCPU(ctx, redisAddr), cpuSeconds(e.kafkaPID)
			sched1 = redisThread(ctx, redisAddr)
			break
		}
		// During a warm-up the scrapes wait as in the middle of a run until its end is near (a
		// fifth of it left: at 150 000 events/s a 200 ms wait is 30 000 events).
		wait := pollInterval(first.IsZero() && done >= 0.8*float64(in.warm), done, float64(in.n))
		if in.runs > suiteWindowRuns && !first.IsZero() && (len(evals) == 0 || evals[len(evals)-1].n < suiteWindowRuns) {
			wait = min(wait, windowPoll)
		}
		time.Sleep(wait)
	}
	m = measuredPart(m, base)
	processed := m["repeatrate_batch_messages_sum"]
	if processed <= 0 {
		return pipelineResult{}, fmt.Errorf("pipeline %s: no event processed after the first %d: the warm-up ended with the input", bin.name, in.warm)
	}
	// A rewrite the run started is the run's work: its child's CPU counts once Redis has reaped
	// it, so wait for one in progress (the processor is done; nothing else is measured now).
	waitUntil(30*time.Second, func() bool { return infoField(ctx, redisAddr, "persistence", "aof_rewrite_in_progress") != 1 })
	time.Sleep(200 * time.Millisecond) // serverCron reaps a finished child within 1/hz s
	child1 := redisChildCPU(ctx, redisAddr)
	r := pipelineResult{
		eps:           processed / end.Sub(first).Seconds(),
		roundTrips:    m["repeatrate_redis_roundtrips_total"] / processed,
		commits:       m[`repeatrate_offset_commits_total{result="ok"}`] / processed,
		cpuMicros:     (cpu1 - cpu0) / processed * 1e6,
		redisMicros:   (redis1 - redis0) / processed * 1e6,
		rewriteMicros: (child1 - child0) / processed * 1e6,
		kafkaMicros:   math.NaN(),
		rssMB:         peakRSS(pid),
		suiteFirst:    math.NaN(),
		suiteLast:     math.NaN(),
		windowFirst:   math.NaN(),
		windowLast:    math.NaN(),
		aofRewrites:   aofRewrites(ctx, redisAddr) - rewrites0,
		processed:     int(processed),
		timedOut:      timedOut,
		startActivity: startActivity,
	}
	if e.kafkaPID > 0 {
		r.kafkaMicros = (kafka1 - kafka0) / processed * 1e6
	}
	if in.runs > 0 {
		r.suiteFirst, r.suiteLast = quarterRates(evals)
		r.suiteRewrite = rewriteInQuarters(evals)
		r.suiteScaleOut = math.NaN()
		if r.suiteRewrite {
			first, last := quarterRatesOutsideRewrites(evals)
			r.suiteScaleOut = last / first
		}
		if w := upTo(evals, suiteWindowRuns); in.runs > suiteWindowRuns && w != nil {
			r.windowFirst, r.windowLast = quarterRates(w)
			r.windowRewrite = rewriteInQuarters(w)
		}
	}
	// Where a batch's time goes: the stages overlap, so each is a share of the measured interval
	// (the apply stage waits for Redis; prepare and publish run beside it).
	stage := func(s string) float64 {
		return m[`repeatrate_batch_stage_seconds_sum{stage="`+s+`"}`] / end.Sub(first).Seconds()
	}
	// commit is what commits cost the apply goroutine (Verify, and before cf13f49 the Kafka commit
	// too); commit_kafka, from cf13f49 on, the broker's answers on a goroutine of their own.
	logf("stages %s %s: prepare %.2f, apply %.2f, publish %.2f, commit %.3f (Kafka's answer %.3f) of the interval; processor %.2f, Redis %.2f cores; %.0f messages per batch",
		name, bin.name, stage("prepare"), stage("apply"), stage("publish"), stage("commit"), stage("commit_kafka"), (cpu1-cpu0)/end.Sub(first).Seconds(),
		(redis1-redis0)/end.Sub(first).Seconds(), m["repeatrate_batch_messages_sum"]/m["repeatrate_batch_messages_count"])
	step := func(s string) float64 {
		return m[`repeatrate_batch_step_seconds_sum{step="`+s+`"}`] / end.Sub(first).Seconds()
	}
	logf("steps %s %s: apply %.2f, suite_apply %.2f, seal %.2f; publish %.2f, suite_publish %.2f of the interval",
		name, bin.name, step("apply"), step("suite_apply"), step("seal"), step("publish"), step("suite_publish"))
	if s := computedShare(m); s != "" {
		logf("calls %s %s: %s", name, bin.name, s)
	}
	if run, wait := sched1.sub(sched0, end.Sub(first)); !math.IsNaN(run) {
		// What keeps the serial resource from being busy: no work sent (idle) or no core free (waiting).
		logf("redis main thread %s %s: running %.2f, waiting for a core %.2f, idle %.2f of the interval", name, bin.name, run, wait, 1-run-wait)
	}
	return r, nil
}

// saveProfile writes a CPU profile (BENCH_PPROF_SECONDS, default 10) of the processor serving base to path (BENCH_PPROF
// set: the processor runs with /debug/pprof on), or an execution trace with BENCH_PPROF_KIND=trace
// (for `go tool trace`: where the goroutines wait). Failures are logged: a profile is a diagnostic.
func saveProfile(base, path string) {
	kind := getenv("BENCH_PPROF_KIND", "profile")
	if kind != "profile" && kind != "trace" {
		logf("profile: BENCH_PPROF_KIND %q is neither profile nor trace", kind)
		return
	}
	resp, err := adminGet(base + "/debug/pprof/" + kind + "?seconds=" + getenv("BENCH_PPROF_SECONDS", "10"))
	if err != nil {
		logf("profile: %v", err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		logf("profile: %s", resp.Status) // a refused request is no profile
		return
	}
	f, err := os.Create(path)
	if err != nil {
		logf("profile: %v", err)
		return
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err != nil {
		logf("profile: %v", err)
		return
	}
	logf("profile: %s", path)
	if kind == "trace" {
		f.Close() // all of it on disk before it is read; the deferred Close then does nothing
		if s, err := traceStates(path); err != nil {
			logf("trace %s: %v", path, err)
		} else {
			logf("trace %s: %s of the trace", filepath.Base(path), s)
		}
	}
}

// benchAdminToken is the admin token of the processors the harness profiles: /debug/pprof needs
// one, and /metrics then needs it too.
const benchAdminToken = "bench-admin-token-not-a-secret-0123456789"

// adminGet is GET url with the admin token (which a processor not profiled does not ask for).
func adminGet(url string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+benchAdminToken)
	return http.DefaultClient.Do(req)
}

// processorEnv configures a processor with topics, group and key prefix of its own; with
// BENCH_PPROF, its profiler on behind the admin token.
func (e *env) processorEnv(name, inputTopic, redisAddr string) []string {
	if os.Getenv("BENCH_PPROF") != "" {
		sum := sha256.Sum256([]byte(benchAdminToken))
		return append(e.processorEnvBase(name, inputTopic, redisAddr), "REPEATRATE_PPROF=true",
			"REPEATRATE_HTTP_ADMIN_TOKEN_SHA256="+hex.EncodeToString(sum[:]))
	}
	return e.processorEnvBase(name, inputTopic, redisAddr)
}

func (e *env) processorEnvBase(name, inputTopic, redisAddr string) []string {
	return []string{
		"REPEATRATE_KAFKA_BROKERS=" + strings.Join(e.brokers, ","),
		"REPEATRATE_KAFKA_GROUP_ID=" + name,
		"REPEATRATE_KAFKA_INPUT_TOPICS=" + inputTopic,
		"REPEATRATE_KAFKA_SNAPSHOT_TOPIC=" + name + ".snapshots",
		"REPEATRATE_KAFKA_SUITE_TOPIC=" + name + ".suites",
		"REPEATRATE_KAFKA_ALERTS_TOPIC=" + name + ".alerts",
		"REPEATRATE_KAFKA_DLQ_TOPIC=" + name + ".dlq",
		"REPEATRATE_REDIS_ADDRS=" + redisAddr,
		"REPEATRATE_REDIS_KEY_PREFIX=" + name,
		// The harness scrapes up to 100 times a second near a run's bounds: above the default
		// limit per client address (20/s), where scrapes and profile requests would be refused.
		"REPEATRATE_HTTP_RATE_LIMIT=1000",
	}
}

func scrape(url string) (map[string]float64, error) {
	resp, err := adminGet(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// A refused scrape (429 past the rate limit, say) is no sample: read as one, its missing
		// counters were zeros, and a zero among the graded-run samples made the last quarter
		// look several times faster than it was.
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "#") {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err == nil {
			out[l[:i]] = v
		}
	}
	return out, sc.Err()
}

// cpuSeconds returns a process's user+system CPU time from /proc/<pid>/stat (0 when unreadable).
func cpuSeconds(pid int) float64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func peakRSS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// infoField reads one numeric field of a Redis INFO section (0 when absent, NaN when INFO fails).
func infoField(ctx context.Context, addr, section, field string) float64 {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	s, err := rdb.Info(ctx, section).Result()
	if err != nil {
		// Unknown, not 0: a CPU reading of 0 at a run's start would count all of Redis's past CPU.
		return math.NaN()
	}
	if v := infoValue(s, field); !math.IsNaN(v) {
		return v
	}
	return 0
}

// infoValue reads numeric field name from the text of an INFO reply (NaN when absent).
func infoValue(info, name string) float64 {
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return math.NaN()
}

// redisCPU returns the CPU seconds the Redis server's main process has used (INFO cpu
// used_cpu_user + used_cpu_sys; AOF-rewrite and RDB children are not included).
func redisCPU(ctx context.Context, addr string) float64 {
	return infoField(ctx, addr, "cpu", "used_cpu_user") + infoField(ctx, addr, "cpu", "used_cpu_sys")
}

// redisChildCPU returns the CPU seconds of the Redis server's children that it has reaped (INFO
// cpu used_cpu_user_children + used_cpu_sys_children): AOF rewrites here, RDB saves being off.
func redisChildCPU(ctx context.Context, addr string) float64 {
	return infoField(ctx, addr, "cpu", "used_cpu_user_children") + infoField(ctx, addr, "cpu", "used_cpu_sys_children")
}

// settle waits until Redis at addr has freed what the previous run's cleanup unlinked (its
// lazy-free thread frees a run's keys in the background, taking a core for seconds after a large
// run), then compacts its AOF: every measured run starts on a Redis at rest, whichever came before.
// The latency run, which followed the last pipeline run, read p99 204 ms for the build measured
// first and 109–161 ms for the one measured second, with the same code on that path.
func settle(ctx context.Context, addr string) {
	if !waitUntil(2*time.Minute, func() bool { return !(infoField(ctx, addr, "memory", "lazyfree_pending_objects") > 0) }) {
		logf("settle %s: objects still pending lazy free after 2 minutes", addr)
	}
	compactAOF(ctx, addr)
}

// waitUntil polls done every 50 ms until it reports true (true) or d has passed (false).
func waitUntil(d time.Duration, done func() bool) bool {
	for deadline := time.Now().Add(d); !done(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// compactAOF starts a run from the same persistence state whatever ran before: when Redis at addr
// keeps an AOF, it rewrites it (the previous run's keys are deleted by then, so the base is small)
// and waits for the rewrite to end. Without it, when the run's own writes trigger an automatic
// rewrite (auto-aof-rewrite-percentage of the last base) depended on which run came before, so two
// builds' runs met rewrites at different points. A failure is logged: the run then measures what
// it finds.
func compactAOF(ctx context.Context, addr string) {
	if infoField(ctx, addr, "persistence", "aof_enabled") != 1 {
		return
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	idle := func() bool {
		return infoField(ctx, addr, "persistence", "aof_rewrite_in_progress") != 1 &&
			infoField(ctx, addr, "persistence", "aof_rewrite_scheduled") != 1
	}
	// One already running (or scheduled) is waited for first: BGREWRITEAOF would only schedule.
	if !waitUntil(2*time.Minute, idle) {
		logf("compact AOF of %s: skipped (a rewrite did not end within 2 minutes)", addr)
		return
	}
	before := aofRewrites(ctx, addr)
	if err := rdb.BgRewriteAOF(ctx).Err(); err != nil {
		logf("compact AOF of %s: skipped: %v", addr, err)
		return
	}
	if !waitUntil(2*time.Minute, func() bool { return aofRewrites(ctx, addr) != before && idle() }) {
		logf("compact AOF of %s: the rewrite did not end within 2 minutes", addr)
	}
}

// aofRewrites returns how many AOF rewrites the Redis at addr has done since it started (0 when
// AOF is off or the figure is unavailable).
func aofRewrites(ctx context.Context, addr string) int {
	n := infoField(ctx, addr, "persistence", "aof_rewrites")
	if math.IsNaN(n) {
		return 0
	}
	return int(n)
}

// threadTimes is a thread's time on a core and waiting in a run queue, from /proc/<pid>/schedstat
// (NaN when unknown).
type threadTimes struct{ run, wait float64 }

// sub returns the shares of d that the thread ran and waited for a core between t0 and t.
func (t threadTimes) sub(t0 threadTimes, d time.Duration) (run, wait float64) {
	return (t.run - t0.run) / d.Seconds(), (t.wait - t0.wait) / d.Seconds()
}

// redisThread reads the scheduler times of the main thread of the Redis at addr, which must run on
// this machine (its pid from INFO server); NaN when it cannot be read.
func redisThread(ctx context.Context, addr string) threadTimes {
	unknown := threadTimes{math.NaN(), math.NaN()}
	if !loopback(ctx, addr) {
		// A Redis elsewhere: its pid names no process here.
		return unknown
	}
	pid := infoField(ctx, addr, "server", "process_id")
	if math.IsNaN(pid) || pid <= 0 {
		return unknown
	}
	// A Redis behind a loopback port may still run in another PID namespace (a container's
	// published port, a port-forward), where its pid names an unrelated process here.
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", int(pid)))
	if err != nil || !strings.HasPrefix(string(comm), "redis") {
		return unknown
	}
	return parseSchedstat(fmt.Sprintf("/proc/%d/schedstat", int(pid)))
}

// loopback reports whether addr (host:port) names this machine: every address its host resolves
// to is a loopback address ("localhost" as well as 127.0.0.1 and ::1).
func loopback(ctx context.Context, addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return false
		}
	}
	return true
}

// parseSchedstat reads a schedstat file: nanoseconds on a core, nanoseconds waiting, timeslices.
func parseSchedstat(path string) threadTimes {
	b, err := os.ReadFile(path)
	f := strings.Fields(string(b))
	if err != nil || len(f) < 2 {
		return threadTimes{math.NaN(), math.NaN()}
	}
	run, err1 := strconv.ParseFloat(f[0], 64)
	wait, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil {
		return threadTimes{math.NaN(), math.NaN()}
	}
	return threadTimes{run / 1e9, wait / 1e9}
}

// measuredPart is scrape m less what the counters held in scrape base: the part of each
// counter (and of each summary's sum and count) counted since base was scraped. Gauges are m's.
func measuredPart(m, base map[string]float64) map[string]float64 {
	if len(base) == 0 {
		return m
	}
	out := make(map[string]float64, len(m))
	for k, v := range m {
		name, _, _ := strings.Cut(k, "{")
		if strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") || strings.HasSuffix(name, "_bucket") {
			v -= base[k]
		}
		out[k] = v
	}
	return out
}

// computedShare describes, from a processor's metrics m, the apply calls it computed itself
// (redis.compute_calls) and those apply.lua ran, or "" when it computed none.
func computedShare(m map[string]float64) string {
	stored, refused := m[`repeatrate_computed_calls_total{result="stored"}`], m[`repeatrate_computed_calls_total{result="refused"}`]
	offPath, unread := m[`repeatrate_computed_calls_left_total{reason="off_path"}`], m[`repeatrate_computed_calls_left_total{reason="unread"}`]
	all := stored + refused + offPath + unread
	if stored == 0 || all == 0 {
		return ""
	}
	out := fmt.Sprintf("%.0f %% computed (redis.compute_calls): %.0f stored, %.0f refused, %.0f off the path, %.0f in batches left unread",
		100*stored/all, stored, refused, offPath, unread)
	fromRedis, cached := m[`repeatrate_computed_buckets_total{from="redis"}`], m[`repeatrate_computed_buckets_total{from="cache"}`]
	if fromRedis+cached > 0 {
		out += fmt.Sprintf("; buckets %.0f %% from the cache (%.0f read, %.0f cached); cache %.1f MiB, %.0f aggregates evicted",
			100*cached/(fromRedis+cached), fromRedis, cached, m["repeatrate_bucket_cache_bytes"]/(1<<20), m["repeatrate_bucket_cache_evictions_total"])
	}
	return out
}
