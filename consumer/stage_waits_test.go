package consumer

import (
	"context"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
)

// The stage histograms say where a batch's time went, waits included: here both messages were
// produced 3 s before they arrive (input), batch 1 is prepared at once but waits 2 s while Redis
// holds batch 0 (queued_apply), then waits 1 s while batch 0's publish runs (queued_publish).
// Fake time (synctest) makes the sums exact to the scheduling of the bubble.
func TestStagesTimeWhereABatchWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		applyGate := make(chan struct{})
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour), gates: map[string]chan struct{}{"a": applyGate}}
		pub := &gatePublisher{tr: tr, hold: map[int64]func(context.Context) error{
			1: func(context.Context) error { time.Sleep(time.Second); return nil },
		}}
		r := newPipelineRig(t, 3, store, pub)
		ctx, cancel := context.WithCancel(t.Context())
		msgs := []kafka.Message{liveMessage(0, "a", "passed"), liveMessage(1, "b", "confirmed_repeat")}
		for i := range msgs {
			msgs[i].Time = time.Now().Add(-3 * time.Second)
		}
		done := r.run(ctx, msgs)
		<-tr.seen("apply a")
		time.Sleep(2 * time.Second)
		close(applyGate)
		if !within(tr.seen("commit 2"), time.Hour) {
			t.Fatalf("batch 1 not committed: %s (fatal %v)", tr, r.fatal)
		}
		cancel()
		<-done

		got := stageTimes(t, r.group)
		for stage, want := range map[string]float64{"input": 6, "collect": 0, "queued_apply": 2, "queued_publish": 1} {
			if o := got[stage]; o.count != 2 || math.Abs(o.sum-want) > 0.01 {
				t.Errorf("stage %s: %d batches, %.3f s in all; want 2 batches, %.0f s", stage, o.count, o.sum, want)
			}
		}
	})
}

// slowFirstDecode is a handler whose decoding of the batch starting at offset 0 takes a second.
type slowFirstDecode struct{ Handler }

func (h slowFirstDecode) Prepare(msgs []kafka.Message) (*Batch, error) {
	if msgs[0].Offset == 0 {
		time.Sleep(time.Second)
	}
	return h.Handler.Prepare(msgs)
}

// The next batch is collected while one is decoded: a message that arrives while batch 0 takes a
// second to decode starts batch 1 at once (its input stage reads 0), not when the decoding ends.
func TestNextBatchIsCollectedWhileOneIsDecoded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		r := newPipelineRig(t, 3, store, &gatePublisher{tr: tr})
		r.group.handler = slowFirstDecode{r.group.handler}
		ctx, cancel := context.WithCancel(t.Context())
		in := make(chan kafka.Message, 2)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(ctx, ctx, 1, r.commit, in)
		}()
		first := liveMessage(0, "a", "passed")
		first.Time = time.Now()
		in <- first
		time.Sleep(100 * time.Millisecond)
		second := liveMessage(1, "b", "passed")
		second.Time = time.Now()
		in <- second
		if !within(tr.seen("commit 2"), time.Hour) {
			t.Fatalf("batch 1 not committed: %s (fatal %v)", tr, r.fatal)
		}
		cancel()
		<-done
		if o := stageTimes(t, r.group)["input"]; o.count != 2 || o.sum > 0.01 {
			t.Errorf("input stage: %d batches, %.3f s in all; want 2 batches taken as they came", o.count, o.sum)
		}
	})
}

// observed is one stage's histogram: batches timed and seconds in all.
type observed struct {
	count uint64
	sum   float64
}

// stageTimes returns what g's stage histogram holds, by stage.
func stageTimes(t *testing.T, g *Group) map[string]observed {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(g.metrics.StageSeconds)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]observed{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = observed{m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()}
		}
	}
	return got
}
