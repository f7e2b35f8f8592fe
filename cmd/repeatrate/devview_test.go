package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// The view's rows keep their lines from one redraw to the next: the busiest are shown in name
// order, so a row that overtakes another does not swap places with it; a long scope is clipped
// in the middle to its column, keeping its workspace and correction readable.
func TestDemoViewRowsKeepTheirLines(t *testing.T) {
	v := newDemoView()
	at := time.Date(2026, 11, 30, 12, 0, 5, 0, time.UTC)
	long := schemas.Scope{Workspace: "ws-0", Model: "a-very-long-model-name-that-goes-on", Run: "run-1", Checkpoint: "ckpt-7", Artifact: "prod"}
	put := func(corr string, scope schemas.Scope, passed, version int64) {
		k := aggregator.Key{Scope: scope, CorrectionID: corr, Source: aggregator.Live}
		snap := aggregator.Tally{All: aggregator.Counts{Passed: passed}, Version: version}.Snapshot(k, at)
		b, err := sink.EncodeSnapshot(&snap)
		if err != nil {
			t.Fatal(err)
		}
		v.snapshot(kafka.Message{Value: b})
	}
	short := schemas.Scope{Workspace: "ws-0", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}
	put("fix-a", short, 10, 1)
	put("fix-b", short, 20, 1)
	put("fix-z", long, 5, 1)
	lines := func() []string {
		var out []string
		for _, l := range strings.Split(v.render(at, 0, time.Second, 8), "\n") {
			if strings.HasPrefix(l, "  ws-0") {
				out = append(out, strings.Fields(l)[0]+" "+string([]rune(l)[2:42]))
			}
		}
		return out
	}
	before := lines()
	put("fix-a", short, 30, 2) // fix-a overtakes fix-b
	after := lines()
	if len(before) != 3 || strings.Join(before, "|") != strings.Join(after, "|") {
		t.Fatalf("rows moved when one overtook another:\n%q\n%q", before, after)
	}
	clipped := 0
	for _, got := range before {
		if strings.Contains(got, "a-very") {
			clipped++
			if !strings.Contains(got, "…") || !strings.HasSuffix(strings.TrimSpace(got), "fix-z") || !strings.HasPrefix(got, "ws-0 ws-0") {
				t.Errorf("the long scope's row %q is not clipped in the middle to its column", got)
			}
		}
	}
	if clipped != 1 {
		t.Errorf("rows %q: want the long scope's once", before)
	}
}

// The header's rate counts every event the processor decoded — the demo's, and what anyone
// posts or produces beside it — not only what the demo wrote.
func TestDemoViewCountsAllInput(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := consumer.NewMetrics(reg)
	v := newDemoView()
	v.sent.Add(10) // the demo's own writes
	v.input = func() int64 { return eventsIn(reg) }
	m.Events.WithLabelValues("repeatrate.live.attempt.v1").Add(30)
	m.Events.WithLabelValues("repeatrate.eval.result.v1").Add(12)
	if got := v.inputSoFar(); got != 42 {
		t.Fatalf("the view counts %d events in, the processor decoded 42", got)
	}
}

// dev refuses a broker retention it cannot keep the demo's start-up writes for (or that stops the
// broker's retention clock: zero panicked), before it prints or starts anything.
func TestDevRefusesAShortKafkaRetention(t *testing.T) {
	for _, v := range []string{"0", "-1ms", "3ns", "9s"} {
		var out strings.Builder
		err := devCommand(t.Context(), []string{"--kafka-retention", v, "--kafka-addr", "127.0.0.1:0", "--redis-addr", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0"}, &out, &out)
		if err == nil || !strings.Contains(err.Error(), "at least 10s") || out.Len() != 0 {
			t.Errorf("--kafka-retention %s: %v, printed %q", v, err, out.String())
		}
	}
}

// dev refuses an unknown codec by its own flag's name, before it prints or starts anything.
func TestDevRefusesAnUnknownCodec(t *testing.T) {
	var out strings.Builder
	err := devCommand(t.Context(), []string{"--kafka-compression", "brotli", "--kafka-addr", "127.0.0.1:0", "--redis-addr", "127.0.0.1:0",
		"--http-addr", "127.0.0.1:0"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "--kafka-compression") || !strings.Contains(err.Error(), "brotli") || out.Len() != 0 {
		t.Errorf("--kafka-compression brotli: %v, printed %q", err, out.String())
	}
}

// The view holds at most viewMaxAggregates aggregates however many it is shown, and keeps the
// busiest: the rows it can show.
func TestDemoViewBoundsWhatItHolds(t *testing.T) {
	v := newDemoView()
	at := time.Date(2026, 11, 30, 12, 0, 5, 0, time.UTC)
	scope := schemas.Scope{Workspace: "ws-0", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}
	put := func(corr string, passed int64) {
		k := aggregator.Key{Scope: scope, CorrectionID: corr, Source: aggregator.Live}
		snap := aggregator.Tally{All: aggregator.Counts{Passed: passed}, Version: 1}.Snapshot(k, at)
		b, err := sink.EncodeSnapshot(&snap)
		if err != nil {
			t.Fatal(err)
		}
		v.snapshot(kafka.Message{Value: b})
	}
	put("busiest", 1_000_000)
	for i := range 3 * viewMaxAggregates {
		put(fmt.Sprintf("quiet-%d", i), int64(i%50))
	}
	if len(v.latest) > viewMaxAggregates {
		t.Fatalf("the view holds %d aggregates, over its bound of %d", len(v.latest), viewMaxAggregates)
	}
	if !strings.Contains(v.render(at, 0, time.Second, 1), "busiest") {
		t.Fatal("the busiest aggregate was dropped")
	}
}
