package alert

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/repeatrate/repeatrate/schemas"
)

// Subscriber reads the snapshot, suite-snapshot and alerts topics as any subscriber does: every
// partition from its first offset, without a consumer group, so that every evaluator holds the
// latest snapshot of everything (the snapshot topics are compacted: reading them whole is reading
// the table). From the alerts topic it keeps only revived cases.
type Subscriber struct {
	// Brokers and Dialer reach Kafka.
	Brokers []string
	Dialer  *kafka.Dialer
	// Topics are read whole; Partitions lists a topic's partitions.
	Topics     []string
	Partitions func(ctx context.Context, topic string) ([]int, error)
	Log        *zap.Logger
}

// Run sends every decodable update to out until ctx ends; undecodable messages are logged and
// skipped. One goroutine per partition, all ended before Run returns.
func (s *Subscriber) Run(ctx context.Context, out chan<- Update) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, topic := range s.Topics {
		parts, err := s.partitions(ctx, topic)
		if err != nil || ctx.Err() != nil {
			return err
		}
		for _, p := range parts {
			g.Go(func() error { return s.partition(gctx, topic, p, out) })
		}
	}
	return g.Wait()
}

// partitions asks for topic's partitions until it gets them or ctx ends: a topic that does not
// exist yet (nothing published, no create_topics) is waited for, not an error.
func (s *Subscriber) partitions(ctx context.Context, topic string) ([]int, error) {
	for {
		parts, err := s.Partitions(ctx, topic)
		if err == nil {
			return parts, nil
		}
		s.Log.Info("alert subscriber: waiting for topic", zap.String("topic", topic), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(5 * time.Second):
		}
	}
}

func (s *Subscriber) partition(ctx context.Context, topic string, p int, out chan<- Update) error {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: s.Brokers, Dialer: s.Dialer, Topic: topic, Partition: p,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 500 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(kafka.FirstOffset); err != nil {
		return err
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("subscribe %s/%d: %w", topic, p, err)
		}
		u, ok, err := Decode(m.Value)
		if err != nil {
			s.Log.Warn("alert subscriber: undecodable message", zap.String("topic", topic), zap.Int("partition", p),
				zap.Int64("offset", m.Offset), zap.Error(err))
			continue
		}
		if !ok {
			continue
		}
		select {
		case out <- u:
		case <-ctx.Done():
			return nil
		}
	}
}

// Decode reads a structured CloudEvent as published on the snapshot, suite or alerts topic. It
// reports false for types the evaluator does not read (abnormal samples, its own alerts).
func Decode(b []byte) (Update, bool, error) {
	var ev struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &ev); err != nil {
		return Update{}, false, err
	}
	var u Update
	var target any
	switch ev.Type {
	case schemas.TypeSnapshot:
		u.Snapshot = &schemas.Snapshot{}
		target = u.Snapshot
	case schemas.TypeSuiteDiscrimination:
		u.Discrimination = &schemas.SuiteDiscrimination{}
		target = u.Discrimination
	case schemas.TypeSuiteStability:
		u.Stability = &schemas.SuiteStability{}
		target = u.Stability
	case schemas.TypeCaseRevived:
		u.Revived = &schemas.CaseRevived{}
		target = u.Revived
	default:
		return Update{}, false, nil
	}
	if err := json.Unmarshal(ev.Data, target); err != nil {
		return Update{}, false, fmt.Errorf("%s data: %w", ev.Type, err)
	}
	return u, true, nil
}
