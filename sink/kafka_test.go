package sink_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// TestLargestOutputsAcceptedByKafka (integration, real Kafka): on a topic with the
// broker's default max.message.bytes, the largest outputs valid input can cause are accepted —
// alone, and many at once through a writer whose batches are sized by sink.WriterBatchBytes.
func TestLargestOutputsAcceptedByKafka(t *testing.T) {
	addr := testenv.KafkaBrokers(t)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 10 * time.Second}
	topic := testenv.Name(t, "limits")
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatal(err)
	}
	defer client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	limit := sink.DefaultTopicLimit
	if dc, err := client.DescribeConfigs(ctx, &kafka.DescribeConfigsRequest{Resources: []kafka.DescribeConfigRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: topic, ConfigNames: []string{"max.message.bytes"}}}}); err == nil {
		for _, e := range dc.Resources[0].ConfigEntries {
			limit, _ = strconv.Atoi(e.ConfigValue)
		}
	}
	if limit != sink.DefaultTopicLimit {
		t.Logf("the broker's default max.message.bytes is %d, not Kafka's %d", limit, sink.DefaultTopicLimit)
	}

	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	m := binaryEvent(t, schemas.TypeEvalResult, evalData(fill("\x01", schemas.MaxIdentityBytes), schemas.MaxRuns))
	ev, err := dec.Decode(&m, limitsNow)
	if err != nil {
		t.Fatal(err)
	}
	outs := worstOutputs(t, ev)
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, RequiredAcks: kafka.RequireAll, BatchSize: 5000,
		BatchBytes: sink.WriterBatchBytes(limit), BatchTimeout: 2 * time.Millisecond, WriteTimeout: 20 * time.Second,
		AllowAutoTopicCreation: false}
	defer w.Close()
	pub := sink.NewKafka(w, w, w)
	snap := outs["snapshot"].Data.(*schemas.Snapshot)
	// Alone, then 40 at once (about 1.5 MB: more than one batch).
	for _, n := range []int{1, 40} {
		snaps := make([]schemas.Snapshot, n)
		for i := range snaps {
			snaps[i] = *snap
		}
		if err := pub.Publish(ctx, snaps); err != nil {
			t.Fatalf("%d largest snapshots: %v", n, err)
		}
	}
	// Suite snapshots (two stability snapshots of about 590 KB each) and alerts, in one call.
	var so suite.Output
	so.Discrimination = append(so.Discrimination, *outs["discrimination"].Data.(*schemas.SuiteDiscrimination))
	so.Stability = append(so.Stability, *outs["stability"].Data.(*schemas.SuiteStability), *outs["stability"].Data.(*schemas.SuiteStability))
	so.Revived = append(so.Revived, *outs["case revived"].Data.(*schemas.CaseRevived))
	so.Abnormal = append(so.Abnormal, *outs["abnormal sample"].Data.(*schemas.AbnormalSample))
	if err := pub.PublishSuites(ctx, so, worstTime); err != nil {
		t.Fatalf("largest suite outputs: %v", err)
	}
}
