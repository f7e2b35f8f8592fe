package alert

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/sink"
)

// TestSubscriberCaughtUp: on real Kafka, the subscriber sends CaughtUp once, after every snapshot
// published before it started (over two partitions and a topic that does not exist yet).
func TestSubscriberCaughtUp(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topic := testenv.Name(t, "alert-sub")
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := conn.Controller()
	conn.Close()
	if err != nil {
		t.Fatal(err)
	}
	cc, err := kafka.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		t.Fatal(err)
	}
	err = cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: 2, ReplicationFactor: 1})
	cc.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := kafka.Dial("tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port))); err == nil {
			c.DeleteTopics(topic, topic+".absent")
			c.Close()
		}
	})
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll}
	const n = 6
	var msgs []kafka.Message
	for i := range n {
		s := snap("live", 1, [2]int64{1, 10}, [2]int64{1, 10}, t0)
		s.Aggregate.CorrectionID = "fix-" + strconv.Itoa(i)
		o := sink.SnapshotOut(s)
		m, err := sink.Record(&o, t0)
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, m)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		// A new topic may take a moment to have leaders.
		if err = w.WriteMessages(ctx, msgs...); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	d := &kafka.Dialer{Timeout: 5 * time.Second}
	sub := &Subscriber{Brokers: brokers, Dialer: d, Log: zap.NewNop(), Topics: []string{topic, topic + ".absent"},
		Partitions: func(ctx context.Context, topic string) ([]int, error) {
			ps, err := d.LookupPartitions(ctx, "tcp", brokers[0], topic)
			if err == nil && len(ps) == 0 {
				err = kafka.UnknownTopicOrPartition
			}
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
			switch {
			case u.CaughtUp:
				caught = true
			case u.Snapshot != nil:
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
	if seen != n {
		t.Errorf("CaughtUp after %d snapshots, want all %d", seen, n)
	}
}
