package sink

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// lateWriter acknowledges a write only once released, like a broker that is slow to answer; it
// ignores the context, as kafka-go does with a write it has queued.
type lateWriter struct {
	release   chan struct{}
	mu        sync.Mutex
	delivered int
}

func (w *lateWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	<-w.release
	w.mu.Lock()
	defer w.mu.Unlock()
	w.delivered += len(msgs)
	return nil
}

// A publish the caller stopped waiting for goes on until its writer ends it, and Settle waits for
// it: the consumer group settles before handing its partitions over, so such a snapshot cannot
// land after the next owner's.
func TestAbandonedPublishIsSettled(t *testing.T) {
	w := &lateWriter{release: make(chan struct{})}
	k := NewKafka(w, w, w)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := k.Publish(ctx, []schemas.Snapshot{{Aggregate: schemas.Aggregate{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c",
		Artifact: "a", CorrectionID: "x", Source: "live"}, ObservedAt: time.Now(), Version: 1}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("publish past its deadline: %v, want the deadline", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if err := k.Settle(short); err == nil {
		t.Fatal("settled while the abandoned write still runs")
	}
	settled := make(chan error, 1)
	go func() { settled <- k.Settle(context.Background()) }()
	select {
	case err := <-settled:
		t.Fatalf("settled (%v) before the write ended", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(w.release)
	if err := <-settled; err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.delivered != 1 {
		t.Fatalf("delivered %d, want the abandoned snapshot", w.delivered)
	}
	if err := k.Settle(context.Background()); err != nil {
		t.Fatalf("settle with nothing running: %v", err)
	}
}
