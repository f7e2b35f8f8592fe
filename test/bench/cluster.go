package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/synth"
)

// clusterPartitions is the input topic's partition count in the cluster mode: divisible by 1, 2
// and 3 processors, so every instance count gets an even share.
const clusterPartitions = 12

// clusterVariant is one configuration the cluster mode measures: k processors, each waiting for
// wait replicas per primary before a commit (redis.wait_replicas; 0 relies on the seal alone).
type clusterVariant struct{ k, wait int }

func (v clusterVariant) String() string {
	if v.wait == 0 {
		return fmt.Sprintf("instances_%d", v.k)
	}
	return fmt.Sprintf("instances_%d_wait_%d", v.k, v.wait)
}

// clusterVariants are what the cluster mode measures, in this order: 1, 2 and 3 processors with
// the seal alone, then 1 and 3 with WAIT for one replica.
var clusterVariants = []clusterVariant{{1, 0}, {2, 0}, {3, 0}, {1, 1}, {3, 1}}

// clusterResult is one run of k processors in one group over the cluster input. Per-event figures
// divide by the events processed between the moment every instance had its first batch and the
// last batch (so group joins and the commit after the last batch are left out).
type clusterResult struct {
	instances  int
	wait       int // redis.wait_replicas
	eps        float64
	procMicros float64   // all processors' CPU µs per event
	primaries  []primary // per Redis primary
	kafkaMicro float64   // the three brokers' CPU µs per event (NaN when a pid is not found)
	measured   float64   // events in the measured interval
	seconds    float64
}

// primary is one Redis primary's share of a run.
type primary struct {
	addr          string
	cpuMicros     float64 // main-process CPU µs per event processed by the whole pipeline
	callsPerEvent float64 // commands it served (INFO commandstats) per event
}

// clusterMode measures throughput with 1, 2 and 3 `repeatrate run` instances (and 1 and 3 with
// redis.wait_replicas 1: the cost of WAIT against the seal alone) on a 12-partition
// input (today's shape, 20 % duplicates) at replication factor 3 on the three brokers of
// deploy/local/kafka-cluster.sh, against the Redis Cluster of deploy/local/redis-cluster.sh
// (BENCH_CLUSTER_KAFKA, BENCH_CLUSTER_REDIS). Each count runs BENCH_ROUNDS times with a group and
// key prefix of its own; the faster run is kept.
func (e *env) clusterMode(ctx context.Context) error {
	e.brokers = strings.Split(getenv("BENCH_CLUSTER_KAFKA", "127.0.0.1:19301,127.0.0.1:19302,127.0.0.1:19303"), ",")
	redisAddrs := strings.Split(getenv("BENCH_CLUSTER_REDIS", "127.0.0.1:17001,127.0.0.1:17002,127.0.0.1:17003,127.0.0.1:17004,127.0.0.1:17005,127.0.0.1:17006"), ",")
	defer e.deleteTopics(ctx)
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redisAddrs})
	defer rc.Close()
	var primaries []string
	if err := rc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		primaries = append(primaries, c.Options().Addr)
		return nil
	}); err != nil {
		return fmt.Errorf("redis cluster %v: %w", redisAddrs, err)
	}
	slices.Sort(primaries)
	var kafkaPIDs []int
	for _, b := range e.brokers {
		_, port, _ := net.SplitHostPort(b)
		kafkaPIDs = append(kafkaPIDs, listenerPID(port))
	}
	logf("machine: %s", machine())
	logf("cluster mode: %d events, %d input partitions, brokers %v (pids %v), Redis primaries %v, rounds %d",
		e.n, clusterPartitions, e.brokers, kafkaPIDs, primaries, e.rounds)

	in, err := e.clusterInput(ctx)
	if err != nil {
		return err
	}
	best := map[clusterVariant]clusterResult{}
	for round := 1; round <= e.rounds; round++ {
		order := slices.Clone(clusterVariants)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, v := range order {
			r, err := e.clusterRun(ctx, in, v, redisAddrs, primaries, kafkaPIDs)
			if err != nil {
				return err
			}
			logf("%s", r.describe())
			if r.eps > best[v].eps {
				best[v] = r
			}
		}
	}
	out := map[string]any{"mode": "cluster", "events": e.n, "partitions": clusterPartitions, "cores": e.cores, "rounds": e.rounds}
	one := best[clusterVariant{1, 0}].eps
	for _, v := range clusterVariants {
		r := best[v]
		m := map[string]any{
			"pipeline_eps":               num(r.eps, 0),
			"vs_one_instance":            num(r.eps/one, 3),
			"processor_cpu_us_per_event": num(r.procMicros, 2),
			"kafka_cpu_us_per_event":     num(r.kafkaMicro, 2),
			"measured_events":            num(r.measured, 0),
		}
		if v.wait > 0 {
			// The cost of WAIT against the seal alone, same instance count, same run.
			m["vs_seal_alone"] = num(r.eps/best[clusterVariant{v.k, 0}].eps, 3)
		}
		var ps []map[string]any
		for _, p := range r.primaries {
			ps = append(ps, map[string]any{"addr": p.addr, "cpu_us_per_event": num(p.cpuMicros, 2), "commands_per_event": num(p.callsPerEvent, 3),
				"events_per_cpu_second": num(1e6/p.cpuMicros, 0)})
		}
		m["redis_primaries"] = ps
		out[v.String()] = m
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

func (r clusterResult) describe() string {
	s := fmt.Sprintf("cluster %d instance(s), wait_replicas %d: %.0f events/s over %.1f s (%.0f events), processor CPU %.1f µs/event, Kafka %.1f µs/event; Redis primaries:",
		r.instances, r.wait, r.eps, r.seconds, r.measured, r.procMicros, r.kafkaMicro)
	for _, p := range r.primaries {
		s += fmt.Sprintf(" %s %.1f µs/event %.3f cmds/event;", p.addr, p.cpuMicros, p.callsPerEvent)
	}
	return s
}

// clusterInput generates today's shape (20 % duplicates) and produces it to a topic of
// clusterPartitions partitions at replication factor 3, min.insync.replicas 2.
func (e *env) clusterInput(ctx context.Context) (*input, error) {
	in := &input{shape: shapeToday, file: e.dir + "/cluster.ndjson", topic: e.run + ".cluster"}
	gen := synth.New(synth.Config{Seed: 11, Workspaces: 10, Corrections: 10, Duplicates: 0.2, Reassessed: 0.1, EvalShare: 0.3})
	now := time.Now()
	f, err := os.Create(in.file)
	if err != nil {
		return nil, err
	}
	for range e.n {
		l, _ := gen.Line(now)
		f.Write(append(l, '\n'))
		in.n++
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: time.Minute}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: in.topic, NumPartitions: clusterPartitions,
		ReplicationFactor: 3, ConfigEntries: []kafka.ConfigEntry{{ConfigName: "min.insync.replicas", ConfigValue: "2"}}}}})
	if err != nil {
		return nil, err
	}
	for tp, err := range res.Errors {
		if err != nil {
			return nil, fmt.Errorf("create %s: %w", tp, err)
		}
	}
	start := time.Now()
	if out, err := exec.Command(e.bins[0].path, "produce", "--brokers", strings.Join(e.brokers, ","), "--topic", in.topic, "--in", in.file).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("produce: %v: %s", err, out)
	}
	logf("produced %s: %d events in %s (acks=all, RF 3)", in.topic, in.n, time.Since(start).Round(time.Millisecond))
	return in, nil
}

// clusterSample is what the measurement reads at one moment.
type clusterSample struct {
	at       time.Time
	messages float64 // processed by all instances (repeatrate_batch_messages_sum)
	procCPU  float64
	kafkaCPU float64
	redisCPU []float64
	calls    []float64
}

func (e *env) clusterSample(ctx context.Context, pids, kafkaPIDs []int, primaries []string, messages float64) clusterSample {
	s := clusterSample{at: time.Now(), messages: messages}
	for _, p := range pids {
		s.procCPU += cpuSeconds(p)
	}
	for _, p := range kafkaPIDs {
		s.kafkaCPU += cpuSeconds(p)
	}
	for _, a := range primaries {
		s.redisCPU = append(s.redisCPU, redisCPU(ctx, a))
		s.calls = append(s.calls, commandCalls(ctx, a))
	}
	return s
}

// clusterRun runs k processors in one new group over the input until the group has committed
// every partition's end offset. The measured interval runs from the first moment every instance
// has processed a batch to the last moment the processed count grew.
func (e *env) clusterRun(ctx context.Context, in *input, v clusterVariant, redisAddrs, primaries []string, kafkaPIDs []int) (clusterResult, error) {
	k := v.k
	name := fmt.Sprintf("%s-c%d-w%d-%d", e.run, k, v.wait, time.Now().UnixNano()%1e6)
	type instance struct {
		cmd    *exec.Cmd
		url    string
		exited chan struct{}
	}
	var insts []*instance
	defer func() {
		for _, p := range insts {
			p.cmd.Process.Kill()
			<-p.exited
		}
		rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redisAddrs})
		rc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { cleanup(c, name); return nil })
		rc.Close()
	}()
	var pids []int
	for range k {
		port, err := freePort()
		if err != nil {
			return clusterResult{}, err
		}
		cmd := exec.Command(e.bins[0].path, "run", "--kafka-create-topics", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
		cmd.Env = append(os.Environ(), e.processorEnv(name, in.topic, strings.Join(redisAddrs, ","))...)
		cmd.Env = append(cmd.Env, fmt.Sprintf("REPEATRATE_REDIS_WAIT_REPLICAS=%d", v.wait))
		if err := cmd.Start(); err != nil {
			return clusterResult{}, err
		}
		p := &instance{cmd: cmd, url: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), exited: make(chan struct{})}
		go func() { cmd.Wait(); close(p.exited) }()
		insts = append(insts, p)
		pids = append(pids, cmd.Process.Pid)
	}
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: 10 * time.Second}
	ends := map[int]int64{}
	for p := range clusterPartitions {
		off, err := lastOffset(ctx, e.brokers, in.topic, p)
		if err != nil {
			return clusterResult{}, err
		}
		ends[p] = off
	}
	deadline := time.Now().Add(e.timeout)
	var first, last clusterSample
	var prev float64
	for {
		for i, p := range insts {
			select {
			case <-p.exited:
				return clusterResult{}, fmt.Errorf("cluster run %d: instance %d exited", k, i)
			default:
			}
		}
		if time.Now().After(deadline) {
			return clusterResult{}, fmt.Errorf("cluster run %d: not done within %s", k, e.timeout)
		}
		total, all, scraped := 0.0, true, true
		for _, p := range insts {
			m, err := scrape(p.url)
			n := m["repeatrate_batch_messages_sum"]
			scraped = scraped && err == nil
			all = all && err == nil && n > 0
			total += n
		}
		if all && first.at.IsZero() {
			first = e.clusterSample(ctx, pids, kafkaPIDs, primaries, total)
			last, prev = first, total
		} else if scraped && !first.at.IsZero() && total > prev { // a failed scrape is no total
			last, prev = e.clusterSample(ctx, pids, kafkaPIDs, primaries, total), total
		}
		if !first.at.IsZero() && committedAll(ctx, client, name, in.topic, ends) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	n := last.messages - first.messages
	if n <= 0 {
		return clusterResult{}, fmt.Errorf("cluster run %d: nothing processed after every instance joined (raise BENCH_EVENTS)", k)
	}
	r := clusterResult{instances: k, wait: v.wait, measured: n, seconds: last.at.Sub(first.at).Seconds(), kafkaMicro: math.NaN()}
	r.eps = n / r.seconds
	r.procMicros = (last.procCPU - first.procCPU) / n * 1e6
	if !slices.Contains(kafkaPIDs, 0) {
		r.kafkaMicro = (last.kafkaCPU - first.kafkaCPU) / n * 1e6
	}
	for i, a := range primaries {
		r.primaries = append(r.primaries, primary{addr: a, cpuMicros: (last.redisCPU[i] - first.redisCPU[i]) / n * 1e6,
			callsPerEvent: (last.calls[i] - first.calls[i]) / n})
	}
	return r, nil
}

// committedAll reports whether group has committed ends (partition → end offset) on topic.
func committedAll(ctx context.Context, c *kafka.Client, group, topic string, ends map[int]int64) bool {
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	res, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil || res.Error != nil {
		return false
	}
	got := res.Topics[topic]
	if len(got) != len(ends) {
		return false
	}
	for _, p := range got {
		if p.Error != nil || p.CommittedOffset < ends[p.Partition] {
			return false
		}
	}
	return true
}

// commandStat is one command's line of INFO commandstats: the calls served and the µs spent in them.
type commandStat struct{ calls, usec float64 }

// redisActivity is what a Redis has done since it started (or its statistics were reset): the
// bytes it read from clients and wrote to them, and its commands (INFO stats and commandstats).
type redisActivity struct {
	in, out  float64
	commands map[string]commandStat // by command, cmdstat_ dropped
}

// activity reads a redisActivity from the Redis at addr (zero when it cannot).
func activity(ctx context.Context, addr string) redisActivity {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	s, _ := rdb.Info(ctx, "stats", "commandstats").Result()
	a := redisActivity{in: infoValue(s, "total_net_input_bytes"), out: infoValue(s, "total_net_output_bytes"),
		commands: map[string]commandStat{}}
	for _, l := range strings.Split(s, "\r\n") {
		rest, ok := strings.CutPrefix(l, "cmdstat_")
		if !ok {
			continue
		}
		name, stats, _ := strings.Cut(rest, ":")
		var c commandStat
		for _, f := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(f, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				c.calls = x
			case "usec":
				c.usec = x
			}
		}
		a.commands[name] = c
	}
	return a
}

// since describes what Redis did between a and later, per event of n: the bytes it read from and
// wrote to clients, and each command's calls and µs, the largest first, for the commands that took
// at least 0.01 µs an event. A script's time includes the commands it called, which count in their
// own lines too; reading, parsing and replying, and the server's own cron, are in none.
func (a redisActivity) since(later redisActivity, n int) string {
	type row struct {
		name        string
		calls, usec float64
	}
	var rows []row
	for name, c := range later.commands {
		d := row{name, (c.calls - a.commands[name].calls) / float64(n), (c.usec - a.commands[name].usec) / float64(n)}
		if d.usec >= 0.01 {
			rows = append(rows, d)
		}
	}
	slices.SortFunc(rows, func(x, y row) int { return cmp.Compare(y.usec, x.usec) })
	var b strings.Builder
	fmt.Fprintf(&b, "bytes/event in %.0f, out %.0f", (later.in-a.in)/float64(n), (later.out-a.out)/float64(n))
	for _, r := range rows {
		fmt.Fprintf(&b, "; %s %.3f calls %.2f µs", r.name, r.calls, r.usec)
	}
	return b.String()
}

// commandCalls returns the commands the Redis at addr has served since its statistics were
// reset: the sum of calls over INFO commandstats.
func commandCalls(ctx context.Context, addr string) float64 {
	total := 0.0
	for _, c := range activity(ctx, addr).commands {
		total += c.calls
	}
	return total
}
