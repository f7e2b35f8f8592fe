package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/sink"
)

// TestWriterBatchesFitDefaultTopic: without a limit read from the broker, a writer's batches are
// sized for Kafka's default max.message.bytes. They were 16 MiB: a batch of many snapshots to one
// partition was refused as a whole, and its publish retried forever.
func TestWriterBatchesFitDefaultTopic(t *testing.T) {
	kc, err := newKafkaClients(KafkaConfig{Brokers: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kc.writer("any").BatchBytes, int64(sink.DefaultTopicLimit-sink.BatchOverhead); got != want {
		t.Fatalf("BatchBytes = %d, want %d", got, want)
	}
}

// TestOutputTopicLimits (integration, real Kafka): the start-up check reads the output topics'
// max.message.bytes, sizes the writers' batches by it, and refuses a topic that accepts less than
// the largest output.
func TestOutputTopicLimits(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := testenv.Name(t, "limits")
	small, deflt, big := name+".small", name+".default", name+".big"
	topic := func(n string, limit int) kafka.TopicConfig {
		tc := kafka.TopicConfig{Topic: n, NumPartitions: 1, ReplicationFactor: -1}
		if limit > 0 {
			tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(limit)}}
		}
		return tc
	}
	kc, err := newKafkaClients(KafkaConfig{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := kc.client().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{
		topic(small, 500_000), topic(deflt, 0), topic(big, 5_000_000)}})
	if err != nil {
		t.Fatal(err)
	}
	for n, err := range resp.Errors {
		if err != nil {
			t.Fatalf("create %s: %v", n, err)
		}
	}
	t.Cleanup(func() {
		kc.client().DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{small, deflt, big}})
	})
	log := zaptest.NewLogger(t)

	err = kc.checkOutputLimits(ctx, []string{deflt, small}, log)
	if err == nil || !strings.Contains(err.Error(), small) || !strings.Contains(err.Error(), "500000") {
		t.Fatalf("a topic accepting 500000 bytes: err = %v, want a refusal naming it", err)
	}
	if err := kc.checkOutputLimits(ctx, []string{deflt, big}, log); err != nil {
		t.Fatal(err)
	}
	if got := kc.writer(deflt).BatchBytes; got != int64(sink.DefaultTopicLimit-sink.BatchOverhead) {
		t.Errorf("default topic: BatchBytes %d", got)
	}
	if got := kc.writer(big).BatchBytes; got != 5_000_000-sink.BatchOverhead {
		t.Errorf("5 MB topic: BatchBytes %d", got)
	}
}
