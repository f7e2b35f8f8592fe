package consumer

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// Headers added to a dead letter beside the original message's own headers.
const (
	HeaderDLQReason    = "repeatrate-dlq-reason"
	HeaderDLQDetail    = "repeatrate-dlq-detail"
	HeaderDLQTopic     = "repeatrate-dlq-topic"
	HeaderDLQPartition = "repeatrate-dlq-partition"
	HeaderDLQOffset    = "repeatrate-dlq-offset"
	// HeaderDLQOriginalSize is the size in bytes of the original key, value and headers together,
	// with their length prefixes as a Kafka record holds them (the size the input limit is checked
	// against); set only on a letter that was cut to fit the dead-letter topic.
	HeaderDLQOriginalSize = "repeatrate-dlq-original-size"
	// HeaderDLQTruncated names what was cut to fit, a comma-separated list of value, key and
	// headers (original headers dropped from the end); set only with HeaderDLQOriginalSize.
	HeaderDLQTruncated = "repeatrate-dlq-truncated"
)

// maxDetailBytes caps the detail header: details quote clipped input, but a letter must not grow
// with them.
const maxDetailBytes = 1024

// DeadLetter is a message that could not be processed, with why.
type DeadLetter struct {
	Message kafka.Message
	Reason  schemas.Reason
	Detail  string
}

// Record returns the message to write to the dead-letter topic, at most sink.MaxRecordBytes as
// sink.RecordSize counts it: RecordWithin(sink.MaxRecordBytes).
func (d DeadLetter) Record() kafka.Message { return d.RecordWithin(sink.MaxRecordBytes) }

// RecordWithin returns the message to write to the dead-letter topic: the original key, value and
// headers, plus reason and origin headers. Origin (topic, partition, offset) identifies the
// original, so a reader can drop a dead letter written twice.
//
// A letter larger than limit (sink.RecordSize) is cut so that quarantining never blocks: the
// original value is truncated first, then the key, then original headers are dropped from the end;
// the reason and origin headers are always kept, and HeaderDLQOriginalSize and HeaderDLQTruncated
// say what happened. limit must leave room for those (a few hundred bytes; sink.MinTopicLimit
// does).
func (d DeadLetter) RecordWithin(limit int) kafka.Message {
	m := d.Message
	detail := d.Detail
	if len(detail) > maxDetailBytes {
		detail = strings.ToValidUTF8(detail[:maxDetailBytes], "")
	}
	own := []kafka.Header{
		{Key: HeaderDLQReason, Value: []byte(d.Reason)},
		{Key: HeaderDLQDetail, Value: []byte(detail)},
		{Key: HeaderDLQTopic, Value: []byte(m.Topic)},
		{Key: HeaderDLQPartition, Value: []byte(strconv.Itoa(m.Partition))},
		{Key: HeaderDLQOffset, Value: []byte(strconv.FormatInt(m.Offset, 10))},
	}
	out := kafka.Message{Key: m.Key, Value: m.Value, Headers: append(append(make([]kafka.Header, 0, len(m.Headers)+len(own)+2), m.Headers...), own...)}
	if recordSize(&out) <= limit {
		return out
	}

	// Cut: the headers that must stay, with the longest truncation note while sizing.
	must := append(own,
		kafka.Header{Key: HeaderDLQOriginalSize, Value: []byte(strconv.Itoa(cloudevent.MessageSize(&m)))},
		kafka.Header{Key: HeaderDLQTruncated, Value: []byte("value,key,headers")})
	// The longest prefix of the original headers that fits beside must with no key and value, in
	// one pass over the headers' sizes: the record's size grows with each header kept, and key
	// and value add their lengths to it (sink.RecordSize). Measuring the whole record again per
	// dropped header took quadratic time, minutes for a letter of half a million headers.
	mustSize := recordSize(&kafka.Message{Headers: must}) - sink.VarintLen(len(must)) // less the header count
	headersSize := mustSize + sink.VarintLen(len(must))                               // no original header
	kept, sum := 0, 0                                                                 // original headers kept, their size
	for _, h := range m.Headers {
		next := mustSize + sink.VarintLen(kept+1+len(must)) + sum + sink.HeaderSize(h)
		if next > limit {
			break
		}
		kept, sum, headersSize = kept+1, sum+sink.HeaderSize(h), next
	}
	var cut []string
	key, value := m.Key, m.Value
	if room := limit - headersSize; len(value) > 0 && headersSize+len(key)+len(value) > limit {
		value = value[:max(0, min(len(value), room-len(key)))]
		cut = append(cut, "value")
	}
	if room := limit - headersSize - len(value); len(key) > room {
		key = key[:max(0, room)]
		cut = append(cut, "key")
	}
	if kept < len(m.Headers) {
		cut = append(cut, "headers")
	}
	must[len(must)-1].Value = []byte(strings.Join(cut, ","))
	out = kafka.Message{Key: key, Value: value, Headers: append(append(make([]kafka.Header, 0, kept+len(must)), m.Headers[:kept]...), must...)}
	if len(key) == len(m.Key) && len(value) < len(m.Value) {
		// The note is shorter than the one sized for: give the room back to the value.
		out.Value = m.Value[:min(len(m.Value), len(value)+limit-recordSize(&out))]
	}
	return out
}

// recordSize is sink.RecordSize, a variable so that tests can count how often RecordWithin
// measures a whole record.
var recordSize = sink.RecordSize

// MessageWriter writes messages to one topic and returns once they are acknowledged;
// *kafka.Writer with RequiredAcks set to RequireAll is one.
type MessageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// DeadLetters writes dead letters to a topic through a MessageWriter, each input message at most
// once as far as it can tell: it remembers the letters it wrote itself and, before writing, reads
// what the topic gained since it last looked (log may be nil to skip both, for tests), and leaves
// out messages that already have their letter. Letters are cut to the record limit
// (DeadLetter.RecordWithin).
//
// A write is not cancelled with the context of its Send: kafka-go keeps a write whose caller
// stopped waiting queued and delivers it later. So the write runs on, one at a time: the next
// Send waits for it before it looks for letters on the topic (a letter still on its way would
// not be found there and be written again), and Settle waits for it before the partitions go to
// another instance, which could not find it either.
type DeadLetters struct {
	w       MessageWriter
	idx     *dlqIndex
	limit   int
	now     func() time.Time // the sender's clock, against which message times are judged
	writing chan struct{}    // holds a token from the start of a Send until its write has ended
}

// NewDeadLetters returns a dead-letter sender on w that deduplicates against log and cuts letters
// to sink.MaxRecordBytes.
func NewDeadLetters(w MessageWriter, log DeadLetterLog) *DeadLetters {
	d := &DeadLetters{w: w, limit: sink.MaxRecordBytes, now: time.Now, writing: make(chan struct{}, 1)}
	if log != nil {
		d.idx = newDLQIndex(log, defaultMaxOrigins)
	}
	return d
}

// WithRecordLimit makes s cut letters to limit bytes (sink.RecordSize) instead of
// sink.MaxRecordBytes: the dead-letter writer's BatchBytes, so a letter always fits its topic.
func (s *DeadLetters) WithRecordLimit(limit int) *DeadLetters {
	s.limit = limit
	return s
}

// Send writes dls and returns when all are acknowledged. When ctx ends first it returns an error
// and the write runs on (see DeadLetters).
func (s *DeadLetters) Send(ctx context.Context, dls []DeadLetter) error {
	if len(dls) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("dead letters: %w", err)
	}
	select {
	case s.writing <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("dead letters: an earlier write is still running: %w", ctx.Err())
	}
	msgs, written, err := s.unwritten(ctx, dls)
	if err != nil || len(msgs) == 0 {
		<-s.writing
		return err
	}
	done := make(chan error, 1)
	go func() {
		defer func() { <-s.writing }()
		err := s.w.WriteMessages(context.WithoutCancel(ctx), msgs...)
		if err == nil && s.idx != nil {
			// Remembered, not only read back later: the time bound of the next read may not
			// reach them (lettersSince).
			s.idx.mu.Lock()
			for _, o := range written {
				s.idx.add(o)
			}
			s.idx.mu.Unlock()
		}
		done <- err // what a partial write stored is found on the topic by the retry
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("dead letters: stopped waiting for %d (%w); the writer may still deliver them", len(msgs), ctx.Err())
	}
}

// unwritten returns the letters of dls not known to be on the topic, and their origins.
func (s *DeadLetters) unwritten(ctx context.Context, dls []DeadLetter) ([]kafka.Message, []origin, error) {
	if s.idx != nil {
		s.idx.mu.Lock()
		defer s.idx.mu.Unlock()
		// Only messages not known to have a letter need the topic read: a redelivery to the
		// sender that wrote the letters reads nothing.
		if unknown := slices.DeleteFunc(slices.Clone(dls), func(d DeadLetter) bool { return s.idx.has(originOfMessage(&d.Message)) }); len(unknown) > 0 {
			if err := s.idx.sync(ctx, lettersSince(unknown, s.now())); err != nil {
				return nil, nil, err
			}
		}
	}
	var msgs []kafka.Message
	var written []origin
	for i := range dls {
		o := originOfMessage(&dls[i].Message)
		if s.idx != nil && s.idx.has(o) {
			continue
		}
		msgs = append(msgs, dls[i].RecordWithin(s.limit))
		written = append(written, o)
	}
	return msgs, written, nil
}

// Settle waits until the write of the last Send has ended, delivered or given up by the writer:
// the consumer group settles before it hands its partitions over, so that the next owner finds
// the letters on the topic. It returns an error when ctx ends first.
func (s *DeadLetters) Settle(ctx context.Context) error {
	select { // nothing running: settled, whatever ctx says
	case s.writing <- struct{}{}:
		<-s.writing
		return nil
	default:
	}
	select {
	case s.writing <- struct{}{}:
		<-s.writing
		return nil
	case <-ctx.Done():
		return fmt.Errorf("a dead-letter write still running: %w", ctx.Err())
	}
}

func originOfMessage(m *kafka.Message) origin { return origin{m.Topic, m.Partition, m.Offset} }

// letterClockSkew is how far the clocks that stamp input messages, dead letters and the senders'
// receipt times may disagree (producers', processors' and brokers' clocks).
const letterClockSkew = time.Hour

// lettersSince returns the earliest time a dead letter of any of dls can carry, judged at now, the
// sender's clock; the zero time means every letter.
//
// A letter is stamped with the clock of the sender that wrote it, after its message arrived: no
// earlier than the message's time less the skew allowed between clocks, when that time is honest.
// But a message's time is its producer's to set (CreateTime), while letters carry the senders'
// clocks. So a message time is taken at most at now: a producer clock that runs ahead cannot push
// the bound past letters written in the last letterClockSkew (and letters this sender wrote itself
// it remembers). A time more than letterClockSkew ahead of now is not trusted at all and reads, as
// a message without a time does, every letter: once per sender, since the index keeps the ranges it
// has read. The limit: a message stamped more than letterClockSkew ahead of the sender that first
// wrote its letter, redelivered more than letterClockSkew later to another sender (a restart or
// another instance) while its time has fallen behind that sender's clock, is not found and gets a
// second letter, with the same origin headers.
//
// A time in the past is honoured however old: the letter may be that old (a long outage, a
// rebuild). A producer clock far behind only makes the index read further back, once per sender.
func lettersSince(dls []DeadLetter, now time.Time) time.Time {
	var since time.Time
	for i, d := range dls {
		t := d.Message.Time
		if t.IsZero() || t.After(now.Add(letterClockSkew)) {
			return time.Time{}
		}
		if t.After(now) {
			t = now
		}
		if i == 0 || t.Before(since) {
			since = t
		}
	}
	return since.Add(-letterClockSkew)
}
