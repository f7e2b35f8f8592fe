package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// A batch with graded runs but no correction check has no tally to apply; it must still check the
// batch mark before publishing, so that suite snapshots and alerts computed on a Redis that lost
// writes are never published.
func TestSuiteOnlyBatchChecksTheMarkBeforePublishing(t *testing.T) {
	ctx := context.Background()
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "suiteonly")
	testenv.CleanPrefix(t, client, prefix)
	cfg := aggregator.RedisConfig{Prefix: prefix, Retention: 30 * 24 * time.Hour}
	rates, _ := aggregator.NewRedis(client, cfg)
	suites, _ := suite.NewRedis(client, cfg, suite.Config{})
	pub, dlq := &recordingPublisher{}, &recordingDLQ{}
	p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond}, newTestDecoder(t), rates, suites, pub, dlq,
		func() time.Time { return now }, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	evalCheck := strings.NewReplacer(`"id":"e1"`, `"id":"e-check"`, `"type":"repeatrate.live.attempt.v1"`, `"type":"repeatrate.eval.result.v1"`,
		`"outcome":"confirmed_repeat"`, `"suite":"s","case_id":"k","version":"v1","version_seq":1,"run_index":0,"runs":1,"result":"fail"`).Replace(structured)
	evalOnly := func(run int) kafka.Message {
		v := strings.NewReplacer(`"opportunity_id":"o","correction_id":"fix",`, "", `"run_index":0,"runs":1`,
			fmt.Sprintf(`"run_index":%d,"runs":3`, run)).Replace(evalCheck)
		return kafka.Message{Topic: "in", Offset: int64(run), Value: []byte(v)}
	}
	for run := 0; run < 2; run++ { // two batches, both sealed
		if err := p.Handle(ctx, []kafka.Message{evalOnly(run)}); err != nil {
			t.Fatal(err)
		}
	}
	// Redis comes back from a snapshot taken after the first batch: run 1 and mark 2 are gone.
	keys, _ := client.Keys(ctx, prefix+":*").Result()
	for _, k := range keys {
		switch {
		case strings.Contains(k, ":seal:"):
			client.Set(ctx, k, 1, 0)
		case strings.HasSuffix(k, ":r"):
			// The suite's runs of case k: one field per block of run indexes, one entry per run
			// ("<run_index> …;"); only run 0's is left.
			for f, v := range client.HGetAll(ctx, k).Val() {
				first, _, _ := strings.Cut(v, ";")
				client.HSet(ctx, k, f, first+";")
			}
		}
	}
	pub.suites = nil
	err = p.Handle(ctx, []kafka.Message{evalOnly(2)})
	if !errors.Is(err, ErrRewind) {
		t.Fatalf("want a rewind, got %v", err)
	}
	for _, o := range pub.suites {
		for _, s := range o.Stability {
			t.Errorf("published before the loss was noticed: stability of %s with run scores %v (the state had lost run 1)", s.Version, s.RunScores)
		}
	}
}
