package consumer

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// origin names one input message: what a dead letter is about.
type origin struct {
	topic     string
	partition int
	offset    int64
}

func originOf(headers []kafka.Header) (origin, bool) {
	var o origin
	var okT, okP, okO bool
	for _, h := range headers {
		switch h.Key {
		case HeaderDLQTopic:
			o.topic, okT = string(h.Value), true
		case HeaderDLQPartition:
			p, err := strconv.Atoi(string(h.Value))
			o.partition, okP = p, err == nil
		case HeaderDLQOffset:
			off, err := strconv.ParseInt(string(h.Value), 10, 64)
			o.offset, okO = off, err == nil
		}
	}
	return o, okT && okP && okO
}

// DeadLetterLog reads the dead-letter topic: every record from the given per-partition positions
// up to the current end, and the positions after them.
type DeadLetterLog interface {
	ReadNew(ctx context.Context, from map[int]int64) ([]kafka.Message, map[int]int64, error)
}

// dlqIndex remembers which input messages already have a dead letter, so that a batch redelivered
// after a crash (or retried after a partial write) does not quarantine them twice. It learns from
// the dead-letter topic itself, so it also covers letters another instance wrote.
type dlqIndex struct {
	log  DeadLetterLog
	mu   sync.Mutex
	pos  map[int]int64
	seen map[origin]struct{}
}

func (x *dlqIndex) sync(ctx context.Context) error {
	recs, next, err := x.log.ReadNew(ctx, x.pos)
	if err != nil {
		return fmt.Errorf("read dead-letter topic: %w", err)
	}
	for _, r := range recs {
		if o, ok := originOf(r.Headers); ok {
			x.seen[o] = struct{}{}
		}
	}
	x.pos = next
	return nil
}

// KafkaDeadLetterLog reads a dead-letter topic with kafka-go.
type KafkaDeadLetterLog struct {
	Brokers []string
	Dialer  *kafka.Dialer
	Client  *kafka.Client
	Topic   string
}

// ReadNew implements DeadLetterLog.
func (l *KafkaDeadLetterLog) ReadNew(ctx context.Context, from map[int]int64) ([]kafka.Message, map[int]int64, error) {
	md, err := l.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{l.Topic}})
	if err != nil {
		return nil, nil, err
	}
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range md.Topics {
		if t.Error != nil {
			return nil, nil, t.Error
		}
		for _, p := range t.Partitions {
			req.Topics[l.Topic] = append(req.Topics[l.Topic], kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
		}
	}
	offs, err := l.Client.ListOffsets(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	next := map[int]int64{}
	var out []kafka.Message
	for _, p := range offs.Topics[l.Topic] {
		if p.Error != nil {
			return nil, nil, p.Error
		}
		start := max(from[p.Partition], p.FirstOffset)
		next[p.Partition] = max(start, p.LastOffset)
		if start >= p.LastOffset {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: l.Brokers, Dialer: l.Dialer, Topic: l.Topic,
			Partition: p.Partition, MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 100 * time.Millisecond})
		if err := r.SetOffset(start); err != nil {
			r.Close()
			return nil, nil, err
		}
		for {
			m, err := r.FetchMessage(ctx)
			if err != nil {
				r.Close()
				return nil, nil, err
			}
			out = append(out, m)
			if m.Offset+1 >= p.LastOffset {
				break
			}
		}
		r.Close()
	}
	return out, next, nil
}
