package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// repeatedLive returns n live attempts with event ids from first: opportunities o0.. for the
// first n-again, every fourth a confirmed repeat, then again of those sent a second time (every
// stride-th), so that a clean pass counts n-again.
func repeatedLive(first int64, n, again, stride int) []kafka.Message {
	msgs := make([]kafka.Message, 0, n)
	for i := range n {
		opp, outcome := i, "passed"
		if i >= n-again {
			opp = (i - (n - again)) * stride
		}
		if opp%4 == 0 {
			outcome = "confirmed_repeat"
		}
		m := liveMessage(first+int64(i), fmt.Sprintf("o%d", opp), outcome)
		msgs = append(msgs, kafka.Message{Value: m.Value})
	}
	return msgs
}

// createTopic creates topic name with the given partitions on the test brokers.
func createTopic(ctx context.Context, t *testing.T, brokers []string, name string, partitions int) {
	t.Helper()
	kc := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	if _, err := kc.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: name, NumPartitions: partitions, ReplicationFactor: 1}}}); err != nil {
		t.Fatal(err)
	}
}

// writeAll writes msgs with w, trying again while a new topic has no leader yet.
func writeAll(ctx context.Context, t *testing.T, w *kafka.Writer, msgs []kafka.Message) {
	t.Helper()
	var err error
	for range 50 {
		if err = w.WriteMessages(ctx, msgs...); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal(err)
}
