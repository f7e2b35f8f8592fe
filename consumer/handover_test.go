package consumer

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/sink"
)

// slowWriter acknowledges each write delay after it began, whatever its context: a broker slow
// to answer, and kafka-go, which keeps sending a write its caller stopped waiting for.
type slowWriter struct {
	delay       time.Duration
	mu          sync.Mutex
	deliveredAt time.Time
}

func (w *slowWriter) WriteMessages(_ context.Context, _ ...kafka.Message) error {
	time.Sleep(w.delay)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deliveredAt = time.Now()
	return nil
}

// A snapshot whose publish timed out must not land after the next owner's: the generation ends,
// and the member may rejoin and hand its partitions over, only once the abandoned write has
// ended. Here the publish stage gives up after DrainTimeout (30 s) while the broker answers at
// 50 s; without the settle the generation ended at 30 s, the write still on its way.
func TestGenerationEndsAfterItsLateWritesSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &slowWriter{delay: 50 * time.Second}
		p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond}, newTestDecoder(t),
			&flakyStore{model: aggregator.NewModel(30 * 24 * time.Hour)}, suite.NewMemory(suite.Config{}), sink.NewKafka(w, w, w),
			&recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
		if err != nil {
			t.Fatal(err)
		}
		metrics := NewMetrics(nil)
		g, err := NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: 1,
			Linger: time.Millisecond, DrainTimeout: 30 * time.Second, RebalanceTimeout: 2 * time.Minute}, p, zap.NewNop(), metrics)
		if err != nil {
			t.Fatal(err)
		}
		in := make(chan kafka.Message, 1)
		in <- kafka.Message{Topic: "in", Partition: 0, Offset: 0, Value: []byte(structured)}
		start := time.Now()
		g.consume(t.Context(), t.Context(), 0, nopCommitter{}, in)
		ended := time.Since(start)
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.deliveredAt.IsZero() {
			t.Fatalf("the generation ended after %v with the snapshot not yet delivered", ended)
		}
		if delivered := w.deliveredAt.Sub(start); ended < delivered {
			t.Fatalf("the generation ended after %v, before the abandoned snapshot landed (%v)", ended, delivered)
		}
	})
}
