package alert

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
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
// skipped. Once every partition has been read up to its end offset as of the start (a topic that
// does not exist yet counts as read), it sends one Update with CaughtUp set: the table then holds
// everything published before the start. One goroutine per topic and partition, all ended before
// Run returns.
func (s *Subscriber) Run(ctx context.Context, out chan<- Update) error {
	g, gctx := errgroup.WithContext(ctx)
	var topicsLeft atomic.Int64
	topicsLeft.Store(int64(len(s.Topics)))
	topicDone := func() {
		if topicsLeft.Add(-1) == 0 {
			select {
			case out <- Update{CaughtUp: true}:
			case <-gctx.Done():
			}
		}
	}
	for _, topic := range s.Topics {
		g.Go(func() error {
			parts, err := s.Partitions(gctx, topic)
			// Kafka unreachable is not a missing topic: ask again until it answers either way.
			for err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
				s.Log.Warn("alert subscriber: metadata", zap.String("topic", topic), zap.Error(err))
				select {
				case <-gctx.Done():
					return nil
				case <-time.After(retryEvery):
				}
				parts, err = s.Partitions(gctx, topic)
			}
			if err != nil {
				// Nothing to catch up on: the topic does not exist yet. Wait for it.
				topicDone()
				if parts, err = s.partitions(gctx, topic); err != nil || gctx.Err() != nil {
					return err
				}
				for _, p := range parts {
					g.Go(func() error { return s.partition(gctx, topic, p, out, func() {}) })
				}
				return nil
			}
			var partsLeft atomic.Int64
			partsLeft.Store(int64(len(parts)))
			for _, p := range parts {
				g.Go(func() error {
					return s.partition(gctx, topic, p, out, func() {
						if partsLeft.Add(-1) == 0 {
							topicDone()
						}
					})
				})
			}
			return nil
		})
	}
	return g.Wait()
}

// retryEvery is how long the subscriber waits before asking Kafka again.
const retryEvery = 2 * time.Second

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
		case <-time.After(retryEvery):
		}
	}
}

// offsets are the partition's first offset and its end offset now (the offset the next message
// will take).
func (s *Subscriber) offsets(ctx context.Context, topic string, p int) (first, end int64, err error) {
	var errs []error
	for _, b := range s.Brokers {
		conn, err := s.Dialer.DialLeader(ctx, "tcp", b, topic, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		first, end, err := conn.ReadOffsets()
		conn.Close()
		if err == nil {
			return first, end, nil
		}
		errs = append(errs, err)
	}
	return 0, 0, fmt.Errorf("offsets of %s/%d: %w", topic, p, errors.Join(errs...))
}

// partition reads one partition from its first offset; caughtUp is called once, when the message
// before the end offset as of the start was handed on (at once for an empty partition).
func (s *Subscriber) partition(ctx context.Context, topic string, p int, out chan<- Update, caughtUp func()) error {
	first, end, err := s.offsets(ctx, topic, p)
	// A leader that cannot be reached (a broker restarting, a new topic still electing) is waited
	// for: an error here would end the errgroup, and inside run the whole processor.
	for err != nil {
		s.Log.Warn("alert subscriber: offsets", zap.String("topic", topic), zap.Int("partition", p), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retryEvery):
		}
		first, end, err = s.offsets(ctx, topic, p)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: s.Brokers, Dialer: s.Dialer, Topic: topic, Partition: p,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 500 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(kafka.FirstOffset); err != nil {
		return err
	}
	behind := true
	if end <= first {
		behind = false
		caughtUp()
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
		}
		if ok {
			select {
			case out <- u:
			case <-ctx.Done():
				return nil
			}
		}
		// Caught up at the end offset of the start, or at the partition's high-water mark of this
		// fetch (compaction may have removed the message just before the end offset).
		if behind && (m.Offset+1 >= end || m.Offset+1 >= m.HighWaterMark) {
			behind = false
			caughtUp()
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
