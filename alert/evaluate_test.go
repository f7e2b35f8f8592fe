package alert

import (
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func win(confirmed, scored int64) schemas.Window {
	w := schemas.Window{ConfirmedRepeats: confirmed, Passed: scored - confirmed, Scored: scored, Status: schemas.StatusNotMeasured}
	if scored > 0 {
		r := float64(confirmed) / float64(scored)
		w.Rate, w.Status = &r, schemas.StatusMeasured
	}
	return w
}

// snap builds a snapshot whose 24h window holds day and 7d window holds week (all = 7d).
func snap(source string, version int64, day, week [2]int64, at time.Time) *schemas.Snapshot {
	return &schemas.Snapshot{
		Aggregate:  schemas.Aggregate{Workspace: "acme", Model: "bot", Run: "r", Checkpoint: "c", Artifact: "prod", CorrectionID: "fix", Source: source},
		Windows:    schemas.Windows{All: win(week[0], week[1]), Hour: win(0, 0), Day: win(day[0], day[1]), Week: win(week[0], week[1])},
		ObservedAt: at, Version: version,
	}
}

func mustRule(t *testing.T, yaml string) *Rule {
	t.Helper()
	rs, err := Parse([]byte("rules:\n" + yaml))
	if err != nil {
		t.Fatal(err)
	}
	return &rs.Rules[0]
}

func TestEvaluate(t *testing.T) {
	fr := func(f float64) *float64 { return &f }
	tests := []struct {
		name   string
		rule   string
		fill   func(*Table)
		now    time.Time
		active []bool // per subject, in order
	}{
		{
			// 3/5 after 0/5: far above by rate, but below min_scored 20 and proving nothing.
			name: "tiny step does not fire",
			rule: "- {name: c, kind: change, min_scored: 20}",
			fill: func(tb *Table) { tb.PutSnapshot(snap("live", 1, [2]int64{3, 5}, [2]int64{3, 10}, t0)) },
			now:  t0, active: []bool{false},
		},
		{
			// 150/1000 in the last day after 120/6000 before: fires.
			name: "step fires",
			rule: "- {name: c, kind: change, min_increase: 0.05}",
			fill: func(tb *Table) { tb.PutSnapshot(snap("live", 1, [2]int64{150, 1000}, [2]int64{270, 7000}, t0)) },
			now:  t0, active: []bool{true},
		},
		{
			// A threshold only counts with min_scored scored; the evaluation source is not read.
			name: "threshold min_scored",
			rule: "- {name: t, kind: threshold, window: 24h, value: 0.1, min_scored: 20}",
			fill: func(tb *Table) {
				tb.PutSnapshot(snap("live", 1, [2]int64{3, 5}, [2]int64{3, 5}, t0))
				tb.PutSnapshot(snap("evaluation", 1, [2]int64{30, 50}, [2]int64{30, 50}, t0))
			},
			now: t0, active: []bool{false},
		},
		{
			// Below: fires when the rate is under the value.
			name: "threshold below",
			rule: "- {name: t, kind: threshold, source: evaluation, window: 24h, op: below, value: 0.9, min_scored: 20}",
			fill: func(tb *Table) { tb.PutSnapshot(snap("evaluation", 1, [2]int64{30, 50}, [2]int64{30, 50}, t0)) },
			now:  t0, active: []bool{true},
		},
		{
			// The badge reads evaluation while live has nothing scored: one subject per scope and correction.
			name: "badge falls back to evaluation",
			rule: "- {name: t, kind: threshold, source: badge, window: 24h, value: 0.5, min_scored: 20}",
			fill: func(tb *Table) {
				tb.PutSnapshot(snap("live", 1, [2]int64{0, 0}, [2]int64{0, 0}, t0))
				tb.PutSnapshot(snap("evaluation", 1, [2]int64{30, 50}, [2]int64{30, 50}, t0))
			},
			now: t0, active: []bool{true},
		},
		{
			// The badge reads live once live is measured.
			name: "badge reads live",
			rule: "- {name: t, kind: threshold, source: badge, window: 24h, value: 0.5, min_scored: 20}",
			fill: func(tb *Table) {
				tb.PutSnapshot(snap("live", 1, [2]int64{1, 50}, [2]int64{1, 50}, t0))
				tb.PutSnapshot(snap("evaluation", 1, [2]int64{30, 50}, [2]int64{30, 50}, t0))
			},
			now: t0, active: []bool{false},
		},
		{
			// Silent: the scored count last changed at t0+1h; 6h after that it fires, not before.
			name: "not measured for",
			rule: "- {name: s, kind: not_measured_for, duration: 6h}\n",
			fill: func(tb *Table) {
				tb.PutSnapshot(snap("live", 1, [2]int64{1, 10}, [2]int64{1, 10}, t0))
				tb.PutSnapshot(snap("live", 2, [2]int64{1, 11}, [2]int64{1, 11}, t0.Add(time.Hour)))
				tb.PutSnapshot(snap("live", 3, [2]int64{1, 11}, [2]int64{1, 11}, t0.Add(2*time.Hour))) // an unscored arrival
			},
			now: t0.Add(7 * time.Hour), active: []bool{true},
		},
		{
			// A fall of the scored count (an opportunity re-assessed as unscored, or expired) is
			// nothing scored: the silence that began at t0+1h goes on, and fires 6h after it.
			name: "not measured for, through a fall of the scored count",
			rule: "- {name: s, kind: not_measured_for, duration: 6h}\n",
			fill: func(tb *Table) {
				tb.PutSnapshot(snap("live", 1, [2]int64{1, 10}, [2]int64{1, 10}, t0))
				tb.PutSnapshot(snap("live", 2, [2]int64{1, 11}, [2]int64{1, 11}, t0.Add(time.Hour)))
				tb.PutSnapshot(snap("live", 3, [2]int64{1, 10}, [2]int64{1, 10}, t0.Add(6*time.Hour)))
			},
			now: t0.Add(7 * time.Hour), active: []bool{true},
		},
		{
			name: "not measured for, not yet",
			rule: "- {name: s, kind: not_measured_for, duration: 6h}\n",
			fill: func(tb *Table) {
				tb.PutSnapshot(snap("live", 2, [2]int64{1, 11}, [2]int64{1, 11}, t0.Add(time.Hour)))
			},
			now: t0.Add(6*time.Hour + 59*time.Minute), active: []bool{false},
		},
		{
			// Achievable range below 0.2; a suite with nothing judged (null range) is inactive.
			name: "achievable range",
			rule: "- {name: r, kind: achievable_range_below, value: 0.2}",
			fill: func(tb *Table) {
				tb.PutDiscrimination(&schemas.SuiteDiscrimination{Workspace: "a", Suite: "s1", AchievableRange: fr(0.1), ObservedAt: t0})
				tb.PutDiscrimination(&schemas.SuiteDiscrimination{Workspace: "a", Suite: "s2", ObservedAt: t0})
			},
			now: t0, active: []bool{true, false},
		},
		{
			// Missing runs above 0, abnormal share above 5 % of at least 20 replies.
			name: "missing runs",
			rule: "- {name: m, kind: missing_runs_above, value: 0, matchers: ['version=\"v2\"']}",
			fill: func(tb *Table) {
				tb.PutStability(&schemas.SuiteStability{Workspace: "a", Suite: "s", Version: "v1", MissingRunsTotal: 3, ObservedAt: t0})
				tb.PutStability(&schemas.SuiteStability{Workspace: "a", Suite: "s", Version: "v2", MissingRunsTotal: 1, ObservedAt: t0})
			},
			now: t0, active: []bool{true},
		},
		{
			name: "abnormal share",
			rule: "- {name: m, kind: abnormal_share_above, value: 0.05, min_scored: 20}",
			fill: func(tb *Table) {
				tb.PutStability(&schemas.SuiteStability{Workspace: "a", Suite: "s", Version: "v1", AbnormalSamples: 2, ReplyLength: schemas.ReplyLength{Count: 10}, ObservedAt: t0})
				tb.PutStability(&schemas.SuiteStability{Workspace: "a", Suite: "s", Version: "v2", AbnormalSamples: 2, ReplyLength: schemas.ReplyLength{Count: 20}, ObservedAt: t0})
			},
			now: t0, active: []bool{false, true},
		},
		{
			// A regression stays active while its suite lists it; a non-regression is never held.
			name: "revived regression",
			rule: "- {name: v, kind: revived_regression}",
			fill: func(tb *Table) {
				tb.PutRevived(&schemas.CaseRevived{Workspace: "a", Suite: "s", CaseID: "c1", Regression: true})
				tb.PutRevived(&schemas.CaseRevived{Workspace: "a", Suite: "s", CaseID: "c2", Regression: true})
				tb.PutRevived(&schemas.CaseRevived{Workspace: "a", Suite: "s", CaseID: "c3", Regression: false})
				tb.PutDiscrimination(&schemas.SuiteDiscrimination{Workspace: "a", Suite: "s", Revived: []string{"c1"}, RevivedTotal: 1, ObservedAt: t0})
			},
			now: t0, active: []bool{true, false},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tb := NewTable()
			tc.fill(tb)
			conds := Evaluate(mustRule(t, tc.rule), tb, tc.now)
			if len(conds) != len(tc.active) {
				t.Fatalf("%d conditions, want %d", len(conds), len(tc.active))
			}
			for i, c := range conds {
				if c.Active != tc.active[i] {
					t.Errorf("%s: active %v, want %v (evidence %+v)", c.Subject.Key, c.Active, tc.active[i], c.Evidence)
				}
			}
		})
	}
}

func TestChangeEvidence(t *testing.T) {
	tb := NewTable()
	tb.PutSnapshot(snap("live", 1, [2]int64{9, 40}, [2]int64{11, 80}, t0))
	c := Evaluate(mustRule(t, "- {name: c, kind: change, min_scored: 20}"), tb, t0)[0]
	ev := c.Evidence
	if c.Active || ev.Test == nil || len(ev.Windows) != 2 {
		t.Fatalf("evidence %+v", ev)
	}
	// The baseline is 7d less 24h: 2 of 40; Fisher's one-look p on 9/40 over 2/40 ≈ 0.024.
	if b := ev.Windows[1]; b.Name != "7d-24h" || b.ConfirmedRepeats != 2 || b.Scored != 40 {
		t.Errorf("baseline window %+v", b)
	}
	if p := ev.Test.FisherPOneLook; p < 0.0235 || p > 0.0241 {
		t.Errorf("fisher p %.4f", p)
	}
	if ev.Test.Epoch != "1h0m0s" || ev.Test.AlphaPerEpoch != 0.05/720 {
		t.Errorf("test %+v", ev.Test)
	}
}

// Suite snapshots are ordered by their snapshot version when they carry one, not by the clock of
// the processor that published them: a newer state published by a processor whose clock is behind
// replaces the held one, and an older one published later by a processor ahead does not.
func TestSuiteSnapshotsOrderedByVersion(t *testing.T) {
	tb := NewTable()
	d := func(v int64, at time.Time, rng float64) *schemas.SuiteDiscrimination {
		return &schemas.SuiteDiscrimination{Workspace: "a", Suite: "s", SnapshotVersion: v, ObservedAt: at, AchievableRange: &rng}
	}
	if !tb.PutDiscrimination(d(10, t0, 0.1)) {
		t.Fatal("first snapshot not taken")
	}
	if !tb.PutDiscrimination(d(11, t0.Add(-time.Hour), 0.2)) {
		t.Error("a newer version observed by a clock behind was dropped")
	}
	if tb.PutDiscrimination(d(9, t0.Add(time.Hour), 0.3)) {
		t.Error("an older version observed by a clock ahead replaced the newer")
	}
	if got := *tb.disc["d|"+schemas.JoinEscaped("a", "s")].AchievableRange; got != 0.2 {
		t.Errorf("held range %v, want version 11's 0.2", got)
	}
	st := func(v int64, at time.Time) *schemas.SuiteStability {
		return &schemas.SuiteStability{Workspace: "a", Suite: "s", Version: "v1", SnapshotVersion: v, ObservedAt: at}
	}
	tb.PutStability(st(10, t0))
	if !tb.PutStability(st(11, t0.Add(-time.Hour))) || tb.PutStability(st(9, t0.Add(time.Hour))) {
		t.Error("stability snapshots not ordered by version")
	}
}

// A snapshot of the same suite version observed later (a call of duplicates that matured missing
// runs) replaces the held one: missing_runs_above must see runs go missing without a new run.
func TestSuiteSnapshotOfTheSameVersionObservedLaterIsTaken(t *testing.T) {
	tb := NewTable()
	st := func(at time.Time, missing int64) *schemas.SuiteStability {
		return &schemas.SuiteStability{Workspace: "a", Suite: "s", Version: "v1", SnapshotVersion: 10, ObservedAt: at, MissingRunsTotal: missing}
	}
	tb.PutStability(st(t0, 0))
	if !tb.PutStability(st(t0.Add(5*time.Minute), 2)) {
		t.Fatal("the later observation of the same version was dropped")
	}
	if tb.PutStability(st(t0.Add(time.Minute), 1)) {
		t.Error("an earlier observation of the same version replaced a later one")
	}
}

// A change rule's alpha is its subjects' to share when it says how many there are: with
// `subjects: 100` each subject's test spends alpha/100, so any false alarm among up to 100
// subjects per horizon stays within alpha (union bound); without it each subject spends alpha,
// and the evidence says which, so a reader can tell what N subjects may raise. A count that would
// make the bound meaningless is refused at load.
func TestChangeAlphaSharedAmongSubjects(t *testing.T) {
	tb := NewTable()
	tb.PutSnapshot(snap("live", 1, [2]int64{9, 40}, [2]int64{11, 80}, t0))
	for _, c := range []struct {
		rule     string
		subjects int
	}{
		{"- {name: c, kind: change, min_scored: 20}", 1},
		{"- {name: c, kind: change, min_scored: 20, subjects: 100}", 100},
	} {
		test := Evaluate(mustRule(t, c.rule), tb, t0)[0].Evidence.Test
		if test.Subjects != c.subjects || test.AlphaPerSubject != 0.05/float64(c.subjects) || test.AlphaPerEpoch != 0.05/float64(c.subjects)/720 {
			t.Errorf("%s: test %+v", c.rule, test)
		}
	}
	for _, bad := range []string{"subjects: 0", "subjects: -3", "subjects: 20000000"} {
		_, err := Parse([]byte("rules:\n- {name: c, kind: change, " + bad + "}\n"))
		if err == nil || !strings.Contains(err.Error(), "subjects") {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := Parse([]byte("rules:\n- {name: t, kind: threshold, value: 0.1, subjects: 5}\n")); err == nil {
		t.Error("subjects on a threshold rule was accepted")
	}
}
