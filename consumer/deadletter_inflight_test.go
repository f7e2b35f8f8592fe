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

// queuedTopic is a memoryTopic whose writes land delay after they began, whatever their context:
// kafka-go answers a caller whose context ended at once and delivers the write later.
type queuedTopic struct {
	mu    sync.Mutex
	topic memoryTopic
	delay time.Duration
}

func (q *queuedTopic) WriteMessages(ctx context.Context, msgs ...kafka.Message) error {
	landed := make(chan struct{})
	go func() {
		time.Sleep(q.delay)
		q.mu.Lock()
		defer q.mu.Unlock()
		q.topic.WriteMessages(context.Background(), msgs...)
		close(landed)
	}()
	select {
	case <-landed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (q *queuedTopic) Offsets(ctx context.Context, since time.Time) (map[int]LogOffsets, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.topic.Offsets(ctx, since)
}

func (q *queuedTopic) Read(ctx context.Context, p int, from, to int64, fn func(int64, []kafka.Header)) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.topic.Read(ctx, p, from, to, fn)
}

func (q *queuedTopic) sender() *DeadLetters {
	d := NewDeadLetters(q, q)
	d.now = func() time.Time { return q.topic.clock }
	return d
}

func (q *queuedTopic) lettersPerOffset(t *testing.T) map[int64]int {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	return lettersPerOffset(t, &q.topic)
}

// A send that stopped waiting (its batch's context ended: a rebalance, a loss of verified work)
// leaves its letters on their way. The batch delivered again at once, to the same sender or,
// after the sender settled, to another instance, must find them, not write a second letter: the
// topic cannot show a letter still on its way, so the sender waits for its own write first.
func TestDeadLetterOnItsWayIsNotWrittenAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
		q := &queuedTopic{topic: memoryTopic{clock: t0}, delay: 10 * time.Second}
		d := q.sender()
		dls := letters(0, 3, t0)
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := d.Send(ctx, dls); err == nil {
			t.Fatal("a send that stopped waiting must fail")
		}
		if err := d.Send(t.Context(), dls); err != nil {
			t.Fatal(err)
		}
		for off, n := range q.lettersPerOffset(t) {
			if n != 1 {
				t.Fatalf("offset %d has %d letters after the same sender sent it again", off, n)
			}
		}

		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := d.Send(ctx, letters(3, 6, t0)); err == nil {
			t.Fatal("a send that stopped waiting must fail")
		}
		short, cancelShort := context.WithTimeout(t.Context(), time.Second)
		defer cancelShort()
		if err := d.Settle(short); err == nil {
			t.Fatal("Settle returned with a letter still on its way")
		}
		if err := d.Settle(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := q.sender().Send(t.Context(), letters(0, 6, t0)); err != nil {
			t.Fatal(err)
		}
		seen := q.lettersPerOffset(t)
		if len(seen) != 6 {
			t.Fatalf("letters for %d messages, want 6", len(seen))
		}
		for off, n := range seen {
			if n != 1 {
				t.Fatalf("offset %d has %d letters after another instance sent it again", off, n)
			}
		}
	})
}

// The generation ends, and the member hands its partitions over, only once a dead letter whose
// send timed out has landed: the next owner could not see it on the topic and would write it
// again. Here the dead-letter stage gives up after DrainTimeout (30 s) while the broker answers at
// 50 s.
func TestGenerationEndsAfterItsLateDeadLettersSettle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := &queuedTopic{topic: memoryTopic{clock: now}, delay: 50 * time.Second}
		w := &slowWriter{}
		p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond, RetryMax: 10 * time.Millisecond}, newTestDecoder(t),
			&flakyStore{model: aggregator.NewModel(30 * 24 * time.Hour)}, suite.NewMemory(suite.Config{}), sink.NewKafka(w, w, w),
			q.sender(), func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
		if err != nil {
			t.Fatal(err)
		}
		g, err := NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: 1,
			Linger: time.Millisecond, DrainTimeout: 30 * time.Second, RebalanceTimeout: 2 * time.Minute}, p, zap.NewNop(), NewMetrics(nil))
		if err != nil {
			t.Fatal(err)
		}
		in := make(chan kafka.Message, 1)
		in <- kafka.Message{Topic: "in", Partition: 0, Offset: 0, Value: []byte("not an event"), Time: now}
		start := time.Now()
		g.consume(t.Context(), t.Context(), 0, nopCommitter{}, in)
		ended := time.Since(start)
		if n := len(q.lettersPerOffset(t)); n != 1 {
			t.Fatalf("the generation ended after %v with %d letters on the topic, want the poison's one landed", ended, n)
		}
		if ended < q.delay {
			t.Fatalf("the generation ended after %v, before the abandoned letter landed (%v)", ended, q.delay)
		}
	})
}

// With no write running, Settle is settled whatever its context says: a handover whose settle
// deadline passed during a long drain is not counted as unsettled when nothing is on its way.
func TestDeadLetterSettleWithNothingRunning(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	q := &queuedTopic{topic: memoryTopic{clock: t0}}
	d := q.sender()
	if err := d.Send(t.Context(), letters(0, 2, t0)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for i := range 200 {
		if err := d.Settle(ctx); err != nil {
			t.Fatalf("try %d: %v with nothing running", i, err)
		}
	}
}
