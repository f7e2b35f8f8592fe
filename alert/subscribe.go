package alert

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/schemas"
)

// Subscriber reads the snapshot, suite-snapshot and alerts topics as any subscriber does: every
// partition from its first offset, without a consumer group, so that every evaluator holds the
// latest snapshot of everything (the snapshot topics are compacted: reading them whole is reading
// the table). From the alerts topic it keeps only revived cases.
//
// It never gives up while its context lasts: a broker restarting, a leader moving or a topic not
// yet created is retried with backoff (counted, and told by Degraded), and a partition resumes
// from the offset after the last message it handed on. Partitions added to a topic while it runs
// are found within RescanEvery and read from their first offset.
type Subscriber struct {
	// Brokers and Dialer reach Kafka.
	Brokers []string
	Dialer  *kafka.Dialer
	// Topics are read whole; Partitions lists a topic's partitions.
	Topics     []string
	Partitions func(ctx context.Context, topic string) ([]int, error)
	// RescanEvery is how often the partitions of every topic are listed again (default 30s).
	RescanEvery time.Duration
	Log         *zap.Logger
	// Metrics, when set, counts failures as errors{stage="subscribe"}.
	Metrics *Metrics

	mu      sync.Mutex
	failing map[string]string // "topic/partition" (or "topic") → the last failure, while retrying
}

// Degraded lists what the subscriber is retrying now ("topic/partition: error"), sorted; empty
// when every partition is being read.
func (s *Subscriber) Degraded() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.failing))
	for where, err := range s.failing {
		out = append(out, where+": "+err)
	}
	slices.Sort(out)
	return out
}

// failed records and counts a failure at where; ok clears it once where works again.
func (s *Subscriber) failed(where string, err error) {
	s.Log.Warn("alert subscriber: retrying", zap.String("at", where), zap.Error(err))
	if s.Metrics != nil {
		s.Metrics.errors.WithLabelValues("subscribe").Inc()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing == nil {
		s.failing = map[string]string{}
	}
	s.failing[where] = err.Error()
}

func (s *Subscriber) ok(where string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failing, where)
}

// Run sends every decodable update to out until ctx ends; undecodable messages are logged and
// skipped. Once every partition listed at the start has been read up to its end offset as of the
// start (a topic that does not exist yet counts as read), it sends one Update with CaughtUp set:
// the table then holds everything published before the start. One goroutine per topic and
// partition, all ended before Run returns, which is always nil once ctx ended: no failure of
// Kafka's ends it.
func (s *Subscriber) Run(ctx context.Context, out chan<- Update) error {
	var wg sync.WaitGroup
	var topicsLeft atomic.Int64
	topicsLeft.Store(int64(len(s.Topics)))
	topicDone := func() {
		if topicsLeft.Add(-1) == 0 {
			select {
			case out <- Update{CaughtUp: true}:
			case <-ctx.Done():
			}
		}
	}
	for _, topic := range s.Topics {
		wg.Go(func() { s.topic(ctx, &wg, topic, out, topicDone) })
	}
	wg.Wait()
	return nil
}

// retryEvery is how long the subscriber waits before asking Kafka again after a failure; a
// partition that keeps failing waits up to retryMax.
const (
	retryEvery = 2 * time.Second
	retryMax   = 30 * time.Second
)

// topic lists topic's partitions, starts a reader for each, and lists them again every
// RescanEvery to start readers for partitions added since. topicDone is called once, when every
// partition of the first list has caught up (at once when the topic does not exist yet).
func (s *Subscriber) topic(ctx context.Context, wg *sync.WaitGroup, topic string, out chan<- Update, topicDone func()) {
	parts, err := s.Partitions(ctx, topic)
	// Kafka unreachable is not a missing topic: ask again until it answers either way.
	for err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
		s.failed(topic, fmt.Errorf("metadata: %w", err))
		if !sleep(ctx, retryEvery) {
			return
		}
		parts, err = s.Partitions(ctx, topic)
	}
	s.ok(topic)
	started := map[int]bool{}
	if err != nil {
		// Nothing to catch up on: the topic does not exist yet. Its partitions are read once the
		// rescan below finds them.
		topicDone()
	} else {
		var partsLeft atomic.Int64
		partsLeft.Store(int64(len(parts)))
		if len(parts) == 0 {
			topicDone()
		}
		for _, p := range parts {
			started[p] = true
			wg.Go(func() {
				s.partition(ctx, topic, p, out, func() {
					if partsLeft.Add(-1) == 0 {
						topicDone()
					}
				})
			})
		}
	}
	rescan := s.RescanEvery
	if rescan <= 0 {
		rescan = 30 * time.Second
	}
	for {
		every := rescan
		if len(started) == 0 {
			// A topic not there yet is looked for more often: its first snapshots are awaited.
			every = min(rescan, retryEvery)
		}
		if !sleep(ctx, every) {
			return
		}
		parts, err := s.Partitions(ctx, topic)
		if err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
			s.failed(topic, fmt.Errorf("metadata: %w", err))
			continue
		}
		s.ok(topic) // Kafka answered, also when the topic is not there yet
		if err != nil {
			continue
		}
		for _, p := range parts {
			if !started[p] {
				started[p] = true
				s.Log.Info("alert subscriber: reading a new partition", zap.String("topic", topic), zap.Int("partition", p))
				wg.Go(func() { s.partition(ctx, topic, p, out, func() {}) })
			}
		}
	}
}

// sleep waits for d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
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

// partition reads one partition from its first offset until ctx ends; caughtUp is called once,
// when the message before the end offset as of the start was handed on (at once for an empty
// partition). A failure (a leader that cannot be reached, a broker restarting) is retried with
// backoff from the offset after the last message handed on: an error here would otherwise end
// the evaluator, and inside run it must never end the processor.
func (s *Subscriber) partition(ctx context.Context, topic string, p int, out chan<- Update, caughtUp func()) {
	where := fmt.Sprintf("%s/%d", topic, p)
	wait := retryEvery
	backoff := func(err error) bool {
		s.failed(where, err)
		ok := sleep(ctx, wait)
		wait = min(2*wait, retryMax)
		return ok
	}
	first, end, err := s.offsets(ctx, topic, p)
	for err != nil {
		if !backoff(err) {
			return
		}
		first, end, err = s.offsets(ctx, topic, p)
	}
	s.ok(where)
	behind := true
	if end <= first {
		behind = false
		caughtUp()
	}
	next := kafka.FirstOffset
	for ctx.Err() == nil {
		err := s.read(ctx, topic, p, &next, func(m kafka.Message) bool {
			wait = retryEvery
			s.ok(where)
			u, ok, err := Decode(m.Value)
			if err != nil {
				s.Log.Warn("alert subscriber: undecodable message", zap.String("topic", topic), zap.Int("partition", p),
					zap.Int64("offset", m.Offset), zap.Error(err))
			}
			if ok {
				select {
				case out <- u:
				case <-ctx.Done():
					return false
				}
			}
			// Caught up at the end offset of the start, or at the partition's high-water mark of
			// this fetch (compaction may have removed the message just before the end offset).
			if behind && (m.Offset+1 >= end || m.Offset+1 >= m.HighWaterMark) {
				behind = false
				caughtUp()
			}
			return true
		})
		if err == nil || ctx.Err() != nil {
			return
		}
		// Read on once the partition's leader answers again; it is no longer degraded then, even
		// if no message comes for a long time (a quiet partition of a compacted topic).
		for {
			if !backoff(err) {
				return
			}
			if _, _, err = s.offsets(ctx, topic, p); err == nil {
				s.ok(where)
				break
			}
		}
	}
}

// read hands each message of partition p from *next on to handle until ctx ends, handle says
// stop (nil), or a fetch fails (its error); *next is then the offset after the last message
// handled.
func (s *Subscriber) read(ctx context.Context, topic string, p int, next *int64, handle func(kafka.Message) bool) error {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: s.Brokers, Dialer: s.Dialer, Topic: topic, Partition: p,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 500 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(*next); err != nil {
		return fmt.Errorf("subscribe %s/%d at %d: %w", topic, p, *next, err)
	}
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("subscribe %s/%d: %w", topic, p, err)
		}
		*next = m.Offset + 1
		if !handle(m) {
			return nil
		}
	}
}

// Decode reads a structured CloudEvent as published on the snapshot, suite or alerts topic. It
// reports false for types the evaluator does not read (abnormal samples, its own alerts).
func Decode(b []byte) (Update, bool, error) {
	// Snapshots are most of what is read (one per aggregate and batch, and the snapshot topic whole
	// at start): the envelope and the data in one pass, not the data decoded again.
	var snap struct {
		Type string            `json:"type"`
		Data *schemas.Snapshot `json:"data"`
	}
	if err := json.Unmarshal(b, &snap); err == nil && snap.Type == schemas.TypeSnapshot {
		if snap.Data == nil {
			return Update{}, false, fmt.Errorf("%s without data", snap.Type)
		}
		return Update{Snapshot: snap.Data}, true, nil
	}
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
