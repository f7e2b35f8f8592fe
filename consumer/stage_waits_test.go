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

		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(r.group.metrics.StageSeconds)
		families, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		type observed struct {
			count uint64
			sum   float64
		}
		got := map[string]observed{}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = observed{m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()}
			}
		}
		for stage, want := range map[string]float64{"input": 6, "collect": 0, "queued_apply": 2, "queued_publish": 1} {
			if o := got[stage]; o.count != 2 || math.Abs(o.sum-want) > 0.01 {
				t.Errorf("stage %s: %d batches, %.3f s in all; want 2 batches, %.0f s", stage, o.count, o.sum, want)
			}
		}
	})
}
