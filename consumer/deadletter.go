package consumer

import (
	"context"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// Headers added to a dead letter beside the original message's own headers.
const (
	HeaderDLQReason    = "repeatrate-dlq-reason"
	HeaderDLQDetail    = "repeatrate-dlq-detail"
	HeaderDLQTopic     = "repeatrate-dlq-topic"
	HeaderDLQPartition = "repeatrate-dlq-partition"
	HeaderDLQOffset    = "repeatrate-dlq-offset"
)

// DeadLetter is a message that could not be processed, with why.
type DeadLetter struct {
	Message kafka.Message
	Reason  schemas.Reason
	Detail  string
}

// Record returns the message to write to the dead-letter topic: the original key, value and
// headers, plus reason and origin headers. Origin (topic, partition, offset) identifies the
// original, so a reader can drop a dead letter written twice.
func (d DeadLetter) Record() kafka.Message {
	m := d.Message
	headers := make([]kafka.Header, 0, len(m.Headers)+5)
	headers = append(headers, m.Headers...)
	headers = append(headers,
		kafka.Header{Key: HeaderDLQReason, Value: []byte(d.Reason)},
		kafka.Header{Key: HeaderDLQDetail, Value: []byte(d.Detail)},
		kafka.Header{Key: HeaderDLQTopic, Value: []byte(m.Topic)},
		kafka.Header{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(m.Partition))},
		kafka.Header{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
	)
	return kafka.Message{Key: m.Key, Value: m.Value, Headers: headers}
}

// MessageWriter writes messages to one topic and returns once they are acknowledged;
// *kafka.Writer with RequiredAcks set to RequireAll is one.
type MessageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// DeadLetters writes dead letters to a topic through a MessageWriter, each input message at most
// once: before writing it reads what the topic gained since it last looked (log may be nil to
// skip this, for tests) and leaves out messages that already have their letter.
type DeadLetters struct {
	w   MessageWriter
	idx *dlqIndex
}

// NewDeadLetters returns a dead-letter sender on w that deduplicates against log.
func NewDeadLetters(w MessageWriter, log DeadLetterLog) *DeadLetters {
	d := &DeadLetters{w: w}
	if log != nil {
		d.idx = &dlqIndex{log: log, pos: map[int]int64{}, seen: map[origin]struct{}{}}
	}
	return d
}

// Send writes dls and returns when all are acknowledged.
func (s *DeadLetters) Send(ctx context.Context, dls []DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	if s.idx != nil {
		s.idx.mu.Lock()
		defer s.idx.mu.Unlock()
		if err := s.idx.sync(ctx); err != nil {
			return err
		}
	}
	msgs := make([]kafka.Message, 0, len(dls))
	for i := range dls {
		m := &dls[i].Message
		if s.idx != nil {
			if _, done := s.idx.seen[origin{m.Topic, m.Partition, m.Offset}]; done {
				continue
			}
		}
		msgs = append(msgs, dls[i].Record())
	}
	if len(msgs) == 0 {
		return nil
	}
	return s.w.WriteMessages(ctx, msgs...)
}
