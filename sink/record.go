package sink

import (
	"time"

	"github.com/segmentio/kafka-go"
)

// Record sizes (docs/semantics.md#limits). Kafka refuses a record batch larger than the topic's
// max.message.bytes, and a refused publish is retried until the batch times out, so repeatrate
// bounds what it writes instead of hoping:
//
//   - The limits of package schemas keep every snapshot, suite snapshot and alert that any valid
//     input can cause at or below MaxRecordBytes (TestOutputLimits computes the worst case through
//     the encoders); dead letters are cut to fit (consumer.DeadLetter.RecordWithin).
//   - A writer's BatchBytes is its topic's limit less BatchOverhead (WriterBatchBytes), so a batch
//     of records is never larger than the topic accepts.
//   - At start the processor reads the output topics' max.message.bytes and refuses to run when
//     one is below MinTopicLimit.
const (
	// MaxRecordBytes is the largest output record, as RecordSize counts it, that valid input can
	// cause.
	MaxRecordBytes = 1_000_000

	// BatchOverhead bounds what a Kafka record batch adds to the RecordSize of the records it holds:
	// the 61-byte v2 batch header, rounded up. (Each record's own framing is at most the 22 bytes
	// RecordSize already counts for it.)
	BatchOverhead = 64

	// MinTopicLimit is the smallest max.message.bytes an output topic may have.
	MinTopicLimit = MaxRecordBytes + BatchOverhead

	// DefaultTopicLimit is Kafka's default max.message.bytes (message.max.bytes): 1 MiB and the
	// 12-byte log overhead. It is assumed when the broker does not tell a topic's limit.
	DefaultTopicLimit = 1<<20 + 12
)

// RecordSize is the size kafka-go's Writer counts for m against BatchBytes: key, value and
// headers with the framing of the v1 message format (22 bytes) and varint header lengths. It is
// at least the bytes m takes in a v2 record batch.
func RecordSize(m *kafka.Message) int {
	n := 22 + len(m.Key) + len(m.Value) + VarintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += HeaderSize(h)
	}
	return n
}

// HeaderSize is the size of h in a Kafka v2 record: key and value, each with its varint length.
func HeaderSize(h kafka.Header) int {
	return VarintLen(len(h.Key)) + len(h.Key) + VarintLen(len(h.Value)) + len(h.Value)
}

// VarintLen is the length of n as a zig-zag varint, as Kafka writes lengths in a v2 record.
func VarintLen(n int) int {
	u := uint64(n) << 1
	if n < 0 {
		u = ^u
	}
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

// WriterBatchBytes is the kafka.Writer BatchBytes for a topic whose max.message.bytes is limit:
// batches kafka-go fills up to it are never larger than the topic accepts. A writer that
// compresses its batches leaves room for compression's overhead too (CompressedWriterBatchBytes).
func WriterBatchBytes(limit int) int64 { return int64(limit - BatchOverhead) }

// CompressionOverhead bounds what compression adds to n bytes of records that do not compress
// (random bytes, base64): every codec Kafka has frames its output in blocks of 32 KiB to 4 MiB
// with a few bytes of header each, plus a header and checksum per batch — a few hundred bytes per
// MiB, well under this bound. kafka-go counts BatchBytes before compression while the broker
// checks the compressed batch, so without the room a full batch of such records is refused.
func CompressionOverhead(n int) int { return 1024 + n/256 }

// CompressedWriterBatchBytes is the BatchBytes of a writer to a topic whose max.message.bytes is
// limit that compresses its batches: the compressed batch is never larger than the topic accepts.
func CompressedWriterBatchBytes(limit int) int64 {
	n := WriterBatchBytes(limit)
	return n - int64(CompressionOverhead(int(n)))
}

// MinCompressedTopicLimit is MinTopicLimit for output topics whose writers compress: the
// smallest max.message.bytes whose CompressedWriterBatchBytes holds a MaxRecordBytes record.
var MinCompressedTopicLimit = func() int {
	limit := MinTopicLimit
	for CompressedWriterBatchBytes(limit) < MaxRecordBytes {
		limit++
	}
	return limit
}()

// Record renders an output event as the Kafka message that carries it: keyed by subject, the
// structured CloudEvent as value, stamped now.
func Record(o *Out, now time.Time) (kafka.Message, error) {
	b, err := Encode(o)
	if err != nil {
		return kafka.Message{}, err
	}
	return kafka.Message{
		Key:     []byte(o.Subject),
		Value:   b,
		Time:    now,
		Headers: []kafka.Header{{Key: "content-type", Value: []byte(ContentType)}},
	}, nil
}
