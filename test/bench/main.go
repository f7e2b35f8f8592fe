// Command bench measures repeatrate against the limits of the Kafka and Redis it sits between, in
// one run on real services (make bench starts them): consume-only and Redis-only throughput of the
// same input, the full pipeline with and without duplicates and with and without AOF, produce→
// snapshot latency at half the measured maximum, processor CPU and memory, and Redis bytes per
// retained opportunity. Its last line is one JSON object with every figure. BENCH_EVENTS sizes it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/synth"
)

type env struct {
	brokers   []string
	redisAOF  string
	redisNone string
	bin       string
	dir       string
	n         int
	run       string
}

func main() {
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

func run() error {
	ctx := context.Background()
	n, err := strconv.Atoi(getenv("BENCH_EVENTS", "1000000"))
	if err != nil || n < 1000 {
		return fmt.Errorf("BENCH_EVENTS %q: want a number ≥ 1000", os.Getenv("BENCH_EVENTS"))
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
		bin:       filepath.Join(dir, "repeatrate"),
		dir:       dir,
		n:         n,
		run:       fmt.Sprintf("bench-%d", time.Now().Unix()),
	}
	build := exec.Command("go", "build", "-o", e.bin, "./cmd/repeatrate")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v: %s", err, out)
	}
	logf("machine: %s", machine())
	logf("events: %d", n)

	// Inputs: the same generator with and without 20 % duplicates (10 % re-assessments both).
	in20, err := e.input("dup20", 0.2)
	if err != nil {
		return err
	}
	in0, err := e.input("dup0", 0)
	if err != nil {
		return err
	}

	// The limits, like the pipeline below, are the faster of two runs.
	var consumeEPS, redisEPS float64
	for round := 1; round <= 2; round++ {
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

	// The three pipeline configurations run twice, the second round in reverse order, and each
	// keeps its faster run: a single run on two shared cores can lose a quarter of its speed to an
	// AOF rewrite, the JVM or another process, and the comparisons below are between
	// configurations, not disturbances or positions in the sequence.
	configs := []struct {
		name  string
		in    *input
		redis string
		best  *pipelineResult
	}{
		{"dup20 aof", in20, e.redisAOF, new(pipelineResult)},
		{"dup0 aof", in0, e.redisAOF, new(pipelineResult)},
		{"dup20 no-aof", in20, e.redisNone, new(pipelineResult)},
	}
	for _, round := range [][]int{{0, 1, 2}, {2, 1, 0}} {
		for _, c := range round {
			cf := configs[c]
			r, err := e.pipeline(ctx, cf.in, cf.redis)
			if err != nil {
				return err
			}
			logf("pipeline %s: %.0f events/s, %.4f round trips/event, %.5f commits/event, %.1f µs CPU/event, peak RSS %.0f MB, %d AOF rewrites",
				cf.name, r.eps, r.roundTrips, r.commits, r.cpuMicros, r.rssMB, r.aofRewrites)
			*cf.best = faster(*cf.best, r)
		}
	}
	p20, p0, pNone := *configs[0].best, *configs[1].best, *configs[2].best
	logf("best of two: dup20 aof %.0f, dup0 aof %.0f, dup20 no-aof %.0f events/s", p20.eps, p0.eps, pNone.eps)

	p50, p99, err := e.latency(ctx, p20.eps/2)
	if err != nil {
		return err
	}
	logf("latency at %.0f events/s: p50 %.1f ms, p99 %.1f ms", p20.eps/2, p50, p99)
	bytesPer, err := e.redisBytes(ctx)
	if err != nil {
		return err
	}
	logf("redis bytes per retained opportunity: %.1f", bytesPer)

	out := map[string]any{
		"events":                      n,
		"pipeline_eps":                math.Round(p20.eps),
		"consume_only_eps":            math.Round(consumeEPS),
		"redis_only_eps":              math.Round(redisEPS),
		"ratio":                       round(p20.eps/math.Min(consumeEPS, redisEPS), 3),
		"redis_roundtrips_per_event":  round(p20.roundTrips, 5),
		"commits_per_event":           round(p20.commits, 5),
		"dup20_vs_dup0":               round(p20.eps/p0.eps, 3),
		"aof_vs_noaof":                round(p20.eps/pNone.eps, 3),
		"p50_ms":                      round(p50, 1),
		"p99_ms":                      round(p99, 1),
		"redis_bytes_per_opportunity": round(bytesPer, 1),
		"rss_mb":                      round(p20.rssMB, 1),
		"cpu_us_per_event":            round(p20.cpuMicros, 2),
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	return nil
}

// faster returns whichever of two runs of one configuration processed events faster.
func faster(a, b pipelineResult) pipelineResult {
	if b.eps > a.eps {
		return b
	}
	return a
}

func round(x float64, digits int) float64 {
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

// input generates n events into a file and a topic of 4 partitions.
type input struct {
	file  string
	topic string
	n     int
}

func (e *env) input(name string, dup float64) (*input, error) {
	gen := synth.New(synth.Config{Seed: 11, Workspaces: 10, Corrections: 10, Duplicates: dup, Reassessed: 0.1, EvalShare: 0.3})
	in := &input{file: filepath.Join(e.dir, name+".ndjson"), topic: e.run + "." + name, n: e.n}
	f, err := os.Create(in.file)
	if err != nil {
		return nil, err
	}
	w := bufio.NewWriter(f)
	now := time.Now()
	for i := 0; i < e.n; i++ {
		line, _ := gen.Line(now)
		w.Write(line)
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	f.Close()
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: time.Minute}
	if _, err := client.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: in.topic, NumPartitions: 4, ReplicationFactor: 1}}}); err != nil {
		return nil, err
	}
	start := time.Now()
	cmd := exec.Command(e.bin, "produce", "--brokers", strings.Join(e.brokers, ","), "--topic", in.topic, "--in", in.file)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("produce: %v: %s", err, out)
	}
	logf("produced %s: %d events in %s", in.topic, e.n, time.Since(start).Round(time.Millisecond))
	return in, nil
}

// consumeOnly reads the whole topic with the processor's reader settings (one reader per
// partition, FetchMessage) and returns events per second.
func (e *env) consumeOnly(ctx context.Context, in *input) (float64, error) {
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	start := time.Now()
	for p := 0; p < 4; p++ {
		end, err := lastOffset(ctx, e.brokers, in.topic, p)
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Topic: in.topic, Partition: p,
				MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 250 * time.Millisecond})
			defer r.Close()
			for off := int64(0); off < end; {
				m, err := r.FetchMessage(ctx)
				if err != nil {
					errs <- err
					return
				}
				off = m.Offset + 1
				total.Add(1)
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return 0, err
	default:
	}
	return float64(total.Load()) / time.Since(start).Seconds(), nil
}

func lastOffset(ctx context.Context, brokers []string, topic string, p int) (int64, error) {
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: time.Minute}
	resp, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {kafka.LastOffsetOf(p)}}})
	if err != nil {
		return 0, err
	}
	for _, po := range resp.Topics[topic] {
		return po.LastOffset, po.Error
	}
	return 0, fmt.Errorf("no offsets for %s/%d", topic, p)
}

// redisOnly feeds the decoded input to the apply script in the processor's batches (2000
// messages, all pipelined, then the seal) and returns events per second.
func (e *env) redisOnly(ctx context.Context, in *input) (float64, error) {
	dec, err := consumer.NewDecoder(consumer.DefaultDecoderConfig)
	if err != nil {
		return 0, err
	}
	f, err := os.ReadFile(in.file)
	if err != nil {
		return 0, err
	}
	var obs []aggregator.Observation
	now := time.Now()
	for _, l := range bytes.Split(bytes.TrimSpace(f), []byte("\n")) {
		ev, err := dec.DecodeStructured(l, now)
		if err != nil {
			continue
		}
		if o, ok := ev.Observation(); ok {
			obs = append(obs, o)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: e.redisAOF})
	defer rdb.Close()
	store, err := aggregator.NewRedis(rdb, aggregator.RedisConfig{Prefix: e.run + "-redisonly", Retention: 30 * 24 * time.Hour})
	if err != nil {
		return 0, err
	}
	defer cleanup(rdb, e.run+"-redisonly")
	start := time.Now()
	const batch = 2000
	for i := 0; i < len(obs); i += batch {
		if _, err := store.Apply(ctx, obs[i:min(i+batch, len(obs))], now); err != nil {
			return 0, err
		}
		if _, err := store.Seal(ctx); err != nil {
			return 0, err
		}
	}
	// Per input event (messages), like the other figures; observations are fewer than events.
	return float64(in.n) / time.Since(start).Seconds(), nil
}

func cleanup(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+":*", 5000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 5000 {
			rdb.Unlink(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Unlink(ctx, keys...)
	}
}

type pipelineResult struct {
	eps, roundTrips, commits, cpuMicros, rssMB float64
	aofRewrites                                int // AOF rewrites Redis started during the run
}

// aofRewrites returns how many AOF rewrites the Redis at addr has done since it started (0 when
// AOF is off or the figure is unavailable).
func aofRewrites(ctx context.Context, addr string) int {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	s, _ := rdb.Info(ctx, "persistence").Result()
	for _, l := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(l, "aof_rewrites:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// pipeline runs the processor binary over the input topic and measures from its first processed
// batch to its last (startup and group join excluded), from its own /metrics.
func (e *env) pipeline(ctx context.Context, in *input, redisAddr string) (pipelineResult, error) {
	name := fmt.Sprintf("%s-%s-%d", e.run, filepath.Base(in.topic), time.Now().UnixNano()%1e6)
	port, err := freePort()
	if err != nil {
		return pipelineResult{}, err
	}
	cmd := exec.Command(e.bin, "run", "--kafka-create-topics", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
	cmd.Env = append(os.Environ(),
		"REPEATRATE_KAFKA_BROKERS="+strings.Join(e.brokers, ","),
		"REPEATRATE_KAFKA_GROUP_ID="+name,
		"REPEATRATE_KAFKA_INPUT_TOPICS="+in.topic,
		"REPEATRATE_KAFKA_SNAPSHOT_TOPIC="+name+".snapshots",
		"REPEATRATE_KAFKA_SUITE_TOPIC="+name+".suites",
		"REPEATRATE_KAFKA_ALERTS_TOPIC="+name+".alerts",
		"REPEATRATE_KAFKA_DLQ_TOPIC="+name+".dlq",
		"REPEATRATE_REDIS_ADDRS="+redisAddr,
		"REPEATRATE_REDIS_KEY_PREFIX="+name,
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return pipelineResult{}, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
		cleanup(rdb, name)
		rdb.Close()
	}()
	url := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	var first time.Time
	var cpu0 float64
	rewrites0 := aofRewrites(ctx, redisAddr)
	deadline := time.Now().Add(30 * time.Minute)
	for {
		if time.Now().After(deadline) {
			return pipelineResult{}, fmt.Errorf("pipeline did not finish: %s", stderr.String())
		}
		m, err := scrape(url)
		if err == nil {
			done := m["repeatrate_batch_messages_sum"]
			if done > 0 && first.IsZero() {
				first, cpu0 = time.Now(), cpuSeconds(cmd.Process.Pid)
			}
			if done >= float64(in.n) {
				el := time.Since(first).Seconds()
				cpu := cpuSeconds(cmd.Process.Pid) - cpu0
				return pipelineResult{
					eps:         float64(in.n) / el,
					roundTrips:  m["repeatrate_redis_roundtrips_total"] / float64(in.n),
					commits:     m[`repeatrate_offset_commits_total{result="ok"}`] / float64(in.n),
					cpuMicros:   cpu / float64(in.n) * 1e6,
					rssMB:       peakRSS(cmd.Process.Pid),
					aofRewrites: aofRewrites(ctx, redisAddr) - rewrites0,
				}, nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func scrape(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
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

func cpuSeconds(pid int) float64 {
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// latency produces live attempts at rate per second for a few seconds, each to an aggregate of its
// own, while the processor runs, and returns p50 and p99 of snapshot time − produce time (both
// Kafka timestamps of the same broker clock) in milliseconds.
func (e *env) latency(ctx context.Context, rate float64) (float64, float64, error) {
	name := fmt.Sprintf("%s-latency", e.run)
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: time.Minute}
	if _, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: name + ".in", NumPartitions: 4, ReplicationFactor: 1},
		{Topic: name + ".snapshots", NumPartitions: 4, ReplicationFactor: 1}}}); err != nil {
		return 0, 0, err
	}
	port, _ := freePort()
	cmd := exec.Command(e.bin, "run", "--kafka-create-topics", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
	cmd.Env = append(os.Environ(),
		"REPEATRATE_KAFKA_BROKERS="+strings.Join(e.brokers, ","), "REPEATRATE_KAFKA_GROUP_ID="+name,
		"REPEATRATE_KAFKA_INPUT_TOPICS="+name+".in", "REPEATRATE_KAFKA_SNAPSHOT_TOPIC="+name+".snapshots",
		"REPEATRATE_KAFKA_SUITE_TOPIC="+name+".suites", "REPEATRATE_KAFKA_ALERTS_TOPIC="+name+".alerts",
		"REPEATRATE_KAFKA_DLQ_TOPIC="+name+".dlq", "REPEATRATE_REDIS_ADDRS="+e.redisAOF, "REPEATRATE_REDIS_KEY_PREFIX="+name)
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		rdb := redis.NewClient(&redis.Options{Addr: e.redisAOF})
		cleanup(rdb, name)
		rdb.Close()
	}()
	// Wait until the processor has joined: its metrics answer and the group is stable.
	for i := 0; i < 300; i++ {
		if _, err := scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", port)); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)

	// 200 aggregates; every event is a new opportunity, so the k-th event of an aggregate is in
	// the first snapshot of it that counts k opportunities.
	const aggs = 200
	w := &kafka.Writer{Addr: kafka.TCP(e.brokers...), Topic: name + ".in", Balancer: &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000, Async: true}
	total := int(math.Min(rate*10, 300000))
	sent := make([][]time.Time, aggs)
	var mu sync.Mutex
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	perTick := max(1, int(rate/100))
	for i := 0; i < total; {
		<-tick.C
		var msgs []kafka.Message
		for end := min(i+perTick, total); i < end; i++ {
			now := time.Now().UTC()
			a := i % aggs
			line := fmt.Sprintf(`{"specversion":"1.0","id":"l%d","source":"bench","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":"lat","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o%d","correction_id":"fix-%d","occurred_at":%q,"assessed_at":%q,"outcome":"passed"}}`,
				i, i, a, now.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
			msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("lat|m|r|c|a|fix-%d|live", a)), Value: []byte(line), Time: now})
			mu.Lock()
			sent[a] = append(sent[a], now)
			mu.Unlock()
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return 0, 0, err
		}
	}
	var lat []float64
	resolved := make([]int, aggs)
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for p := 0; p < 4; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Topic: name + ".snapshots", Partition: p, MaxWait: 100 * time.Millisecond})
			defer r.Close()
			for {
				m, err := r.FetchMessage(rctx)
				if err != nil {
					return
				}
				var ev struct {
					Data struct {
						Aggregate struct {
							CorrectionID string `json:"correction_id"`
						} `json:"aggregate"`
						Windows struct {
							All struct {
								Passed int `json:"passed"`
							} `json:"all"`
						} `json:"windows"`
					} `json:"data"`
				}
				if json.Unmarshal(m.Value, &ev) != nil {
					continue
				}
				a, err := strconv.Atoi(strings.TrimPrefix(ev.Data.Aggregate.CorrectionID, "fix-"))
				if err != nil || a < 0 || a >= aggs {
					continue
				}
				mu.Lock()
				for ; resolved[a] < ev.Data.Windows.All.Passed && resolved[a] < len(sent[a]); resolved[a]++ {
					lat = append(lat, float64(m.Time.Sub(sent[a][resolved[a]]).Microseconds())/1000)
				}
				done := len(lat) == total
				mu.Unlock()
				if done {
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(lat) < total {
		return 0, 0, fmt.Errorf("latency: %d of %d events seen in snapshots", len(lat), total)
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}

// redisBytes applies 500 000 distinct opportunities over 100 aggregates to the Redis without AOF
// and returns the memory growth per opportunity.
func (e *env) redisBytes(ctx context.Context) (float64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: e.redisNone})
	defer rdb.Close()
	prefix := e.run + "-mem"
	defer cleanup(rdb, prefix)
	store, err := aggregator.NewRedis(rdb, aggregator.RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour})
	if err != nil {
		return 0, err
	}
	used := func() float64 {
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
	before := used()
	const total = 500_000
	now := time.Now()
	obs := make([]aggregator.Observation, 0, 2000)
	for i := 0; i < total; i++ {
		occ := aggregator.Micros(now) - int64(i%86400)*1e6
		k := aggregator.Key{CorrectionID: fmt.Sprintf("fix-%d", i%100), Source: aggregator.Live}
		k.Scope.Workspace, k.Scope.Model, k.Scope.Run, k.Scope.Checkpoint, k.Scope.Artifact = "acme", "support-bot", "2026-11", "ckpt-42", "prod"
		obs = append(obs, aggregator.Observation{Key: k, OpportunityID: fmt.Sprintf("conv-%07d/turn-%d", i/3, i%3),
			Class: aggregator.Class(1 + i%3), Occurred: occ, Assessed: occ + 1e6})
		if len(obs) == cap(obs) {
			if _, err := store.Apply(ctx, obs, now); err != nil {
				return 0, err
			}
			obs = obs[:0]
		}
	}
	return (used() - before) / total, nil
}
