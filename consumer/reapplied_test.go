package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
)

// lostAnswerStore applies its first batch and then reports an error, as a Redis whose answer was
// lost (a timeout, a dropped connection) does: the work is done, the caller does not know it.
type lostAnswerStore struct {
	flakyStore
	lost bool
}

func (s *lostAnswerStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	a, err := s.model.Apply(ctx, obs, at)
	if !s.lost {
		s.lost = true
		return aggregator.Applied{}, errors.New("i/o timeout")
	}
	return a, err
}

// An apply retried after an attempt whose answer was lost finds that attempt's own work: its
// duplicates are counted as outcome "reapplied", not "duplicate", and the retry as a retry. Before,
// new opportunities showed up as duplicates in the metrics and the dev view.
func TestRetriedApplyCountsNoDuplicates(t *testing.T) {
	store := &lostAnswerStore{flakyStore: flakyStore{model: aggregator.NewModel(30 * 24 * time.Hour)}}
	metrics := NewMetrics(prometheus.NewRegistry())
	p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond}, newTestDecoder(t), store, suite.NewMemory(suite.Config{}),
		&recordingPublisher{}, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), metrics)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(context.Background(), []kafka.Message{{Topic: "in", Value: []byte(structured)}}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(metrics.Outcomes.WithLabelValues("duplicate")); n != 0 {
		t.Errorf("%v duplicates counted for a new opportunity applied twice by a retry", n)
	}
	if n := testutil.ToFloat64(metrics.Outcomes.WithLabelValues("reapplied")); n != 1 {
		t.Errorf("%v reapplied, want 1", n)
	}
	if n := testutil.ToFloat64(metrics.Retries.WithLabelValues("apply")); n != 1 {
		t.Errorf("%v apply retries, want 1", n)
	}
}
