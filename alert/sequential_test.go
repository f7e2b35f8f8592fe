package alert

import (
	"context"
	"sync"
	"testing"
	"time"
)

const sequentialRules = "rules:\n- {name: back, kind: change, method: sequential, min_scored: 20}\n"

// Two evaluators that read the snapshots at different moments share each subject's detector in
// Redis: every scored outcome a snapshot adds is judged once, whichever evaluator steps it and
// however often either looks; the lagging one decides on the shared detector, so one unbroken
// alarm makes one firing; and the alert resolves once the snapshot the detector consumed has
// left the recent window (an aggregate gone quiet).
func TestSequentialDetectorIsSharedByEvaluators(t *testing.T) {
	store, am, clk := newAlertTest(t)
	ctx := context.Background()
	a := newTestEvaluator(t, store, sequentialRules, []Sink{am}, clk)
	b := newTestEvaluator(t, store, sequentialRules, []Sink{am}, clk)
	// Six days at 2 % before the hour; then each minute 10 scored outcomes, 5 of them repeats.
	day, week := [2]int64{0, 0}, [2]int64{20, 1000}
	a.Apply(Update{Snapshot: snap("live", 1, day, week, t0)})
	b.Apply(Update{Snapshot: snap("live", 1, day, week, t0)})
	evaluateAndDeliver(t, a, clk, am, t0) // the detector's reference: the counts before any it judges
	const n = 30
	for v := int64(2); v <= n+1; v++ {
		day[0], day[1], week[0], week[1] = day[0]+5, day[1]+10, week[0]+5, week[1]+10
		at := t0.Add(time.Duration(v-1) * time.Minute)
		a.Apply(Update{Snapshot: snap("live", v, day, week, at)})
		if v%3 == 0 {
			b.Apply(Update{Snapshot: snap("live", v, day, week, at)}) // B reads every third
		}
		// Both look at once: compare-and-set decides who steps the detector.
		clk.set(at.Add(time.Second))
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, e := range []*Evaluator{a, b} {
			wg.Go(func() { errs[i] = e.Evaluate(ctx, at.Add(time.Second)) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Deliver(ctx, am); err != nil {
			t.Fatal(err)
		}
	}
	subject := aggregateSubject(&snap("live", 1, day, week, t0).Aggregate).Key
	vals, err := store.LoadDetectors(ctx, []string{store.detectorKey("back", subject)})
	if err != nil {
		t.Fatal(err)
	}
	d := decodeDetector(vals[0])
	if d.Judged != 10*n || d.Version != n+1 || !d.Alarm {
		t.Fatalf("detector %+v: want %d outcomes judged once each, version %d, alarm", d, 10*n, n+1)
	}
	if got := firingResolved(am.kinds()); len(got) != 1 || got[0] != "firing" {
		t.Fatalf("notifications %v: want one firing", got)
	}
	ev := am.sent[0].Alert.Evidence
	if ev.Test == nil || ev.Test.Method != DetectorMethod || ev.Test.Detector == nil ||
		ev.Test.Detector.Statistic < ev.Test.Detector.Threshold || ev.Test.Detector.BaselineHigh <= 0.02 {
		t.Fatalf("firing evidence %+v: want the detector's statistic over its threshold against a baseline bound above 2 %%", ev.Test)
	}
	// Quiet for a day: the snapshot the detector consumed has left the 24h window.
	quiet := t0.Add(25 * time.Hour)
	evaluateAndDeliver(t, b, clk, am, quiet)
	evaluateAndDeliver(t, a, clk, am, quiet.Add(time.Second))
	if got := firingResolved(am.kinds()); len(got) != 2 || got[1] != "resolved" {
		t.Fatalf("notifications %v a day after the last snapshot: want [firing resolved]", got)
	}
	for i := range am.sent {
		validateEvent(t, &am.sent[i])
	}
}
