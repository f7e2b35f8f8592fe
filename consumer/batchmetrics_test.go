package consumer

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
)

// Events are counted by type once per batch and lag set once per partition: the totals are what
// counting each event and setting each message's lag gave.
func TestBatchMetricsCountedOncePerBatch(t *testing.T) {
	m := NewMetrics(nil)
	cfg := ProcessorConfig{Suite: suite.Config{MinHistory: 1}}
	p, err := NewProcessor(cfg, newTestDecoder(t), aggregator.NewModel(30*24*time.Hour), suite.NewMemory(cfg.Suite),
		&gatePublisher{tr: &trace{}}, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), m)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []kafka.Message
	for i := range 5 {
		msgs = append(msgs, liveMessage(int64(i), "o", "passed"))
	}
	for i, r := range []string{"pass", "fail", "pass"} {
		msgs = append(msgs, evalMessage("ev"+string(rune('a'+i)), "v1", 1, r, "x"))
	}
	msgs = append(msgs, kafka.Message{Topic: "in", Value: []byte(`{"specversion":"1.0"`)})
	for round := 1; round <= 2; round++ {
		b, err := p.Prepare(msgs)
		if err != nil {
			t.Fatal(err)
		}
		if len(b.dls) != 1 {
			t.Fatalf("%d dead letters, want the one bad message", len(b.dls))
		}
		live := testutil.ToFloat64(m.Events.WithLabelValues("repeatrate.live.attempt.v1"))
		eval := testutil.ToFloat64(m.Events.WithLabelValues("repeatrate.eval.result.v1"))
		if live != float64(5*round) || eval != float64(3*round) || testutil.CollectAndCount(m.Events) != 2 {
			t.Fatalf("round %d: events counted live %v, eval %v over %d types; want %d, %d over 2",
				round, live, eval, testutil.CollectAndCount(m.Events), 5*round, 3*round)
		}
	}

	g, err := NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in", "other"}}, nil, zap.NewNop(), m)
	if err != nil {
		t.Fatal(err)
	}
	f := &flight{start: time.Now(), msgs: []kafka.Message{
		{Topic: "in", Partition: 0, Offset: 10, HighWaterMark: 20},
		{Topic: "in", Partition: 1, Offset: 3, HighWaterMark: 4},
		{Topic: "in", Partition: 0, Offset: 11, HighWaterMark: 25},
		{Topic: "other", Partition: 0, Offset: 7, HighWaterMark: 100},
		{Topic: "in", Partition: 0, Offset: 12, HighWaterMark: 25},
	}}
	offsets := g.done(f)
	if offsets["in"][0] != 13 || offsets["in"][1] != 4 || offsets["other"][0] != 8 {
		t.Fatalf("offsets %v", offsets)
	}
	for _, c := range []struct {
		topic, part string
		want        float64
	}{{"in", "0", 12}, {"in", "1", 0}, {"other", "0", 92}} {
		if got := testutil.ToFloat64(m.Lag.WithLabelValues(c.topic, c.part)); got != c.want {
			t.Errorf("lag of %s/%s = %v, want %v (from the partition's newest message)", c.topic, c.part, got, c.want)
		}
	}
}
