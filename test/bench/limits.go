package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
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
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

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
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
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
		if _, err := store.Seal(ctx, nil); err != nil {
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// latency runs bin while live attempts are produced at rate per second for 10 s, each a new
// opportunity of one of 200 aggregates, and returns every event's snapshot time − produce time
// (both Kafka timestamps of the same broker clock) in milliseconds, sorted.
func (e *env) latency(ctx context.Context, bin binary, rate float64) (latencies, error) {
	e.latencies++
	name := fmt.Sprintf("%s-latency-%s-%.0f-%d", e.run, bin.name, rate, e.latencies)
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: time.Minute}
	if _, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: name + ".in", NumPartitions: 4, ReplicationFactor: 1},
		{Topic: name + ".snapshots", NumPartitions: 4, ReplicationFactor: 1}}}); err != nil {
		return nil, err
	}
	settle(ctx, e.redisAOF)
	port, _ := freePort()
	cmd := exec.Command(bin.path, "run", "--kafka-create-topics", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn")
	cmd.Env = append(os.Environ(), e.processorEnv(name, name+".in", e.redisAOF)...)
	if err := cmd.Start(); err != nil {
		return nil, err
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
	total := int(rate * 10)
	sent := make([][]time.Time, aggs)
	var mu sync.Mutex
	// The machine's cores while sending: the processor, Redis, the broker and this harness.
	if e.kafkaPID == 0 {
		e.kafkaPID, _ = kafkaBrokerPID(e.brokers[0])
	}
	cpu0, redis0, kafka0, self0 := cpuSeconds(cmd.Process.Pid), redisCPU(ctx, e.redisAOF), cpuSeconds(e.kafkaPID), cpuSeconds(os.Getpid())
	// Redis rewrites its AOF each time it doubles past 64 MB (auto-aof-rewrite-*): the fork and
	// the child take the cores for a second or so, which shows in that second's latency.
	rewrites0 := aofRewrites(ctx, e.redisAOF)
	began := time.Now()
	rewrites := watchRewrites(ctx, e.redisAOF, began)
	if dir := os.Getenv("BENCH_PPROF"); dir != "" { // a profile of the processor while sending
		var prof sync.WaitGroup
		prof.Add(1)
		go func() {
			defer prof.Done()
			saveProfile(fmt.Sprintf("http://127.0.0.1:%d", port), filepath.Join(dir, name+".pprof"))
		}()
		defer prof.Wait() // before the processor is stopped
	}
	keys := aggregateKeys(aggs)
	if err := produceAt(ctx, e.brokers, name+".in", rate, total, func(i int, now time.Time, stamp, v []byte) ([]byte, []byte) {
		a := i % aggs
		v = append(v, `{"specversion":"1.0","id":"l`...)
		v = strconv.AppendInt(v, int64(i), 10)
		v = append(v, `","source":"bench","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":"lat","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o`...)
		v = strconv.AppendInt(v, int64(i), 10)
		v = append(v, `","correction_id":"fix-`...)
		v = strconv.AppendInt(v, int64(a), 10)
		v = append(v, `","occurred_at":"`...)
		v = append(v, stamp...)
		v = append(v, `","assessed_at":"`...)
		v = append(v, stamp...)
		v = append(v, `","outcome":"passed"}}`...)
		mu.Lock()
		sent[a] = append(sent[a], now)
		mu.Unlock()
		return keys[a], v
	}); err != nil {
		return nil, err
	}
	sending := time.Since(began).Seconds()
	cpu, redisCores := (cpuSeconds(cmd.Process.Pid)-cpu0)/sending, (redisCPU(ctx, e.redisAOF)-redis0)/sending
	kafkaCores, selfCores := (cpuSeconds(e.kafkaPID)-kafka0)/sending, (cpuSeconds(os.Getpid())-self0)/sending
	e.brokerMicros = kafkaCores * sending / float64(total) * 1e6
	// The snapshots are read once the processor has published every event's: readers decoding
	// them meanwhile took the two cores from the processor (p50 of the last second of sending
	// 887 ms against 100–200 before it). Snapshot times are the processor's, read at any time.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		m, err := scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
		if err == nil && m[`repeatrate_events_total{type="repeatrate.live.attempt.v1"}`] >= float64(total) && m[`repeatrate_batch_stage_seconds_count{stage="publish"}`] == m[`repeatrate_batch_stage_seconds_count{stage="prepare"}`] {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("latency: the processor did not publish %d events within 2 minutes", total)
		}
	}
	var lat []float64
	bySecond := map[int][]float64{} // latencies by the second of sending their event was sent in
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
					l := float64(m.Time.Sub(sent[a][resolved[a]]).Microseconds()) / 1000
					lat = append(lat, l)
					sec := int(sent[a][resolved[a]].Sub(began) / time.Second)
					bySecond[sec] = append(bySecond[sec], l)
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
		return nil, fmt.Errorf("latency: %d of %d events seen in snapshots", len(lat), total)
	}
	logf("latency: %d events sent in %.1f s (%.0f events/s); Redis rewrote its AOF %d times meanwhile", total, sending, float64(total)/sending, aofRewrites(ctx, e.redisAOF)-rewrites0)
	logf("latency: Redis's AOF while sending and publishing: %s", rewrites())
	// The tail: the share of events over 250 ms, and the highest latency of each second of sending.
	var over int
	for _, l := range lat {
		if l > 250 {
			over++
		}
	}
	slices.Sort(lat)
	var seconds []string
	for sec := 0; len(bySecond[sec]) > 0; sec++ {
		l := bySecond[sec]
		slices.Sort(l)
		seconds = append(seconds, fmt.Sprintf("%d: p50 %.0f p99 %.0f", sec, l[len(l)/2], l[len(l)*99/100]))
	}
	logf("latency by second of sending (ms): %s", strings.Join(seconds, "; "))
	logf("latency tail: p90 %.1f, p99.9 %.1f, max %.1f ms; %.2f %% over 250 ms", lat[len(lat)*9/10], lat[len(lat)*999/1000], lat[len(lat)-1], 100*float64(over)/float64(len(lat)))
	// Where the time went: each stage's mean per batch (the processor's histograms).
	if m, err := scrape(fmt.Sprintf("http://127.0.0.1:%d/metrics", port)); err == nil {
		mean := func(stage string) float64 {
			return 1000 * m[`repeatrate_batch_stage_seconds_sum{stage="`+stage+`"}`] / m[`repeatrate_batch_stage_seconds_count{stage="`+stage+`"}`]
		}
		step := func(step string) float64 {
			return 1000 * m[`repeatrate_batch_step_seconds_sum{step="`+step+`"}`] / m[`repeatrate_batch_step_seconds_count{step="`+step+`"}`]
		}
		logf("latency stages (mean ms per batch): input %.1f, queued_collect %.1f, collect %.1f, queued_prepare %.1f, prepare %.1f, queued_apply %.1f, apply %.1f (steps apply %.1f, seal %.1f), queued_publish %.1f, publish %.1f, commit %.1f; %.0f messages per batch; cores while sending: processor %.2f, Redis %.2f, Kafka %.2f, harness %.2f",
			mean("input"), mean("queued_collect"), mean("collect"), mean("queued_prepare"), mean("prepare"), mean("queued_apply"), mean("apply"), step("apply"), step("seal"), mean("queued_publish"), mean("publish"), mean("commit"),
			m["repeatrate_batch_messages_sum"]/m["repeatrate_batch_messages_count"], cpu, redisCores, kafkaCores, selfCores)
		if s := computedShare(m); s != "" {
			logf("calls: %s", s)
		}
	}
	return lat, nil
}

// produceAt writes total records to topic at rate per second, in ticks of 10 ms. Every record due
// at a tick is made by msg(i, now, stamp, value), which appends the record's value to value and
// returns its key and the longer value; now is the tick's time and stamp now in RFC 3339, formatted
// once a tick. What is due is counted from the start, so a write slower than a tick (dropped ticks)
// does not lower the rate.
//
// The producer is franz-go's, acknowledged by every replica with a 1 ms linger: on the two cores
// the processor, Redis and the broker share, the load generator is the one process that is not
// the system measured, and kafka-go's writer with a record formatted by fmt took 0.26–0.47 cores
// at 75 000 records/s where this takes about half (docs/performance.md, "The harness's producer").
// A broker that stops answering fails the call within two minutes of the sending's planned end
// (franz-go retries a record without end by default), so the bench fails instead of hanging.
func produceAt(ctx context.Context, brokers []string, topic string, rate float64, total int,
	msg func(i int, now time.Time, stamp, value []byte) (key, longer []byte)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(float64(total)/rate*float64(time.Second))+2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), kgo.ProducerLinger(time.Millisecond),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordDeliveryTimeout(time.Minute))
	if err != nil {
		return err
	}
	defer cl.Close()
	var failed atomic.Pointer[error]
	done := func(_ *kgo.Record, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	began := time.Now()
	var stamp []byte
	for i := 0; i < total; {
		<-tick.C
		if p := failed.Load(); p != nil {
			return *p
		}
		now := time.Now().UTC()
		stamp = now.AppendFormat(stamp[:0], time.RFC3339Nano)
		// A tick's values share one buffer, never reused: the records are sent after this returns.
		var buf []byte
		for end := min(int(time.Since(began).Seconds()*rate)+1, total); i < end; i++ {
			from := len(buf)
			var key []byte
			key, buf = msg(i, now, stamp, buf)
			cl.Produce(ctx, &kgo.Record{Key: key, Value: buf[from:len(buf):len(buf)], Timestamp: now}, done)
		}
	}
	if err := cl.Flush(ctx); err != nil {
		return err
	}
	if p := failed.Load(); p != nil {
		return *p
	}
	return nil
}

// latencies are produce → snapshot latencies in milliseconds, sorted.
type latencies []float64

// at is the q-quantile (0 ≤ q < 1): the latency of rank ⌊q·n⌋ from the lowest.
func (l latencies) at(q float64) float64 {
	if len(l) == 0 {
		return math.NaN()
	}
	return l[int(q*float64(len(l)))]
}

// pooled sorts the latencies of several runs together: a quantile of them is one over all the runs'
// events, so a slow run weighs as much as its events, neither more nor less.
func pooled(runs []latencies) latencies {
	var all latencies
	for _, r := range runs {
		all = append(all, r...)
	}
	slices.Sort(all)
	return all
}

// spread is the lowest and highest of each run's q-quantile, as "a–b".
func spread(runs []latencies, q float64) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range runs {
		lo, hi = math.Min(lo, r.at(q)), math.Max(hi, r.at(q))
	}
	return fmt.Sprintf("%.1f–%.1f", lo, hi)
}

// aggregateKeys are the partition keys of the latency runs' aggregates, as the processor keys them.
func aggregateKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for a := range keys {
		keys[a] = []byte("lat|m|r|c|a|fix-" + strconv.Itoa(a) + "|live")
	}
	return keys
}

// transportFloor sends live attempts at rate for 10 s the way latency does (same writer, same
// 4-partition topic, no processor) while a reader per partition with the processor's settings reads
// them, and returns p50 and p99 of read time − produce timestamp in milliseconds: what Kafka and
// the harness's own producer add to every latency figure before the processor sees an event.
func (e *env) transportFloor(ctx context.Context, rate float64) (float64, float64, error) {
	return e.paced(ctx, rate, 10*time.Second, "floor")
}

// warmBroker sends the transport floor's traffic at rate for BENCH_WARMUP (60 s by default; 0
// skips it), unmeasured, before the latency runs, and logs the broker's cores over its first and
// last 10 s. A broker the bench just started runs its request paths interpreted or half compiled
// for about a minute of this traffic, at about twice the CPU of a warm one, on the two cores the
// processor and Redis share; production brokers are warm.
func (e *env) warmBroker(ctx context.Context, rate float64) error {
	d, err := time.ParseDuration(getenv("BENCH_WARMUP", "60s"))
	if err != nil {
		return fmt.Errorf("BENCH_WARMUP: %w", err)
	}
	if d <= 0 {
		return nil
	}
	if d < 30*time.Second {
		return fmt.Errorf("BENCH_WARMUP: at least 30s (its first and last 10 s are measured), or 0, got %v", d)
	}
	if e.kafkaPID == 0 {
		e.kafkaPID, _ = kafkaBrokerPID(e.brokers[0])
	}
	// The broker's cores are sampled beside the traffic, by a goroutine this call stops and waits
	// for on every way out.
	var first, last float64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		wait := func(w time.Duration) bool {
			select {
			case <-time.After(w):
				return true
			case <-stop:
				return false
			}
		}
		cores := func() (float64, bool) {
			c := cpuSeconds(e.kafkaPID)
			if !wait(10 * time.Second) {
				return 0, false
			}
			return (cpuSeconds(e.kafkaPID) - c) / 10, true
		}
		var ok bool
		if first, ok = cores(); !ok || !wait(d-20*time.Second) {
			return
		}
		last, _ = cores()
	}()
	_, _, err = e.paced(ctx, rate, d, "warmup")
	if err != nil {
		close(stop)
		<-done
		return err
	}
	<-done
	logf("broker warm-up: %v of the transport floor's traffic at %.0f events/s, unmeasured; broker cores %.2f in its first 10 s, %.2f in its last", d, rate, first, last)
	// The harness's traffic leaves the processor's own requests cold: its consumer group's
	// fetches and commits and its snapshot writes. Whichever build ran first met them: at
	// 47 000/s the broker took 0.54-0.58 cores through the first round of latency runs and
	// 0.30-0.34 through the second, and the first run's second 0 read p50 71-267 ms; after one
	// such run at 80 555/s it still fell run by run, from 5.1 to 3.4 µs an event, so that the
	// build measured first met a slower broker. Latency runs of the current build, logged and not
	// counted, go on until the broker's CPU per event falls by less than a tenth (at most 5).
	prev := math.NaN()
	for i := 1; i <= 5; i++ {
		lat, err := e.latency(ctx, e.bins[0], rate)
		if err != nil {
			return err
		}
		logf("broker warm-up: latency run %d of %s at %.0f events/s, not counted: p50 %.1f ms, p99 %.1f ms, broker %.2f µs an event",
			i, e.bins[0].name, rate, lat.at(0.5), lat.at(0.99), e.brokerMicros)
		if math.IsNaN(e.brokerMicros) || e.brokerMicros > 0.9*prev {
			break // settled, or not measured (the broker's pid unknown)
		}
		prev = e.brokerMicros
	}
	return nil
}

// paced sends live attempts at rate for d to a new 4-partition topic while a reader per partition
// with the processor's settings reads them, and returns p50 and p99 of read time − produce
// timestamp in milliseconds.
func (e *env) paced(ctx context.Context, rate float64, d time.Duration, what string) (float64, float64, error) {
	name := fmt.Sprintf("%s-%s-%.0f", e.run, what, rate)
	client := &kafka.Client{Addr: kafka.TCP(e.brokers...), Timeout: time.Minute}
	if _, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		{Topic: name, NumPartitions: 4, ReplicationFactor: 1}}}); err != nil {
		return 0, 0, err
	}
	defer client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{name}})
	total := int(rate * d.Seconds())
	var mu sync.Mutex
	lat := make([]float64, 0, total)
	rctx, cancel := context.WithTimeout(ctx, d+2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: e.brokers, Topic: name, Partition: p, MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 250 * time.Millisecond})
			defer r.Close()
			for {
				m, err := r.FetchMessage(rctx)
				if err != nil {
					return
				}
				mu.Lock()
				lat = append(lat, float64(time.Since(m.Time).Microseconds())/1000)
				done := len(lat) == total
				mu.Unlock()
				if done {
					cancel()
					return
				}
			}
		}()
	}
	time.Sleep(time.Second)    // the readers have their partitions
	value := make([]byte, 420) // about a live attempt's size
	keys := aggregateKeys(200)
	if err := produceAt(ctx, e.brokers, name, rate, total, func(i int, _ time.Time, _, v []byte) ([]byte, []byte) {
		return keys[i%200], append(v, value...)
	}); err != nil {
		return 0, 0, err
	}
	wg.Wait()
	if len(lat) < total {
		return 0, 0, fmt.Errorf("%s: %d of %d events read", what, len(lat), total)
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], nil
}

// redisBytes is Redis's used_memory growth per retained opportunity (after MEMORY PURGE) over
// 500 000 distinct opportunities in 100 aggregates, applied in batches of 2 000 with occurred
// times spread over span (a day, as make bench has always reported, or 30 days, where an
// aggregate holds 7 an hour), in a namespace of the given state layout, on the Redis without AOF.
func (e *env) redisBytes(ctx context.Context, layout aggregator.Layout, span time.Duration) (float64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: e.redisNone})
	defer rdb.Close()
	prefix := fmt.Sprintf("%s-mem%d-%d", e.run, int(layout), int(span.Hours()))
	defer cleanup(rdb, prefix)
	state, err := aggregator.OpenStateIn(ctx, rdb, prefix, false, layout)
	if err != nil {
		return 0, err
	}
	cfg := aggregator.RedisConfig{Prefix: state.Namespace, Retention: 30 * 24 * time.Hour}
	if state.Layout == aggregator.Layout11 {
		if cfg.Fingerprint, err = aggregator.OpenFingerprint(ctx, rdb, state.Namespace); err != nil {
			return 0, err
		}
	}
	store, err := aggregator.NewRedis(rdb, cfg)
	if err != nil {
		return 0, err
	}
	memory := func(field string) float64 {
		s, _ := rdb.Info(ctx, "memory").Result()
		for _, l := range strings.Split(s, "\r\n") {
			if v, ok := strings.CutPrefix(l, field+":"); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
		return 0
	}
	// What an earlier run's cleanup unlinked is freed in the background: until it is, used_memory
	// still holds it and the growth would read too small (or below 0).
	for deadline := time.Now().Add(time.Minute); memory("lazyfree_pending_objects") > 0; {
		if time.Now().After(deadline) {
			return 0, errors.New("redis still freeing unlinked keys after a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	used := func() float64 {
		rdb.Do(ctx, "MEMORY", "PURGE")
		return memory("used_memory")
	}
	before := used()
	const total = 500_000
	step := span.Microseconds() / total
	now := time.Now()
	obs := make([]aggregator.Observation, 0, 2000)
	for i := 0; i < total; i++ {
		occ := aggregator.Micros(now) - int64(i)*step
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

// watchRewrites samples Redis at addr's persistence every 100 ms from began until the returned
// function is called, which stops the sampler and describes what it saw: each AOF rewrite's span
// in seconds from began with its fork's stall and the memory its child copied on write, and the
// fsyncs Redis could not wait for (aof_delayed_fsync: a write that found the disk busy). It shows
// which seconds of a latency run a rewrite overlapped and what it cost the server.
func watchRewrites(ctx context.Context, addr string, began time.Time) func() string {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	var spans []string
	delayed0 := math.NaN()
	var delayed float64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer rdb.Close()
		var from float64
		running := false
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			info, err := rdb.Info(ctx, "persistence", "stats").Result()
			if err == nil {
				at := time.Since(began).Seconds()
				if math.IsNaN(delayed0) {
					delayed0 = infoValue(info, "aof_delayed_fsync")
				}
				delayed = infoValue(info, "aof_delayed_fsync") - delayed0
				switch now := infoValue(info, "aof_rewrite_in_progress") == 1; {
				case now && !running:
					from, running = at, true
				case !now && running:
					running = false
					spans = append(spans, fmt.Sprintf("rewrite %.1f–%.1f s (fork %.1f ms, %.0f MB copied on write)",
						from, at, infoValue(info, "latest_fork_usec")/1000, infoValue(info, "aof_last_cow_size")/1e6))
				}
			}
			select {
			case <-tick.C:
			case <-stop:
				if running {
					spans = append(spans, fmt.Sprintf("rewrite from %.1f s, still running", from))
				}
				return
			}
		}
	}()
	return func() string {
		close(stop)
		<-done
		if len(spans) == 0 {
			spans = append(spans, "no rewrite")
		}
		return fmt.Sprintf("%s; %.0f fsyncs not waited for", strings.Join(spans, "; "), delayed)
	}
}
