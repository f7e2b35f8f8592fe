package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/replay"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

// comparable strips what legitimately differs between streaming and replay: the observation
// time and the version (streaming bumps it once per batch, replay once per event).
func comparable(s schemas.Snapshot) schemas.Snapshot {
	s.ObservedAt = time.Time{}
	s.Version = 0
	return s
}

func snapshotJSON(s schemas.Snapshot) string {
	b, _ := json.Marshal(comparable(s))
	return string(b)
}

// latestSnapshots keeps the greatest-version snapshot of every aggregate seen on a topic.
type latestSnapshots struct {
	mu   sync.Mutex
	by   map[string]schemas.Snapshot
	seen int
}

func (l *latestSnapshots) add(m kafka.Message) error {
	var ev struct {
		Type string           `json:"type"`
		Data schemas.Snapshot `json:"data"`
	}
	if err := json.Unmarshal(m.Value, &ev); err != nil {
		return fmt.Errorf("snapshot message is not a CloudEvent: %w", err)
	}
	if ev.Type != schemas.TypeSnapshot || string(m.Key) != ev.Data.Aggregate.ID() {
		return fmt.Errorf("snapshot type %q key %q for %q", ev.Type, m.Key, ev.Data.Aggregate.ID())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen++
	if cur, ok := l.by[string(m.Key)]; !ok || ev.Data.Version >= cur.Version {
		l.by[string(m.Key)] = ev.Data
	}
	return nil
}

func (l *latestSnapshots) equal(want map[string]string) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.by) != len(want) {
		return false, fmt.Sprintf("%d aggregates, want %d", len(l.by), len(want))
	}
	for k, w := range want {
		got, ok := l.by[k]
		if !ok {
			return false, "missing " + k
		}
		if g := snapshotJSON(got); g != w {
			return false, fmt.Sprintf("%s:\n got %s\nwant %s", k, g, w)
		}
	}
	return true, ""
}

// TestEndToEndMatchesReplay: the processor on real Kafka and Redis publishes, for every aggregate,
// the snapshot replay computes from the same input, and dead-letters exactly the poison, in a
// namespace of either state layout (redis.state_layout).
func TestEndToEndMatchesReplay(t *testing.T) {
	testenv.KafkaBrokers(t) // skip before generating anything when Kafka is absent
	for _, layout := range []aggregator.Layout{aggregator.Layout10, aggregator.Layout11} {
		t.Run(fmt.Sprint("layout ", int(layout)), func(t *testing.T) { endToEndMatchesReplay(t, layout) })
	}
}

func endToEndMatchesReplay(t *testing.T, layout aggregator.Layout) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	const events = 20000
	gen := synth.New(synth.Config{Seed: 42, Workspaces: 4, Corrections: 3, Duplicates: 0.2, Reassessed: 0.1, Poison: 0.01, EvalShare: 0.3})
	var input bytes.Buffer
	poison := 0
	start := time.Now()
	for i := 0; i < events; i++ {
		line, bad := gen.Line(start)
		if bad {
			poison++
		}
		input.Write(line)
		input.WriteByte('\n')
	}
	file := filepath.Join(t.TempDir(), "in.ndjson")
	if err := os.WriteFile(file, input.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}

	// What replay says.
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	suiteCfg, _ := defaultConfig().Suite.aggregator()
	want, err := replay.Run(ctx, bytes.NewReader(input.Bytes()), dec, 30*24*time.Hour, suiteCfg, time.Time{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(want.DeadLetters) != poison {
		t.Fatalf("replay dead-lettered %d lines, the generator made %d poison", len(want.DeadLetters), poison)
	}
	wantJSON := map[string]string{}
	for _, s := range want.Snapshots {
		wantJSON[s.Aggregate.ID()] = snapshotJSON(s)
	}

	// Streaming through real Kafka and Redis.
	h := startPipeline(ctx, t, input.Bytes(), events, func(c *Config) { c.Redis.StateLayout = int(layout) })
	cfg, kc, done, stop, procStart := h.cfg, h.kc, h.done, h.stop, h.start

	// Collect snapshots and dead letters until the snapshots equal replay's.
	got := &latestSnapshots{by: map[string]schemas.Snapshot{}}
	var firstSnap time.Time
	tailErr := make(chan error, 1)
	tctx, stopTail := context.WithCancel(ctx)
	go func() {
		tailErr <- tail(tctx, kc, cfg.Kafka.SnapshotTopic, 3*time.Minute, func(m kafka.Message) error {
			if firstSnap.IsZero() {
				firstSnap = time.Now()
			}
			return got.add(m)
		})
	}()
	matchedAt := awaitSnapshots(t, got, wantJSON, tailErr, done, 3*time.Minute)
	stopTail()
	<-tailErr

	// Shut down: SIGTERM's path. The processor drains, commits and returns nil.
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("processor: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("processor did not stop within 30s of cancellation")
	}

	var dls []kafka.Message
	if err := tail(ctx, kc, cfg.Kafka.DLQTopic, 3*time.Second, func(m kafka.Message) error { dls = append(dls, m); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(dls) != poison {
		t.Fatalf("dead-letter topic holds %d messages, want exactly the %d poison", len(dls), poison)
	}
	reasons := map[string]int{}
	for _, m := range dls {
		for _, h := range m.Headers {
			if h.Key == consumer.HeaderDLQReason {
				reasons[string(h.Value)]++
			}
		}
	}
	for _, d := range want.DeadLetters {
		reasons[d.Reason]--
	}
	for r, n := range reasons {
		if n != 0 {
			t.Errorf("dead-letter reason %s: streaming and replay differ by %d", r, n)
		}
	}
	// The namespace is in the layout asked for, and so are its aggregates: layout 11 keeps its
	// records in each aggregate's packed store (…:e), layout 10 in its record hash (…:o).
	rdb := testenv.Redis(t)
	epoch, err := rdb.Get(ctx, aggregator.EpochKey(cfg.Redis.KeyPrefix)).Result()
	if err != nil || !strings.HasSuffix(epoch, fmt.Sprintf("/layout%d", int(layout))) {
		t.Fatalf("epoch %q (%v), want one of layout %d", epoch, err, int(layout))
	}
	var aggregates, inStore, inHash int64
	iter := rdb.Scan(ctx, 0, cfg.Redis.KeyPrefix+":{*}:s", 1000).Iterator()
	for iter.Next(ctx) {
		base := strings.TrimSuffix(iter.Val(), "s")
		aggregates++
		inStore += rdb.Exists(ctx, base+"e").Val()
		inHash += rdb.Exists(ctx, base+"o").Val()
	}
	if want := map[aggregator.Layout][2]int64{aggregator.Layout10: {0, aggregates}, aggregator.Layout11: {aggregates, 0}}[layout]; aggregates == 0 || [2]int64{inStore, inHash} != want {
		t.Fatalf("of %d aggregates' state hashes, %d have a packed record store (…:e) and %d a record hash (…:o)", aggregates, inStore, inHash)
	}
	elapsed := matchedAt.Sub(procStart)
	t.Logf("%d events (%d poison, %d aggregates, %d snapshots published): converged %.2fs after start (%.0f events/s), %.2fs after the first snapshot",
		events, poison, len(wantJSON), got.seen, elapsed.Seconds(), float64(events)/elapsed.Seconds(), matchedAt.Sub(firstSnap).Seconds())
}

// awaitSnapshots waits until got holds want and returns when it did; the test fails when the
// snapshots' tail or the processor stops first, or when d passes.
func awaitSnapshots(t *testing.T, got *latestSnapshots, want map[string]string, tailErr, done <-chan error, d time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if ok, why := got.equal(want); ok {
			return time.Now()
		} else if time.Now().After(deadline) {
			t.Fatalf("snapshots did not converge to replay's: %s", why)
		}
		select {
		case err := <-tailErr:
			t.Fatalf("tail snapshots: %v", err)
		case err := <-done:
			t.Fatalf("processor stopped early: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pipeline is a processor running in this process on real Kafka and Redis, on topics, a group
// and a key prefix of its own.
type pipeline struct {
	cfg   Config
	kc    *kafkaClients
	done  chan error
	stop  context.CancelFunc
	start time.Time
}

// isolated returns a configuration whose group, topics and Redis prefix are the test's own (its
// Redis keys deleted afterwards), with Kafka clients on it and the topics created, the input and
// snapshot topics with parts partitions.
func isolated(ctx context.Context, t *testing.T, what string, parts int) (Config, *kafkaClients) {
	t.Helper()
	name := testenv.Name(t, what)
	cfg := defaultConfig()
	cfg.Kafka.Brokers = testenv.KafkaBrokers(t)
	cfg.Kafka.GroupID = name
	cfg.Kafka.InputTopics = []string{name + ".in"}
	cfg.Kafka.SnapshotTopic = name + ".snapshots"
	cfg.Kafka.SuiteTopic = name + ".suites"
	cfg.Kafka.AlertsTopic = name + ".alerts"
	cfg.Kafka.DLQTopic = name + ".dlq"
	cfg.Redis.Addrs = []string{testenv.RedisAddr(t)}
	cfg.Redis.KeyPrefix = name
	cfg.HTTPAddr = ""
	testenv.CleanPrefix(t, testenv.Redis(t), name)
	kc, err := newKafkaClients(cfg.Kafka)
	if err != nil {
		t.Fatal(err)
	}
	if err := kc.ensureTopics(ctx, []topicSpec{{name: name + ".in", partitions: parts},
		{name: cfg.Kafka.SnapshotTopic, partitions: parts, compacted: true}, {name: cfg.Kafka.SuiteTopic, partitions: parts, compacted: true},
		{name: cfg.Kafka.AlertsTopic, partitions: 1}, {name: cfg.Kafka.DLQTopic, partitions: 1}}); err != nil {
		t.Fatal(err)
	}
	return cfg, kc
}

// startPipeline creates the topics, produces input (n lines) and starts the processor, its
// configuration changed by opts.
func startPipeline(ctx context.Context, t *testing.T, input []byte, n int, opts ...func(*Config)) *pipeline {
	t.Helper()
	cfg, kc := isolated(ctx, t, "e2e", 4)
	cfg.Kafka.CreateTopics = true
	for _, o := range opts {
		o(&cfg)
	}
	// Compressed both ways, with two codecs (kafka.compression): the input written zstd, every
	// output lz4. The processor and the tests' readers read whatever codec they find.
	zstd := cfg.Kafka
	zstd.Compression = "zstd"
	in, err := newKafkaClients(zstd)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Kafka.Compression = "lz4"
	w := in.writer(cfg.Kafka.InputTopics[0])
	produced, err := produce(ctx, bytes.NewReader(input), w)
	w.Close()
	if err != nil || produced != n {
		t.Fatalf("produced %d of %d: %v", produced, n, err)
	}
	pctx, stop := context.WithCancel(ctx)
	p := &pipeline{cfg: cfg, kc: kc, done: make(chan error, 1), stop: stop, start: time.Now()}
	go func() { p.done <- runProcessor(pctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))) }()
	t.Cleanup(stop)
	return p
}
