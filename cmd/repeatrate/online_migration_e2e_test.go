package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/replay"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

// TestMigrateUpgradesARunningInstallationWhoseTopicsLostItsStart: an installation running in
// layout 10 whose input topic no longer holds the first part of its input (deleted, as retention
// would) is migrated to layout 11 by `repeatrate migrate` while its processor keeps running and the
// second part is produced; the same processor, never restarted, then takes a third part. Every
// aggregate's snapshot is what replay computes from all three parts, including the part the topic
// lost, with duplicates across the parts; the namespace is the same one, now in layout 11, with
// every aggregate in the packed store and no record hash of layout 10 left.
func TestMigrateUpgradesARunningInstallationWhoseTopicsLostItsStart(t *testing.T) {
	migrateUpgrade(t, false)
}

// TestMigrateResumesAfterAnInterruptionAndAProcessorRestart: the same, with the first `repeatrate
// migrate` stopped a few milliseconds into its first pass and the processor restarted while the
// namespace is half migrated (it opens the namespace in "10 → 11"); a second `migrate` finishes.
func TestMigrateResumesAfterAnInterruptionAndAProcessorRestart(t *testing.T) {
	migrateUpgrade(t, true)
}

func migrateUpgrade(t *testing.T, interrupt bool) {
	testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	gen := synth.New(synth.Config{Seed: 12, Workspaces: 3, Corrections: 3, Duplicates: 0.2, Reassessed: 0.1, EvalShare: 0.3})
	var parts [3]bytes.Buffer
	sizes := [3]int{6000, 4000, 2000}
	start := time.Now()
	for p, n := range sizes {
		for range n {
			line, _ := gen.Line(start)
			parts[p].Write(line)
			parts[p].WriteByte('\n')
		}
	}
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	suiteCfg, _ := defaultConfig().Suite.aggregator()
	wantOf := func(upTo int) map[string]string {
		t.Helper()
		var input []byte
		for p := 0; p <= upTo; p++ {
			input = append(input, parts[p].Bytes()...)
		}
		r, err := replay.Run(ctx, bytes.NewReader(input), dec, 30*24*time.Hour, suiteCfg, time.Time{}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{}
		for _, s := range r.Snapshots {
			want[s.Aggregate.ID()] = snapshotJSON(s)
		}
		return want
	}

	h := startPipeline(ctx, t, parts[0].Bytes(), sizes[0])
	got := &latestSnapshots{by: map[string]schemas.Snapshot{}}
	tctx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	tailErr := make(chan error, 1)
	go func() {
		tailErr <- tail(tctx, h.kc, h.cfg.Kafka.SnapshotTopic, 4*time.Minute, func(m kafka.Message) error { return got.add(m) })
	}()
	awaitSnapshots(t, got, wantOf(0), tailErr, h.done, 2*time.Minute)
	rdb := testenv.Redis(t)
	before, err := aggregator.OpenState(ctx, rdb, h.cfg.Redis.KeyPrefix, true)
	if err != nil || before.Layout != aggregator.Layout10 {
		t.Fatalf("before the migration: %+v, %v", before, err)
	}

	// The topic loses the first part, as retention shorter than the state's would make it.
	input := h.cfg.Kafka.InputTopics[0]
	ends, err := h.kc.endOffsets(ctx, []string{input})
	if err != nil {
		t.Fatal(err)
	}
	deleteRecordsBelow(ctx, t, h.cfg.Kafka.Brokers[0], input, ends[input])
	firsts := firstOffsets(ctx, t, h.kc, input)
	for part, end := range ends[input] {
		if firsts[part] != end {
			t.Fatalf("partition %d starts at %d after deleting below %d", part, firsts[part], end)
		}
	}

	// The second part is produced while the migration runs beside the processor.
	produced := make(chan error, 1)
	go func() {
		w := h.kc.writer(input)
		defer w.Close()
		n, err := produce(ctx, bytes.NewReader(parts[1].Bytes()), w)
		if err == nil && n != sizes[1] {
			err = fmt.Errorf("produced %d of %d", n, sizes[1])
		}
		produced <- err
	}()
	migrateArgs := []string{"migrate", "-redis-addrs", strings.Join(h.cfg.Redis.Addrs, ","), "-redis-key-prefix", h.cfg.Redis.KeyPrefix}
	done := h.done
	if interrupt {
		// Stopped 3 ms after the marker moved, mid-pass.
		mctx, stopMigrate := context.WithCancel(ctx)
		go func() {
			defer stopMigrate()
			for mctx.Err() == nil {
				if e, _ := rdb.Get(ctx, aggregator.EpochKey(before.Namespace)).Result(); strings.HasSuffix(e, "/layout10to11") {
					time.Sleep(3 * time.Millisecond)
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
		var stderr bytes.Buffer
		if err := run(mctx, migrateArgs, func(string) string { return "" }, nil, nil, &stderr); err == nil {
			t.Fatalf("the interrupted migration finished:\n%s", stderr.String())
		}
		mid, err := aggregator.OpenState(ctx, rdb, h.cfg.Redis.KeyPrefix, true)
		if err != nil || mid.Layout != aggregator.Layout10To11 {
			t.Fatalf("after the interruption: %+v, %v; want the namespace in 10 → 11", mid, err)
		}
		t.Logf("aggregates after the interruption, by head: %v", headsOf(ctx, t, rdb, mid.Namespace))
		// The processor restarts on the half-migrated namespace.
		h.stop()
		if err := <-h.done; err != nil {
			t.Fatalf("the processor before its restart: %v", err)
		}
		pctx, stop := context.WithCancel(ctx)
		defer stop()
		restarted := make(chan error, 1)
		go func() { restarted <- runProcessor(pctx, h.cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))) }()
		h.stop, done = stop, restarted
	}
	var stderr bytes.Buffer
	if err := run(ctx, migrateArgs, func(string) string { return "" }, nil, nil, &stderr); err != nil {
		t.Fatalf("migrate: %v\n%s", err, stderr.String())
	}
	// Each pass line says what that pass did: the last one found nothing left to convert.
	var passes []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, `"migration pass"`) {
			passes = append(passes, line)
		}
	}
	if len(passes) < 2 || strings.Contains(passes[0], `"converted":0`) && !interrupt || !strings.Contains(passes[len(passes)-1], `"converted":0,`) {
		t.Fatalf("migrate's pass lines:\n%s", strings.Join(passes, "\n"))
	}
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	w := h.kc.writer(input)
	n, err := produce(ctx, bytes.NewReader(parts[2].Bytes()), w)
	w.Close()
	if err != nil || n != sizes[2] {
		t.Fatalf("produced %d of %d: %v", n, sizes[2], err)
	}
	awaitSnapshots(t, got, wantOf(2), tailErr, done, 3*time.Minute)
	h.stop()
	if err := <-done; err != nil {
		t.Fatalf("the processor across the migration: %v", err)
	}

	after, err := aggregator.OpenState(ctx, rdb, h.cfg.Redis.KeyPrefix, true)
	if err != nil || after.Layout != aggregator.Layout11 || after.Namespace != before.Namespace {
		t.Fatalf("after the migration: %+v, %v; want namespace %s in layout 11", after, err, before.Namespace)
	}
	var aggregates, inStore, recordHashes int64
	iter := rdb.Scan(ctx, 0, after.Namespace+":{*}:s", 1000).Iterator()
	for iter.Next(ctx) {
		if strings.HasPrefix(iter.Val(), after.Namespace+":{s|") {
			continue // a suite's
		}
		base := strings.TrimSuffix(iter.Val(), "s")
		aggregates++
		inStore += rdb.Exists(ctx, base+"e").Val()
		recordHashes += rdb.Exists(ctx, base+"o").Val()
	}
	if aggregates == 0 || inStore != aggregates || recordHashes != 0 {
		t.Fatalf("of %d aggregates, %d keep a packed store and %d a record hash of layout 10", aggregates, inStore, recordHashes)
	}
	t.Logf("%d aggregates in %s, epoch %s", aggregates, after.Namespace, after.Epoch)
}

// deleteRecordsBelow deletes topic's records below the given offsets with Kafka's own admin client
// (testdata/deleterecords), from the broker jars that deploy/local/kafka.sh resolved.
func deleteRecordsBelow(ctx context.Context, t *testing.T, broker, topic string, below map[int]int64) {
	t.Helper()
	libs, err := filepath.Abs("../../.cache/kafka/libs")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-cp", libs + "/*", "testdata/deleterecords/DeleteRecords.java", broker, topic}
	for part, off := range below {
		args = append(args, fmt.Sprintf("%d=%d", part, off))
	}
	if out, err := exec.CommandContext(ctx, "java", args...).CombinedOutput(); err != nil {
		t.Fatalf("delete records: %v\n%s", err, out)
	}
}

// firstOffsets returns the first offset each partition of topic still holds.
func firstOffsets(ctx context.Context, t *testing.T, kc *kafkaClients, topic string) map[int]int64 {
	t.Helper()
	parts, err := kc.partitions(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, p := range parts {
		req.Topics[topic] = append(req.Topics[topic], kafka.FirstOffsetOf(p))
	}
	resp, err := kc.client().ListOffsets(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int64{}
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			t.Fatal(po.Error)
		}
		out[po.Partition] = po.FirstOffset
	}
	return out
}

// headsOf counts namespace ns's aggregates by their head's first byte (10, 12 being converted, 11).
func headsOf(ctx context.Context, t *testing.T, rdb redis.UniversalClient, ns string) map[byte]int {
	t.Helper()
	out := map[byte]int{}
	iter := rdb.Scan(ctx, 0, ns+":{*}:s", 1000).Iterator()
	for iter.Next(ctx) {
		if h, _ := rdb.HGet(ctx, iter.Val(), "H").Result(); h != "" {
			out[h[0]]++
		}
	}
	return out
}
