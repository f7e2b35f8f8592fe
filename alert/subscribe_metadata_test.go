package alert

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/sink"
)

// TestSubscriberOutlivesUnreachableLeader: a partition whose leader cannot be reached (a broker
// restarting, a topic just created and still electing) is retried until it answers or the
// subscriber stops; it is not an error, which inside run would stop the whole processor.
func TestSubscriberOutlivesUnreachableLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sub := &Subscriber{Brokers: []string{"127.0.0.1:1"}, Dialer: &kafka.Dialer{Timeout: 500 * time.Millisecond}, Log: zap.NewNop(),
		Topics:     []string{"repeatrate.snapshots"},
		Partitions: func(context.Context, string) ([]int, error) { return []int{0}, nil }}
	out := make(chan Update, 16)
	start := time.Now()
	err := sub.Run(ctx, out)
	if err != nil {
		t.Fatalf("Run returned %v after %s, want nil once its context ends", err, time.Since(start).Round(time.Millisecond))
	}
	if ctx.Err() == nil {
		t.Fatal("Run returned before its context ended")
	}
	select {
	case u := <-out:
		if u.CaughtUp {
			t.Error("caught up without reading the partition")
		}
	default:
	}
}

// TestSubscriberTransientMetadataError: on real Kafka, a metadata request that fails for a reason
// other than an unknown topic (a broker briefly unreachable at start) is retried; the topic is not
// taken for missing, so CaughtUp comes after its snapshots, not before (an evaluator caught up on
// an empty table would resolve every firing alert, then fire them again).
func TestSubscriberTransientMetadataError(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := testenv.Name(t, "alert-sub-meta")
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := conn.Controller()
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	ctrlAddr := net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port))
	cc, err := kafka.DialContext(ctx, "tcp", ctrlAddr)
	if err != nil {
		t.Fatal(err)
	}
	err = cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1})
	cc.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := kafka.Dial("tcp", ctrlAddr); err == nil {
			c.DeleteTopics(topic)
			c.Close()
		}
	})
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll}
	o := sink.SnapshotOut(snap("live", 1, [2]int64{1, 10}, [2]int64{1, 10}, t0))
	m, err := sink.Record(&o, t0)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err = w.WriteMessages(ctx, m); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	d := &kafka.Dialer{Timeout: 5 * time.Second}
	var calls atomic.Int64
	sub := &Subscriber{Brokers: brokers, Dialer: d, Log: zap.NewNop(), Topics: []string{topic},
		Partitions: func(ctx context.Context, topic string) ([]int, error) {
			if calls.Add(1) == 1 {
				return nil, errors.New("metadata: dial tcp: connect: connection refused")
			}
			ps, err := d.LookupPartitions(ctx, "tcp", brokers[0], topic)
			var out []int
			for _, p := range ps {
				out = append(out, p.ID)
			}
			return out, err
		}}
	out := make(chan Update, 1)
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sub.Run(sctx, out) }()
	seen := 0
	for caught := false; !caught; {
		select {
		case u := <-out:
			caught = u.CaughtUp
			if u.Snapshot != nil {
				seen++
			}
		case <-ctx.Done():
			t.Fatalf("no CaughtUp after %d snapshots", seen)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if seen != 1 {
		t.Errorf("CaughtUp after %d snapshots, want the 1 published before the start", seen)
	}
}
