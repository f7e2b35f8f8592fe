package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

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

// TestRebuildMovesAnInstallationToLayout11: an installation running in layout 10, rebuilt with
// redis.state_layout 11 and run on, holds its state in layout 11 and publishes for every
// aggregate what replay computes from all the input, before the rebuild and after it (with
// duplicates across the two).
func TestRebuildMovesAnInstallationToLayout11(t *testing.T) {
	testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	gen := synth.New(synth.Config{Seed: 11, Workspaces: 3, Corrections: 3, Duplicates: 0.2, Reassessed: 0.1, EvalShare: 0.3})
	var before, after bytes.Buffer
	start := time.Now()
	for i := 0; i < 8000; i++ {
		line, _ := gen.Line(start)
		out := &before
		if i >= 6000 {
			out = &after
		}
		out.Write(line)
		out.WriteByte('\n')
	}
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	suiteCfg, _ := defaultConfig().Suite.aggregator()
	wantOf := func(input []byte) map[string]string {
		t.Helper()
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
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))

	// Layout 10 first, until its snapshots are replay's of the first part.
	h := startPipeline(ctx, t, before.Bytes(), 6000)
	got := &latestSnapshots{by: map[string]schemas.Snapshot{}}
	tctx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	tailErr := make(chan error, 1)
	go func() {
		tailErr <- tail(tctx, h.kc, h.cfg.Kafka.SnapshotTopic, 3*time.Minute, func(m kafka.Message) error { return got.add(m) })
	}()
	awaitSnapshots(t, got, wantOf(before.Bytes()), tailErr, h.done, 2*time.Minute)
	h.stop()
	if err := <-h.done; err != nil {
		t.Fatalf("processor in layout 10: %v", err)
	}

	// The rebuild, asked for layout 11, then the processor on the rebuilt namespace with the rest.
	cfg := h.cfg
	cfg.Redis.StateLayout = int(aggregator.Layout11)
	if err := runRebuild(ctx, cfg, log); err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	w := h.kc.writer(cfg.Kafka.InputTopics[0])
	n, err := produce(ctx, bytes.NewReader(after.Bytes()), w)
	w.Close()
	if err != nil || n != 2000 {
		t.Fatalf("produced %d of 2000: %v", n, err)
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- runProcessor(pctx, cfg, log) }()
	awaitSnapshots(t, got, wantOf(append(before.Bytes(), after.Bytes()...)), tailErr, done, 2*time.Minute)
	stop()
	if err := <-done; err != nil {
		t.Fatalf("processor in layout 11: %v", err)
	}

	rdb := testenv.Redis(t)
	st, err := aggregator.OpenState(ctx, rdb, cfg.Redis.KeyPrefix, true)
	if err != nil || st.Layout != aggregator.Layout11 || st.Namespace == cfg.Redis.KeyPrefix {
		t.Fatalf("after the rebuild: %+v %v, want a new namespace in layout 11", st, err)
	}
	var aggregates, inStore int64
	iter := rdb.Scan(ctx, 0, st.Namespace+":{*}:s", 1000).Iterator()
	for iter.Next(ctx) {
		aggregates++
		inStore += rdb.Exists(ctx, strings.TrimSuffix(iter.Val(), "s")+"e").Val()
	}
	if aggregates == 0 || inStore != aggregates {
		t.Fatalf("of %d aggregates in %s, %d keep a packed record store", aggregates, st.Namespace, inStore)
	}
	t.Logf("%d aggregates in %s, epoch %s", aggregates, st.Namespace, st.Epoch)
}
