package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/listoffsets"
	"github.com/segmentio/kafka-go/protocol/metadata"
)

// A partition whose leader is moving (a dead-letter topic just made, a broker restarting) answers
// with a temporary error for a moment: the dead-letter log asks again (RetryTemporary) rather than
// failing the batch or the rebuild that reads it, and gives up on anything else at once.
func TestTemporaryKafkaErrorsAreAskedAgain(t *testing.T) {
	ctx := context.Background()
	// calls returns a do that fails with errs in turn, then returns 42, and counts its calls.
	calls := func(errs ...error) (func() (int, error), *int) {
		n := 0
		return func() (int, error) {
			n++
			if n <= len(errs) {
				return 0, errs[n-1]
			}
			return 42, nil
		}, &n
	}

	t.Run("temporary errors, then an answer", func(t *testing.T) {
		do, n := calls(kafka.NotLeaderForPartition, kafka.LeaderNotAvailable, kafka.NotLeaderForPartition)
		v, err := RetryTemporary(ctx, 20, time.Millisecond, do)
		if err != nil || v != 42 || *n != 4 {
			t.Fatalf("got %d, %v after %d calls; want 42 after 4", v, err, *n)
		}
	})
	t.Run("an error that is not temporary, at once", func(t *testing.T) {
		for _, e := range []error{kafka.TopicAuthorizationFailed, io.ErrUnexpectedEOF} {
			do, n := calls(e, kafka.NotLeaderForPartition)
			if _, err := RetryTemporary(ctx, 20, time.Millisecond, do); !errors.Is(err, e) || *n != 1 {
				t.Fatalf("%v: got %v after %d calls; want it after 1", e, err, *n)
			}
		}
	})
	t.Run("a leader that does not come, after the tries", func(t *testing.T) {
		errs := make([]error, 50)
		for i := range errs {
			errs[i] = kafka.NotLeaderForPartition
		}
		do, n := calls(errs...)
		if _, err := RetryTemporary(ctx, 20, time.Millisecond, do); !errors.Is(err, kafka.NotLeaderForPartition) || *n != 20 {
			t.Fatalf("got %v after %d calls; want Not Leader For Partition after 20", err, *n)
		}
	})
	t.Run("a context that ends, without waiting the tries out", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		do, n := calls(kafka.NotLeaderForPartition, kafka.NotLeaderForPartition)
		start := time.Now()
		_, err := RetryTemporary(ctx, 20, 5*time.Second, do)
		if !errors.Is(err, kafka.NotLeaderForPartition) || *n != 1 || time.Since(start) >= 5*time.Second {
			t.Fatalf("got %v after %d calls in %v; want the error after 1, without waiting", err, *n, time.Since(start))
		}
	})
}

// movingLeader is a Kafka transport for one dead-letter topic of one partition that answers its
// first metadataMoves metadata requests with Leader Not Available for the partition and its first
// offsetMoves offset requests with Not Leader For Partition (or code instead, when set), then
// offsets 0 and 7.
type movingLeader struct {
	metadataMoves, offsetMoves int
	code                       int16
	metadataCalls, offsetCalls int
}

func (m *movingLeader) RoundTrip(_ context.Context, _ net.Addr, req protocol.Message) (protocol.Message, error) {
	switch r := req.(type) {
	case *metadata.Request:
		m.metadataCalls++
		var code int16
		if m.metadataCalls <= m.metadataMoves {
			code = int16(kafka.LeaderNotAvailable)
		}
		return &metadata.Response{
			Brokers: []metadata.ResponseBroker{{NodeID: 1, Host: "127.0.0.1", Port: 9}},
			Topics: []metadata.ResponseTopic{{Name: r.TopicNames[0],
				Partitions: []metadata.ResponsePartition{{ErrorCode: code, LeaderID: 1, ReplicaNodes: []int32{1}, IsrNodes: []int32{1}}}}},
		}, nil
	case *listoffsets.Request:
		m.offsetCalls++
		var code int16
		if m.offsetCalls <= m.offsetMoves {
			code = cmp.Or(m.code, int16(kafka.NotLeaderForPartition))
		}
		var ps []listoffsets.ResponsePartition
		for _, p := range r.Topics[0].Partitions {
			off := int64(0)
			if p.Timestamp == kafka.LastOffset {
				off = 7
			}
			ps = append(ps, listoffsets.ResponsePartition{Partition: p.Partition, ErrorCode: code, Timestamp: p.Timestamp, Offset: off})
		}
		return &listoffsets.Response{Topics: []listoffsets.ResponseTopic{{Topic: r.Topics[0].Topic, Partitions: ps}}}, nil
	}
	return nil, fmt.Errorf("unexpected request %T", req)
}

// The dead-letter log's offsets wait out a leader that is being elected (the metadata's partition
// error) and a broker that is no longer the leader (the offsets' partition error), and give up at
// once on an error that is not temporary.
func TestDeadLetterOffsetsWaitOutAMovingLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t.Run("moving, then there", func(t *testing.T) {
		m := &movingLeader{metadataMoves: 1, offsetMoves: 1}
		l := &KafkaDeadLetterLog{Client: &kafka.Client{Addr: kafka.TCP("127.0.0.1:9"), Transport: m}, Topic: "dead"}
		offs, err := l.Offsets(ctx, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if want := (LogOffsets{First: 0, End: 7, Since: 0}); len(offs) != 1 || offs[0] != want {
			t.Fatalf("offsets %v, want partition 0 at %+v", offs, want)
		}
		if m.metadataCalls != 3 || m.offsetCalls != 2 {
			t.Fatalf("%d metadata and %d offset requests, want 3 and 2", m.metadataCalls, m.offsetCalls)
		}
	})
	t.Run("refused for good", func(t *testing.T) {
		m := &movingLeader{offsetMoves: 100, code: int16(kafka.TopicAuthorizationFailed)}
		l := &KafkaDeadLetterLog{Client: &kafka.Client{Addr: kafka.TCP("127.0.0.1:9"), Transport: m}, Topic: "dead"}
		if _, err := l.Offsets(ctx, time.Time{}); !errors.Is(err, kafka.TopicAuthorizationFailed) || m.offsetCalls != 1 {
			t.Fatalf("got %v after %d offset requests, want Topic Authorization Failed after 1", err, m.offsetCalls)
		}
	})
}
