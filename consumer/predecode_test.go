package consumer

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
)

// newClockedProcessor is a processor on the model stores whose clock the test sets.
func newClockedProcessor(t *testing.T, clock *time.Time) *Processor {
	t.Helper()
	cfg := ProcessorConfig{Suite: suite.Config{MinHistory: 1}}
	p, err := NewProcessor(cfg, newTestDecoder(t), aggregator.NewModel(30*24*time.Hour), suite.NewMemory(cfg.Suite),
		&gatePublisher{tr: &trace{}}, &recordingDLQ{}, func() time.Time { return *clock }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// mixedBatch is live attempts, eval results and bad messages on two partitions, each message's
// value its own array.
func mixedBatch(round int) []kafka.Message {
	var msgs []kafka.Message
	for i := range 40 {
		var m kafka.Message
		switch i % 5 {
		case 0, 1:
			m = liveMessage(int64(i), fmt.Sprint("o", round, "-", i), []string{"passed", "confirmed_repeat"}[i%2])
		case 2:
			m = evalMessage(fmt.Sprint("ev", round, "-", i), "v1", 1, []string{"pass", "fail"}[i%2], "x")
		case 3:
			m = kafka.Message{Topic: "in", Value: []byte(`{"specversion":"1.0"`)}
		default:
			m = liveMessage(int64(i), fmt.Sprint("o", round, "-", i), "nonsense")
		}
		m.Partition, m.Offset = i%2, int64(100*round+i)
		msgs = append(msgs, m)
	}
	return msgs
}

// summary is what Prepare made of a batch, in comparable form.
func summary(b *Batch) string {
	var reasons []string
	for _, d := range b.dls {
		reasons = append(reasons, fmt.Sprintf("%d/%d:%s", d.Message.Partition, d.Message.Offset, d.Reason))
	}
	return fmt.Sprintf("obs %+v\nruns %+v\ndead %v", b.obs, b.runs, reasons)
}

// A batch whose messages were predecoded as they were collected prepares to exactly what decoding
// them in Prepare gives: the same observations, runs and dead letters, in the same order.
// Entries a batch that was never prepared left behind are skipped, and none remain after Prepare.
func TestPredecodedBatchPreparesAsDecoded(t *testing.T) {
	clock := now
	fresh, pre := newClockedProcessor(t, &clock), newClockedProcessor(t, &clock)
	// The leftovers of a batch collected but never prepared (its generation ended).
	for _, m := range mixedBatch(9)[:17] {
		pre.Predecode(&m)
	}
	for round := range 3 {
		msgs := mixedBatch(round)
		for i := range msgs {
			pre.Predecode(&msgs[i])
		}
		a, err := fresh.Prepare(slices.Clone(msgs))
		if err != nil {
			t.Fatal(err)
		}
		b, err := pre.Prepare(msgs)
		if err != nil {
			t.Fatal(err)
		}
		if sa, sb := summary(a), summary(b); sa != sb {
			t.Fatalf("round %d: predecoded batch prepared to\n%s\nwant\n%s", round, sb, sa)
		}
		if len(a.obs) == 0 || len(a.runs) == 0 || len(a.dls) == 0 {
			t.Fatalf("round %d: %d observations, %d runs, %d dead letters: the batch checks too little", round, len(a.obs), len(a.runs), len(a.dls))
		}
		if !reflect.DeepEqual(a.enc, b.enc) || !reflect.DeepEqual(a.renc, b.renc) {
			t.Fatalf("round %d: the encoded batches differ", round)
		}
		if len(pre.pre) != 0 {
			t.Fatalf("round %d: %d predecoded entries left after Prepare", round, len(pre.pre))
		}
	}
}

// A predecoded result is used only for the very message it was made from: a message with the same
// topic, partition, offset and bytes but another value array (a redelivery) is decoded again, at
// Prepare's clock. The result of a message predecoded when it was collected stands, judged at the
// clock of its collection.
func TestPredecodedOnlyForTheSameMessage(t *testing.T) {
	early := now.Add(-2 * time.Hour) // the attempt occurred at 11:00: in the future at 10:00
	clock := early
	p := newClockedProcessor(t, &clock)

	m := liveMessage(7, "o", "passed")
	p.Predecode(&m)
	copied := m
	copied.Value = slices.Clone(m.Value)
	clock = now
	b, err := p.Prepare([]kafka.Message{copied})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.dls) != 0 || len(b.obs) != 1 {
		t.Fatalf("a redelivered copy used the entry of another message: %s", summary(b))
	}

	clock = early
	p.Predecode(&m)
	clock = now
	b, err = p.Prepare([]kafka.Message{m})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.dls) != 1 || len(b.obs) != 0 {
		t.Fatalf("the message predecoded at collection was decoded again at Prepare: %s", summary(b))
	}
}
