package consumer

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
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

// The settle wait is bounded from the moment the generation ended, the drain included: the group
// waits RebalanceTimeout from then for this member, and hands its partitions to others after. A
// write that lands later than the wait allows is counted (repeatrate_unsettled_handovers_total).
// Here, with run's defaults (drain and rebalance timeouts 30 s), a rebalance begins while a
// snapshot's publish waits for a broker that answers after 40 s. Before, settle waited half the
// rebalance timeout from the end of the drain: the member rejoined 39 s after the rebalance
// began, and counted nothing.
func TestSettleEndsWithinTheRebalanceOrIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &slowWriter{delay: 40 * time.Second}
		p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond}, newTestDecoder(t),
			&flakyStore{model: aggregator.NewModel(30 * 24 * time.Hour)}, suite.NewMemory(suite.Config{}), sink.NewKafka(w, w, w),
			&recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
		if err != nil {
			t.Fatal(err)
		}
		metrics := NewMetrics(nil)
		g, err := NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: 1,
			Linger: time.Millisecond}, p, zap.NewNop(), metrics)
		if err != nil {
			t.Fatal(err)
		}
		in := make(chan kafka.Message, 1)
		in <- kafka.Message{Topic: "in", Partition: 0, Offset: 0, Value: []byte(structured)}
		gctx, rebalance := context.WithCancel(t.Context())
		defer rebalance()
		done := make(chan struct{})
		go func() {
			g.consume(t.Context(), gctx, 0, nopCommitter{}, in)
			close(done)
		}()
		time.Sleep(time.Second) // the snapshot is being published
		rebalance()
		began := time.Now()
		<-done
		rejoined := time.Since(began)
		if rejoined > g.cfg.RebalanceTimeout {
			t.Errorf("the member rejoined %v after the rebalance began, past the rebalance timeout (%v)", rejoined, g.cfg.RebalanceTimeout)
		}
		if n := testutil.ToFloat64(metrics.UnsettledHandovers); n != 1 {
			t.Errorf("repeatrate_unsettled_handovers_total %v, want 1: the snapshot lands after the member rejoined", n)
		}
		time.Sleep(time.Minute) // let the write end, inside the bubble
	})
}
