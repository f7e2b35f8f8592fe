package consumer

import (
	"context"
	"testing"

	"github.com/segmentio/kafka-go"
)

// memoryTopic is a one-partition topic in memory: the writer and the log of one test.
type memoryTopic struct {
	msgs []kafka.Message
	fail bool // fail the next write after storing half of it, as a partial write does
}

func (m *memoryTopic) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	if m.fail {
		m.fail = false
		m.msgs = append(m.msgs, msgs[:len(msgs)/2]...)
		return context.DeadlineExceeded
	}
	m.msgs = append(m.msgs, msgs...)
	return nil
}

func (m *memoryTopic) ReadNew(_ context.Context, from map[int]int64) ([]kafka.Message, map[int]int64, error) {
	start := from[0]
	return m.msgs[start:], map[int]int64{0: int64(len(m.msgs))}, nil
}

func TestDeadLettersOncePerMessage(t *testing.T) {
	topic := &memoryTopic{fail: true}
	d := NewDeadLetters(topic, topic)
	var dls []DeadLetter
	for off := int64(0); off < 6; off++ {
		dls = append(dls, DeadLetter{Message: kafka.Message{Topic: "in", Partition: 1, Offset: off, Value: []byte("x")}, Reason: "undecodable"})
	}
	ctx := context.Background()
	if err := d.Send(ctx, dls); err == nil {
		t.Fatal("the partial write must fail the send")
	}
	// The retry, a redelivery after a crash, and another instance's sender all write each letter once.
	if err := d.Send(ctx, dls); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(ctx, dls[2:]); err != nil {
		t.Fatal(err)
	}
	if err := NewDeadLetters(topic, topic).Send(ctx, dls); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]int{}
	for _, m := range topic.msgs {
		o, ok := originOf(m.Headers)
		if !ok {
			t.Fatalf("dead letter without origin headers: %+v", m.Headers)
		}
		seen[o.offset]++
	}
	if len(seen) != 6 {
		t.Fatalf("letters for %d messages, want 6", len(seen))
	}
	for off, n := range seen {
		if n != 1 {
			t.Fatalf("offset %d has %d letters", off, n)
		}
	}
}
