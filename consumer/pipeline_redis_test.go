package consumer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// countingStore signals once its second Apply returned: the batch after the first was applied.
type countingStore struct {
	Store
	mu      sync.Mutex
	applies int
	second  chan struct{}
}

func (s *countingStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	a, err := s.Store.Apply(ctx, obs, at)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.applies++; s.applies == 2 {
		close(s.second)
	}
	return a, err
}

// breakingPublisher fails every publish while broken, once the store applied a second batch.
type breakingPublisher struct {
	recordingPublisher
	store  *countingStore
	mu     sync.Mutex
	broken bool
}

func (p *breakingPublisher) isBroken() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.broken
}

func (p *breakingPublisher) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	if p.isBroken() {
		select {
		case <-p.store.second:
		case <-ctx.Done():
			return ctx.Err()
		}
		return errors.New("broker not available")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.recordingPublisher.Publish(ctx, snaps)
}

// auditHandler checks, at every Verify, that the offsets about to be committed cover only
// messages of batches that were published, and heals the publisher (pub, when set) after its
// first failure.
type auditHandler struct {
	*Processor
	t   *testing.T
	pub *breakingPublisher

	mu        sync.Mutex
	prepared  map[int64]int  // offset → times prepared
	published map[int64]bool // offset → in a batch whose Publish returned nil
	failures  int
	committed int64
}

func (h *auditHandler) Prepare(msgs []kafka.Message) (*Batch, error) {
	h.mu.Lock()
	for _, m := range msgs {
		h.prepared[m.Offset]++
	}
	h.mu.Unlock()
	return h.Processor.Prepare(msgs)
}

func (h *auditHandler) Publish(ctx context.Context, b *Batch) error {
	err := h.Processor.Publish(ctx, b)
	if err != nil {
		h.mu.Lock()
		h.failures++
		h.mu.Unlock()
		h.pub.mu.Lock()
		h.pub.broken = false
		h.pub.mu.Unlock()
		return err
	}
	h.markPublished(b)
	return nil
}

// markPublished records b's messages as published.
func (h *auditHandler) markPublished(b *Batch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range b.Messages() {
		h.published[m.Offset] = true
	}
}

func (h *auditHandler) Verify(ctx context.Context, mark int64, offsets map[string]map[int]int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, parts := range offsets {
		for _, next := range parts {
			for off := int64(0); off < next; off++ {
				if !h.published[off] {
					h.t.Errorf("about to commit offset %d although message %d was never published", next, off)
				}
			}
			h.committed = max(h.committed, next)
		}
	}
	return h.Processor.Verify(ctx, mark, offsets)
}

func (h *auditHandler) state() (committed int64, failures int, prepared map[int64]int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	prepared = make(map[int64]int, len(h.prepared))
	for k, v := range h.prepared {
		prepared[k] = v
	}
	return h.committed, h.failures, prepared
}

// On real Kafka and Redis: batch 0's publish fails for good after batch 1 was applied. The group
// commits neither, ends the generation, consumes both again from the committed offsets, and ends
// with the counts of one clean pass.
func TestPipelinePublishFailureRewindsOnKafkaAndRedis(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	client := testenv.Redis(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	name := testenv.Name(t, "pipeline")
	testenv.CleanPrefix(t, client, name)
	createTopic(ctx, t, brokers, name, 1)
	// 40 opportunities, every fourth a confirmed repeat, and 8 of them sent again.
	msgs := repeatedLive(0, 48, 8, 5)
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: name, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	writeAll(ctx, t, w, msgs)

	cfg := aggregator.RedisConfig{Prefix: name, Retention: 30 * 24 * time.Hour, Group: name}
	rates, suites := redisStores(t, client, cfg)
	store := &countingStore{Store: rates, second: make(chan struct{})}
	pub := &breakingPublisher{store: store, broken: true}
	metrics := NewMetrics(prometheus.NewRegistry())
	p, err := NewProcessor(ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}, newTestDecoder(t), store, suites, pub,
		&recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), metrics)
	if err != nil {
		t.Fatal(err)
	}
	h := &auditHandler{Processor: p, t: t, pub: pub, prepared: map[int64]int{}, published: map[int64]bool{}}
	g, err := NewGroup(GroupConfig{Brokers: brokers, GroupID: name, Topics: []string{name}, MaxBatch: 10, Linger: 200 * time.Millisecond,
		DrainTimeout: 2 * time.Second, MaxInFlight: 3, SessionTimeout: 6 * time.Second}, h, zap.NewNop(), metrics)
	if err != nil {
		t.Fatal(err)
	}
	ran, stop := runGroup(ctx, t, g)
	defer stop()

	for {
		committed, failures, _ := h.state()
		if committed == int64(len(msgs)) && failures > 0 {
			break
		}
		select {
		case err := <-ran:
			t.Fatalf("group stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("committed up to %d of %d, %d publish failures", committed, len(msgs), failures)
		case <-time.After(50 * time.Millisecond):
		}
	}
	_, failures, prepared := h.state()
	if failures != 1 {
		t.Errorf("%d publish failures, want 1", failures)
	}
	if prepared[0] != 2 || prepared[int64(len(msgs)-1)] != 1 {
		t.Errorf("offset 0 prepared %d times, the last %d: want batch 0 consumed again after the failure, the last batch once", prepared[0], prepared[int64(len(msgs)-1)])
	}
	again := 0 // messages of batch 0 and every batch in flight with it, consumed again
	for _, n := range prepared {
		if n == 2 {
			again++
		}
	}
	if again <= 10 {
		t.Errorf("%d messages consumed twice: want batch 0 and the batch applied after it (MaxBatch 10)", again)
	}

	k := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "fix", Source: aggregator.Live}
	tally, err := rates.Tally(ctx, k, now)
	if err != nil {
		t.Fatal(err)
	}
	if w := tally.Snapshot(k, now).Windows.All; w.Passed != 30 || w.ConfirmedRepeats != 10 {
		t.Errorf("redis holds %d passed and %d confirmed; one clean pass gives 30 and 10", w.Passed, w.ConfirmedRepeats)
	}
	pub.mu.Lock()
	last := pub.snaps[len(pub.snaps)-1].Windows.All
	pub.mu.Unlock()
	if last.Passed != 30 || last.ConfirmedRepeats != 10 {
		t.Errorf("last snapshot published: %d passed, %d confirmed; want 30 and 10", last.Passed, last.ConfirmedRepeats)
	}
}
