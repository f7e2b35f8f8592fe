package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

// A wall clock stepped back (a minute, an hour) or forward dead-letters no valid event, counts
// every valid one once, and leaves the snapshot versions rising: the receipt time events are
// judged against never runs back, and versions are max(last + 1, observation µs). Each batch carries an event that
// occurred at the true time (valid, counted) and one a day ahead of it (future_event under every
// step: the guard still holds). Without the receipt clock, the processor judged against its wall
// clock, and the events after the backward steps were dead-lettered for good.
func TestClockStepsDeadLetterNoValidEvent(t *testing.T) {
	start := now
	var trueTime time.Time // what has really passed since start
	var offset time.Duration
	wall := func() time.Time { return trueTime.Add(offset) }
	clock := newReceiptClock(wall, func() time.Duration { return trueTime.Sub(start) })

	store := &flakyStore{model: aggregator.NewModel(30 * 24 * time.Hour)}
	pub, dlq := &recordingPublisher{}, &recordingDLQ{}
	p, err := NewProcessor(ProcessorConfig{RetryMin: time.Millisecond, Receipt: clock.Now}, newTestDecoder(t), store,
		suite.NewMemory(suite.Config{}), pub, dlq, wall, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	event := func(id, opp string, at time.Time) []byte {
		ts := at.UTC().Format(time.RFC3339)
		return []byte(strings.NewReplacer(`"id":"e1"`, fmt.Sprintf("%q:%q", "id", id), `"opportunity_id":"o"`, fmt.Sprintf("%q:%q", "opportunity_id", opp),
			`"occurred_at":"2026-11-29T11:00:00Z"`, fmt.Sprintf("%q:%q", "occurred_at", ts),
			`"assessed_at":"2026-11-29T11:00:00Z"`, fmt.Sprintf("%q:%q", "assessed_at", ts)).Replace(structured))
	}
	steps := []time.Duration{0, -time.Minute, -time.Hour, -time.Hour - time.Minute, 0, time.Minute, time.Hour, -time.Hour}
	var prev time.Time
	var offset64 int64
	for i, step := range steps {
		trueTime = start.Add(time.Duration(i) * 10 * time.Second)
		offset = step
		msgs := []kafka.Message{
			{Topic: "in", Partition: 0, Offset: offset64, Value: event(fmt.Sprintf("v%d", i), fmt.Sprintf("o%d", i), trueTime)},
			{Topic: "in", Partition: 0, Offset: offset64 + 1, Value: event(fmt.Sprintf("f%d", i), fmt.Sprintf("f%d", i), trueTime.Add(24*time.Hour))},
		}
		offset64 += 2
		if err := p.Handle(context.Background(), msgs); err != nil {
			t.Fatal(err)
		}
		if got := clock.Now(); got.Before(prev) {
			t.Fatalf("step %d (%s): receipt time ran back from %s to %s", i, step, prev, got)
		} else {
			prev = got
		}
	}
	var ids []string
	for _, d := range dlq.dls {
		if d.Reason != schemas.ReasonFutureEvent {
			t.Errorf("dead letter %s: %s, want only future_event", d.Message.Value[:40], d.Reason)
		}
		ids = append(ids, string(d.Message.Value))
	}
	if len(dlq.dls) != len(steps) {
		t.Fatalf("%d dead letters, want the %d events a day ahead and no valid one", len(dlq.dls), len(steps))
	}
	for _, id := range ids {
		if !strings.Contains(id, `"id":"f`) {
			t.Errorf("a valid event was dead-lettered: %.120s", id)
		}
	}
	// The aggregate's versions rise with every batch, whichever way its observation time stepped.
	for i := 1; i < len(pub.snaps); i++ {
		if pub.snaps[i].Version <= pub.snaps[i-1].Version {
			t.Fatalf("snapshot %d has version %d after %d: versions must rise across clock steps", i, pub.snaps[i].Version, pub.snaps[i-1].Version)
		}
	}
	last := pub.snaps[len(pub.snaps)-1]
	if got := last.Windows.All.ConfirmedRepeats; got != int64(len(steps)) {
		t.Fatalf("all-time window counts %d confirmed repeats, want %d (one per step, each once)", got, len(steps))
	}
}

// The receipt clock follows the wall clock forward at once and never back; it keeps counting real
// time meanwhile, and so meets the wall clock again only when it is stepped forward.
func TestReceiptClockNeverRunsBack(t *testing.T) {
	var wallAt time.Time
	var mono time.Duration
	c := newReceiptClock(func() time.Time { return wallAt }, func() time.Duration { return mono })
	for _, s := range []struct {
		wall time.Time
		mono time.Duration
		want time.Time
	}{
		{now, 0, now},
		{now.Add(time.Second), time.Second, now.Add(time.Second)},
		{now.Add(-time.Hour), 2 * time.Second, now.Add(2 * time.Second)},               // stepped back an hour
		{now.Add(-time.Hour + time.Second), 3 * time.Second, now.Add(3 * time.Second)}, // still back
		{now.Add(time.Hour), 4 * time.Second, now.Add(time.Hour)},                      // stepped forward: followed
	} {
		wallAt, mono = s.wall, s.mono
		if got := c.Now(); !got.Equal(s.want) {
			t.Fatalf("wall %s, %s elapsed: receipt %s, want %s", s.wall, s.mono, got, s.want)
		}
	}
}
