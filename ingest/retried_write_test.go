package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
)

// isrShrinkBroker is a broker under min.insync.replicas: the first produce is appended to the
// leader's log, but the in-sync replicas shrank meanwhile (NOT_ENOUGH_REPLICAS_AFTER_APPEND);
// every later one is refused before the append (NOT_ENOUGH_REPLICAS).
type isrShrinkBroker struct {
	mu       sync.Mutex
	produces int
	appended int // records in the leader's log
}

func (b *isrShrinkBroker) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	switch r := req.(type) {
	case *metadataAPI.Request:
		res := &metadataAPI.Response{Brokers: []metadataAPI.ResponseBroker{{NodeID: 1, Host: "127.0.0.1", Port: 9}}}
		for _, tp := range r.TopicNames {
			res.Topics = append(res.Topics, metadataAPI.ResponseTopic{Name: tp,
				Partitions: []metadataAPI.ResponsePartition{{PartitionIndex: 0, LeaderID: 1, ReplicaNodes: []int32{1}, IsrNodes: []int32{1}}}})
		}
		return res, nil
	case *produceAPI.Request:
		b.mu.Lock()
		defer b.mu.Unlock()
		b.produces++
		code := int16(kafka.NotEnoughReplicas)
		if b.produces == 1 {
			for _, tp := range r.Topics {
				for _, p := range tp.Partitions {
					for {
						rec, err := p.RecordSet.Records.ReadRecord()
						if err != nil || rec == nil {
							break
						}
						b.appended++
					}
				}
			}
			code = int16(kafka.NotEnoughReplicasAfterAppend)
		}
		tp := r.Topics[0]
		return &produceAPI.Response{Topics: []produceAPI.ResponseTopic{{Topic: tp.Topic,
			Partitions: []produceAPI.ResponsePartition{{Partition: tp.Partitions[0].Partition, ErrorCode: code, BaseOffset: -1}}}}}, nil
	}
	return nil, fmt.Errorf("unexpected %T", req)
}

// An event is answered "failed" only when Kafka certainly did not write it. A kafka-go writer
// that retries reports its last attempt's error: here a refusal, after a first attempt that
// appended the record. Such a writer's errors are "unknown"; with one attempt per write
// (SingleAttempt, as `run` configures its writer) the append-then-timeout is "unknown" too.
func TestRetriedWriteNeverAnswersFailed(t *testing.T) {
	for _, c := range []struct {
		name     string
		attempts int
		single   bool
	}{
		{"writer retries", 10, false},
		{"one attempt", 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &isrShrinkBroker{}
			w := &kafka.Writer{Addr: kafka.TCP("127.0.0.1:9"), Transport: b, RequiredAcks: kafka.RequireAll, MaxAttempts: c.attempts,
				BatchTimeout: time.Millisecond, WriteBackoffMin: time.Millisecond, WriteBackoffMax: 2 * time.Millisecond}
			defer w.Close()
			h := newHandler(t, w, Config{WriteTimeout: 5 * time.Second, SingleAttempt: c.single})
			rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: mustJSON([]any{live("e1", "acme")})})
			var ans Answer
			json.Unmarshal(rec.Body.Bytes(), &ans)
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.appended != 1 {
				t.Fatalf("the broker appended %d records, want the first attempt's 1", b.appended)
			}
			if rec.Code != 503 || len(ans.Events) != 1 || ans.Events[0].Status != StatusUnknown {
				t.Fatalf("%d %s after %d attempts, the first of which appended: want 503 unknown", rec.Code, rec.Body, b.produces)
			}
		})
	}
}
