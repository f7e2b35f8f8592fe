package consumer

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestKafkaDeadLetterLog (integration, real Kafka): the log finds the first letter of a time,
// reads headers in offset order, and the sender on it writes each input message's letter once.
func TestKafkaDeadLetterLog(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic := testenv.Name(t, "dlq")
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: -1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.DeleteTopics(context.Background(), &kafka.DeleteTopicsRequest{Topics: []string{topic}}) })
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()

	// 50 letters two days old, then 20 of now, each with a 100 KB value the index never keeps.
	now := time.Now()
	var msgs []kafka.Message
	for i, dl := range letters(0, 70, now) {
		m := dl.Record()
		m.Value = []byte(strings.Repeat("v", 100<<10))
		m.Time = now
		if i < 50 {
			m.Time = now.Add(-48 * time.Hour)
		}
		msgs = append(msgs, m)
	}
	for i := 0; i < len(msgs); i += 5 {
		if err := w.WriteMessages(ctx, msgs[i:i+5]...); err != nil {
			t.Fatal(err)
		}
	}

	log := &KafkaDeadLetterLog{Client: client, Topic: topic}
	offs, err := log.Offsets(ctx, now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if o := offs[0]; len(offs) != 1 || o.First != 0 || o.End != 70 || o.Since != 50 {
		t.Fatalf("offsets %+v, want first 0, end 70, since 50", offs)
	}
	if all, err := log.Offsets(ctx, time.Time{}); err != nil || all[0].Since != 0 {
		t.Fatalf("offsets of all time %+v, %v", all, err)
	}
	var got []int64
	err = log.Read(ctx, 0, 45, 70, func(off int64, h []kafka.Header) {
		if o, ok := originOf(h); !ok || o.offset != off {
			t.Errorf("record %d has origin %+v", off, o)
		}
		got = append(got, off)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 25 || got[0] != 45 || got[24] != 69 {
		t.Fatalf("read offsets %v, want 45..69", got)
	}

	// A redelivered batch of recent messages, some with letters and some without.
	d := NewDeadLetters(w, log)
	if err := d.Send(ctx, letters(60, 75, now)); err != nil {
		t.Fatal(err)
	}
	offs, err = log.Offsets(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if offs[0].End != 75 {
		t.Fatalf("topic ends at %d after the redelivery, want 75: letters 60..69 written twice", offs[0].End)
	}
}

// TestIndexSpans: the ranges read merge when they overlap or touch, and gaps are what is left.
func TestIndexSpans(t *testing.T) {
	tests := []struct {
		name     string
		cover    []span
		from, to int64
		read     []span
		gaps     []span
	}{
		// Nothing read: the whole range is a gap.
		{"empty", nil, 5, 10, nil, []span{{5, 10}}},
		// Adjacent ranges merge; a range inside another changes nothing.
		{"merge", []span{{0, 5}, {5, 8}, {2, 3}}, 0, 10, []span{{0, 8}}, []span{{8, 10}}},
		// Apart ranges stay apart; the gaps lie between and around them.
		{"apart", []span{{20, 30}, {0, 5}}, 2, 40, []span{{0, 5}, {20, 30}}, []span{{5, 20}, {30, 40}}},
		// A range bridging two merges all three.
		{"bridge", []span{{0, 5}, {10, 15}, {4, 11}}, 0, 15, []span{{0, 15}}, nil},
		// Nothing to read in an empty request.
		{"empty request", []span{{0, 5}}, 7, 7, []span{{0, 5}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := newDLQIndex(nil, 10)
			for _, s := range tc.cover {
				x.cover(0, s.lo, s.hi)
			}
			if got := x.read[0]; !slices.Equal(got, tc.read) {
				t.Errorf("read %v, want %v", got, tc.read)
			}
			if got := x.gaps(0, tc.from, tc.to); !slices.Equal(got, tc.gaps) {
				t.Errorf("gaps %v, want %v", got, tc.gaps)
			}
		})
	}
}
