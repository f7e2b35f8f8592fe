package sink

import (
	"context"
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// MessageWriter writes messages and returns once they are acknowledged; *kafka.Writer with
// RequiredAcks: RequireAll is one.
type MessageWriter interface {
	WriteMessages(ctx context.Context, msgs ...kafka.Message) error
}

// Kafka publishes snapshots to a (compacted) topic, keyed by aggregate ID, so that the topic
// keeps the latest snapshot of every aggregate.
type Kafka struct {
	w MessageWriter
}

// NewKafka returns a snapshot publisher on w.
func NewKafka(w MessageWriter) *Kafka { return &Kafka{w: w} }

// Publish writes snaps in one call and returns once all are acknowledged.
func (k *Kafka) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	msgs := make([]kafka.Message, len(snaps))
	for i := range snaps {
		b, err := EncodeSnapshot(&snaps[i])
		if err != nil {
			return err
		}
		msgs[i] = kafka.Message{
			Key:     []byte(snaps[i].Aggregate.ID()),
			Value:   b,
			Headers: []kafka.Header{{Key: "content-type", Value: []byte(ContentType)}},
		}
	}
	if err := k.w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("publish %d snapshots: %w", len(msgs), err)
	}
	return nil
}
