package main

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestDemoViewGolden(t *testing.T) {
	v := newDemoView()
	at := time.Date(2026, 11, 30, 12, 0, 5, 0, time.UTC)
	scope := schemas.Scope{Workspace: "ws-0", Model: "m|small", Run: "run-1", Checkpoint: "ckpt-7", Artifact: "prod"}
	odd := schemas.Scope{Workspace: "a b", Model: "\x1b[31m", Run: "r", Checkpoint: "c", Artifact: "x"}
	for _, s := range []struct {
		scope   schemas.Scope
		corr    string
		src     aggregator.Source
		c, p, u int64
		version int64
	}{
		{scope, "fix-0", aggregator.Live, 4, 16, 3, 2},
		{scope, "fix-0", aggregator.Live, 3, 16, 3, 1}, // older: dropped
		{scope, "fix-0", aggregator.Evaluation, 1, 1, 0, 1},
		{scope, "fix-1", aggregator.Live, 0, 0, 2, 1}, // unscored only: not measured
		{odd, "fix-0", aggregator.Evaluation, 1, 0, 0, 1},
	} {
		k := aggregator.Key{Scope: s.scope, CorrectionID: s.corr, Source: s.src}
		tl := aggregator.Tally{All: aggregator.Counts{Confirmed: s.c, Passed: s.p, Unscored: s.u}, Version: s.version}
		snap := tl.Snapshot(k, at)
		b, err := sink.EncodeSnapshot(&snap)
		if err != nil {
			t.Fatal(err)
		}
		v.snapshot(kafka.Message{Value: b})
	}
	v.deadLetter(kafka.Message{Headers: []kafka.Header{{Key: "repeatrate-dlq-reason", Value: []byte("undecodable")}}})
	v.deadLetter(kafka.Message{Headers: []kafka.Header{{Key: "repeatrate-dlq-reason", Value: []byte("undecodable")}}})
	v.deadLetter(kafka.Message{Headers: []kafka.Header{{Key: "repeatrate-dlq-reason", Value: []byte("bad_time")}}})
	v.alert(kafka.Message{Value: []byte(`{"type":"repeatrate.case.revived.v1","subject":"ws-0|regressions|case-fix-1"}`)})
	reg := prometheus.NewRegistry()
	m := consumer.NewMetrics(reg)
	m.Outcomes.WithLabelValues("counted").Add(26)
	m.Outcomes.WithLabelValues("duplicate").Add(3)
	m.Outcomes.WithLabelValues("reassessed").Add(1)
	v.outcomes = func() map[string]int { return observationOutcomes(reg) }
	got := v.render(at, 100, 5*time.Second, 8)
	golden := filepath.Join("testdata", "demo_view.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("view:\n%s\nwant (%s):\n%s", got, golden, want)
	}
}
