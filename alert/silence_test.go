package alert

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// TestSilenceSurvivesRestart: not_measured_for times the silence from the last snapshot whose
// all-time scored count changed. After a restart the compacted topic may hold only the latest
// snapshot, and unscored events keep snapshots coming: timed from that snapshot, the silence
// restarted, so a firing alert resolved and fired again an hour later. The record in Redis now
// keeps when the silence began with the scored count then, and a restarted evaluator resumes
// from it while the count is unchanged; a scored opportunity still resolves the alert.
func TestSilenceSurvivesRestart(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	kafka := &recordingSink{name: "kafka"}
	clk := &clock{t: t0}
	store, _ := NewRedis(rdb, prefix, []string{"kafka"})
	const rules = "rules:\n- {name: silent, kind: not_measured_for, duration: 1h}\n"
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	scored := func(version, n int64, obs time.Time) Update {
		s := snap("live", version, [2]int64{1, n}, [2]int64{1, n}, obs)
		return Update{Snapshot: s}
	}
	step := func(e *Evaluator, now time.Time) {
		t.Helper()
		clk.set(now)
		if err := e.Evaluate(ctx, now); err != nil {
			t.Fatal(err)
		}
		if err := e.Deliver(ctx, kafka); err != nil {
			t.Fatal(err)
		}
	}

	first := newTestEvaluator(t, store, rules, []Sink{kafka}, clk)
	first.Apply(scored(1, 100, at(0)))
	first.Apply(scored(2, 110, at(10*time.Minute))) // last scored opportunity
	step(first, at(70*time.Minute))                 // silent for 1h: fires
	first.Apply(scored(3, 110, at(80*time.Minute))) // an unscored event
	step(first, at(85*time.Minute))
	if got := kafka.kinds(); !slices.Equal(got, []string{"firing"}) {
		t.Fatalf("before the restart: %v, want [firing]", got)
	}

	// Restart: only the latest snapshot is left in the compacted topic.
	second := newTestEvaluator(t, store, rules, []Sink{kafka}, clk)
	second.Apply(scored(3, 110, at(80*time.Minute)))
	step(second, at(90*time.Minute))
	step(second, at(150*time.Minute))
	if got := kafka.kinds(); !slices.Equal(got, []string{"firing"}) {
		t.Errorf("after the restart: %v, want [firing] (still silent since +10m)", got)
	}
	if ev := kafka.sent[0].Alert.Evidence; ev.LastScoredAt == nil || !ev.LastScoredAt.Equal(at(10*time.Minute)) {
		t.Errorf("firing evidence last_scored_at %v, want %v", ev.LastScoredAt, at(10*time.Minute))
	}
	// A scored opportunity ends the silence.
	second.Apply(scored(4, 111, at(160*time.Minute)))
	step(second, at(161*time.Minute))
	if got := kafka.kinds(); !slices.Equal(got, []string{"firing", "resolved"}) {
		t.Errorf("after a scored opportunity: %v, want [firing resolved]", got)
	}
}

// TestRestoreSilence: a recorded silence start replaces the table's only while the table has seen
// no change of the all-time scored count and the count is the recorded one, and only to move the
// start earlier.
func TestRestoreSilence(t *testing.T) {
	r := mustRule(t, "- {name: s, kind: not_measured_for, duration: 1h}\n")
	for _, tc := range []struct {
		name   string
		snaps  [][2]int64 // all-time scored, minutes after t0 of each snapshot
		scored int64      // recorded
		since  time.Duration
		want   time.Duration // silence start after t0
	}{
		{"restored", [][2]int64{{110, 80}, {110, 85}}, 110, 10 * time.Minute, 10 * time.Minute},
		{"never scored", [][2]int64{{0, 80}}, 0, 5 * time.Minute, 5 * time.Minute},
		{"scored since", [][2]int64{{111, 80}}, 110, 10 * time.Minute, 80 * time.Minute},
		{"change seen", [][2]int64{{110, 80}, {111, 85}}, 111, 10 * time.Minute, 85 * time.Minute},
		{"not earlier", [][2]int64{{110, 80}}, 110, 90 * time.Minute, 80 * time.Minute},
		{"none recorded", [][2]int64{{110, 80}}, 0, 0, 80 * time.Minute},
	} {
		tab := NewTable()
		for i, s := range tc.snaps {
			tab.PutSnapshot(snap("live", int64(i+1), [2]int64{1, s[0]}, [2]int64{1, s[0]}, t0.Add(time.Duration(s[1])*time.Minute)))
		}
		since := time.Time{}
		if tc.since > 0 {
			since = t0.Add(tc.since)
		}
		id := snap("live", 1, [2]int64{}, [2]int64{}, t0).Aggregate.ID()
		tab.RestoreSilence(id, tc.scored, since)
		now := t0.Add(3 * time.Hour)
		cs := Evaluate(r, tab, now)
		if len(cs) != 1 {
			t.Fatalf("%s: %d conditions", tc.name, len(cs))
		}
		if got := now.Add(-time.Duration(*cs[0].Evidence.Value * float64(time.Second))); !got.Equal(t0.Add(tc.want)) {
			t.Errorf("%s: silent since +%s, want +%s", tc.name, got.Sub(t0), tc.want)
		}
	}
}
