package aggregator

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func us(d time.Duration) int64 { return Micros(t0.Add(d)) }

var scopeA = schemas.Scope{Workspace: "ws", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}
var keyLive = Key{Scope: scopeA, CorrectionID: "fix-1", Source: Live}

func obs(id string, cl Class, occ, asd time.Duration, seq int64) Observation {
	return Observation{Key: keyLive, OpportunityID: id, Class: cl, Occurred: us(occ), Assessed: us(asd), Seq: seq}
}

func TestSeedExample(t *testing.T) {
	// Seed 000's illustration: 4 confirmed repeats and 16 passed of 20 scored, 3 unscored shown.
	m := NewModel(30 * 24 * time.Hour)
	var batch []Observation
	for i := 0; i < 23; i++ {
		cl := Passed
		switch {
		case i < 4:
			cl = Confirmed
		case i >= 20:
			cl = Unscored
		}
		batch = append(batch, obs(string(rune('a'+i)), cl, time.Duration(i)*time.Second, time.Duration(i)*time.Second, 0))
	}
	m.ApplyBatch(batch)
	w := m.Tally(keyLive, t0.Add(time.Minute)).Snapshot(keyLive, t0).Windows.All
	if w.ConfirmedRepeats != 4 || w.Passed != 16 || w.Unscored != 3 || w.Scored != 20 {
		t.Fatalf("counts = %+v", w)
	}
	if w.Status != schemas.StatusMeasured || *w.Rate != 0.2 || math.Abs(*w.Percentage-20) > 1e-12 {
		t.Fatalf("rate = %v %v %v", w.Status, *w.Rate, *w.Percentage)
	}
	// Reference Wilson interval for 4 of 20.
	if math.Abs(w.CI95.Low-0.0807) > 5e-4 || math.Abs(w.CI95.High-0.4160) > 5e-4 {
		t.Fatalf("ci95 = %+v, want about [0.0807, 0.4160]", *w.CI95)
	}
}

func TestNotMeasured(t *testing.T) {
	tests := []struct {
		name  string
		c     Counts
		want  string
		hasCI bool
	}{
		// Nothing at all.
		{"empty", Counts{}, schemas.StatusNotMeasured, false},
		// Unscored only: still not measured, but the unscored are reported.
		{"unscored only", Counts{Unscored: 7}, schemas.StatusNotMeasured, false},
		// One passed opportunity is a measurement (0 %), with a wide interval.
		{"one passed", Counts{Passed: 1}, schemas.StatusMeasured, true},
		// All confirmed: 100 %.
		{"all confirmed", Counts{Confirmed: 3, Unscored: 2}, schemas.StatusMeasured, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := tc.c.Window()
			if w.Status != tc.want || (w.CI95 != nil) != tc.hasCI || (w.Rate != nil) != tc.hasCI || (w.Percentage != nil) != tc.hasCI {
				t.Fatalf("window = %+v", w)
			}
			if w.Unscored != tc.c.Unscored {
				t.Fatalf("unscored = %d, want %d", w.Unscored, tc.c.Unscored)
			}
			if w.CI95 != nil && (w.CI95.Low > *w.Rate || w.CI95.High < *w.Rate || w.CI95.Low < 0 || w.CI95.High > 1) {
				t.Fatalf("interval %+v does not hold rate %v", *w.CI95, *w.Rate)
			}
		})
	}
}

func TestWilsonNarrowsWithN(t *testing.T) {
	small, large := Wilson(1, 5), Wilson(200, 1000)
	if small.High-small.Low <= large.High-large.Low {
		t.Fatalf("5 trials gave %+v, 1000 gave %+v: the small one must be wider", small, large)
	}
	// Reference values: 0 of 10 → [0, 0.2775]; 10 of 10 → [0.7225, 1].
	if z := Wilson(0, 10); z.Low != 0 || math.Abs(z.High-0.2775) > 5e-4 {
		t.Fatalf("0/10: %+v", z)
	}
	if o := Wilson(10, 10); math.Abs(o.Low-0.7225) > 5e-4 || math.Abs(o.High-1) > 1e-9 {
		t.Fatalf("10/10: %+v", o)
	}
}

func TestReassessment(t *testing.T) {
	h := time.Hour
	tests := []struct {
		name     string
		events   []Observation
		outcomes []Outcome
		all      Counts
	}{
		{"newer assessment moves the class",
			[]Observation{obs("x", Confirmed, 0, 0, 0), obs("x", Passed, 0, h, 0)},
			[]Outcome{Counted, Reassessed}, Counts{Passed: 1}},
		{"same assessment is a duplicate even with another class",
			[]Observation{obs("x", Confirmed, 0, h, 1), obs("x", Passed, 0, h, 1)},
			[]Outcome{Counted, Duplicate}, Counts{Confirmed: 1}},
		{"older assessment is stale",
			[]Observation{obs("x", Passed, 0, h, 0), obs("x", Confirmed, 0, 0, 5)},
			[]Outcome{Counted, Stale}, Counts{Passed: 1}},
		{"seq breaks a tie of assessed_at",
			[]Observation{obs("x", Unscored, 0, h, 1), obs("x", Confirmed, 0, h, 2), obs("x", Passed, 0, h, 1)},
			[]Outcome{Counted, Reassessed, Stale}, Counts{Confirmed: 1}},
		{"absent seq counts as zero",
			[]Observation{obs("x", Unscored, 0, h, 0), obs("x", Confirmed, 0, h, 0)},
			[]Outcome{Counted, Duplicate}, Counts{Unscored: 1}},
		{"other opportunities count separately",
			[]Observation{obs("x", Confirmed, 0, 0, 0), obs("y", Confirmed, 0, 0, 0)},
			[]Outcome{Counted, Counted}, Counts{Confirmed: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			applyEach(t, NewModel(30*24*h), tc.events, tc.outcomes, tc.all, t0)
		})
	}
}

func TestSameOpportunityOtherAggregate(t *testing.T) {
	m := NewModel(time.Hour)
	other := keyLive
	other.Source = Evaluation
	a := obs("x", Confirmed, 0, 0, 0)
	b := a
	b.Key = other
	if got := m.ApplyBatch([]Observation{a, b}); got[0] != Counted || got[1] != Counted {
		t.Fatalf("outcomes = %v: the same id under another aggregate is another opportunity", got)
	}
}

func TestWindows(t *testing.T) {
	h := time.Hour
	m := NewModel(30 * 24 * h)
	m.ApplyBatch([]Observation{
		obs("now", Confirmed, 0, 0, 0),                // in every window
		obs("59m", Passed, -59*time.Minute, 0, 0),     // last minute bucket of 1h
		obs("61m", Passed, -61*time.Minute, 0, 0),     // out of 1h, in 24h
		obs("23h", Unscored, -23*h, 0, 0),             // last hour bucket of 24h
		obs("25h", Confirmed, -25*h, 0, 0),            // out of 24h, in 7d
		obs("8d", Passed, -8*24*h, 0, 0),              // only in all
		obs("future", Confirmed, 3*time.Minute, 0, 0), // later minute than the observation: out of 1h, but in its hour bucket
	})
	tl := m.Tally(keyLive, t0.Add(30*time.Second))
	want := map[string]Counts{
		"all": {Confirmed: 3, Passed: 3, Unscored: 1},
		"1h":  {Confirmed: 1, Passed: 1},
		"24h": {Confirmed: 2, Passed: 2, Unscored: 1},
		"7d":  {Confirmed: 3, Passed: 2, Unscored: 1},
	}
	got := map[string]Counts{"all": tl.All, "1h": tl.Hour, "24h": tl.Day, "7d": tl.Week}
	for w := range want {
		if got[w] != want[w] {
			t.Errorf("%s = %+v, want %+v", w, got[w], want[w])
		}
	}
	if tl.First != us(-8*24*h) || tl.Last != us(3*time.Minute) {
		t.Errorf("span = %d..%d", tl.First, tl.Last)
	}
}

func TestRetention(t *testing.T) {
	h := time.Hour
	m := NewModel(48 * h)
	got := m.ApplyBatch([]Observation{
		obs("old", Confirmed, 0, 0, 0),
		obs("new", Passed, 49*h, 49*h, 0),  // moves the watermark: "old" leaves every count
		obs("late", Passed, 0, 50*h, 0),    // occurred beyond retention behind the watermark
		obs("edge", Confirmed, h, 50*h, 0), // exactly at the retention edge: kept
		obs("old", Confirmed, 0, 0, 0),     // its identity is gone, and it is expired too
		// Retention is hour-granular: 49h30m moves the watermark, but the cut stays at the start
		// of hour 1 (the hour of 1h30m), so an opportunity 48h10m behind is still kept.
		obs("newer", Passed, 49*h+30*time.Minute, 50*h, 0),
		obs("hour", Confirmed, h+20*time.Minute, 50*h, 0),
		obs("before", Confirmed, h-time.Microsecond, 50*h, 0), // the hour before the cut
	})
	want := []Outcome{Counted, Counted, Expired, Counted, Expired, Counted, Counted, Expired}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("outcomes = %v, want %v", got, want)
		}
	}
	if all := m.Tally(keyLive, t0.Add(50*h)).All; all != (Counts{Confirmed: 2, Passed: 2}) {
		t.Fatalf("all = %+v", all)
	}
}

func TestVersionGrowsOncePerChangingBatch(t *testing.T) {
	m := NewModel(time.Hour)
	ctx := context.Background()
	at := Micros(t0)
	a, _ := m.Apply(ctx, []Observation{obs("x", Confirmed, 0, 0, 0), obs("y", Passed, 0, 0, 0)}, t0)
	b, _ := m.Apply(ctx, []Observation{obs("x", Confirmed, 0, 0, 0)}, t0)
	c, _ := m.Apply(ctx, []Observation{obs("x", Passed, 0, time.Second, 0)}, t0)
	// A clock that went back (or a store that lost writes and an older clock) still moves it up.
	d, _ := m.Apply(ctx, []Observation{obs("x", Confirmed, 0, 2*time.Second, 0)}, t0.Add(-time.Hour))
	e, _ := m.Apply(ctx, []Observation{obs("x", Passed, 0, 3*time.Second, 0)}, t0.Add(time.Hour))
	got := []int64{a.Tallies[keyLive].Version, b.Tallies[keyLive].Version, c.Tallies[keyLive].Version,
		d.Tallies[keyLive].Version, e.Tallies[keyLive].Version}
	want := []int64{at, at, at + 1, at + 2, Micros(t0.Add(time.Hour))}
	if !slices.Equal(got, want) {
		t.Fatalf("versions = %v, want %v", got, want)
	}
	// Replay's per-event path counts changing events.
	r := NewModel(time.Hour)
	r.ApplyBatch([]Observation{obs("x", Confirmed, 0, 0, 0)})
	r.ApplyBatch([]Observation{obs("x", Confirmed, 0, 0, 0)})
	r.ApplyBatch([]Observation{obs("x", Passed, 0, time.Second, 0)})
	if v := r.Tally(keyLive, t0).Version; v != 2 {
		t.Fatalf("replay version = %d, want 2", v)
	}
}

func TestChooseBadge(t *testing.T) {
	live := Counts{Confirmed: 4, Passed: 16, Unscored: 3}.Window()
	eval := Counts{Confirmed: 1, Passed: 1}.Window()
	none := Counts{Unscored: 2}.Window()
	tests := []struct {
		name       string
		live, eval schemas.Window
		source     string
		value      string
	}{
		// Live wins whenever it is measured.
		{"live measured", live, eval, "live", "20.0% live (4/20, 3 unscored)"},
		// Evaluation stands in only when live is not measured.
		{"only evaluation", none, eval, "evaluation", "50.0% evaluation (1/2, 0 unscored)"},
		// Neither: say so, with the unscored counts of both.
		{"neither", none, Counts{}.Window(), "", "not measured (live 2 unscored, evaluation 0 unscored)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := ChooseBadge(tc.live, tc.eval)
			if b.Source != tc.source || b.Value != tc.value || b.Measured != (tc.source != "") {
				t.Fatalf("badge = %+v", b)
			}
		})
	}
}

// fault5Batch is a batch whose second apply used to count an opportunity again: X′ re-assesses o
// into hour 90, Y moves the watermark so a 24 h retention cuts at hour 96, and X (older, hour 100)
// met no identity on redelivery because o's record sat in an expired hour.
func fault5Batch() []Observation {
	h := time.Hour
	return []Observation{
		obs("o", Confirmed, 100*h, 100*h, 0), // X
		obs("o", Passed, 90*h, 101*h, 0),     // X′: newer, moves o to hour 90
		obs("y", Passed, 120*h, 120*h, 0),    // Y: the cut moves to hour 96
	}
}

func TestRedeliveryAfterReassessmentIntoExpiredHour(t *testing.T) {
	ctx := context.Background()
	at := t0.Add(120 * time.Hour)
	for _, name := range []string{"model", "redis"} {
		var s applier = NewModel(24 * time.Hour)
		if name == "redis" {
			s, _ = testStore(t, "fault5", RedisConfig{Retention: 24 * time.Hour})
		}
		first, err := s.Apply(ctx, fault5Batch(), at)
		if err != nil {
			t.Fatal(err)
		}
		second, err := s.Apply(ctx, fault5Batch(), at)
		if err != nil {
			t.Fatal(err)
		}
		if got := first.Tallies[keyLive]; got.All != (Counts{Passed: 1}) {
			t.Fatalf("%s, first apply: all = %+v, want only y passed", name, got.All)
		}
		if first.Tallies[keyLive] != second.Tallies[keyLive] {
			t.Fatalf("%s: the second apply changed the aggregate:\n%+v\n%+v", name, first.Tallies[keyLive], second.Tallies[keyLive])
		}
		for i, o := range second.Outcomes {
			if o == Counted || o == Reassessed {
				t.Fatalf("%s, second apply: event %d was %v", name, i, o)
			}
		}
	}
}

func TestRetentionKeepsIdentityWhileHorizonRetained(t *testing.T) {
	h := time.Hour
	tests := []struct {
		name     string
		events   []Observation
		outcomes []Outcome
		all      Counts
	}{
		// A newer assessment whose occurred time is already expired changes nothing.
		{"newer expired assessment changes nothing",
			[]Observation{obs("y", Passed, 120*h, 120*h, 0), obs("o", Confirmed, 100*h, 100*h, 0), obs("o", Passed, 90*h, 121*h, 0)},
			[]Outcome{Counted, Counted, Expired}, Counts{Confirmed: 1, Passed: 1}},
		// An older assessment stays stale even when it is the only one in a retained hour.
		{"stale after the winner expired",
			[]Observation{obs("o", Passed, 90*h, 101*h, 0), obs("o", Confirmed, 100*h, 100*h, 0), obs("y", Passed, 120*h, 120*h, 0), obs("o", Confirmed, 100*h, 100*h, 0)},
			[]Outcome{Counted, Stale, Counted, Stale}, Counts{Passed: 1}},
		// Once the horizon too has left, the identity is forgotten: the event is expired.
		{"identity forgotten with its horizon",
			[]Observation{obs("o", Passed, 90*h, 101*h, 0), obs("y", Passed, 200*h, 200*h, 0), obs("o", Confirmed, 100*h, 100*h, 0)},
			[]Outcome{Counted, Counted, Expired}, Counts{Passed: 1}},
		// A re-assessment back into a retained hour counts again.
		{"newer assessment into a retained hour",
			[]Observation{obs("o", Passed, 90*h, 101*h, 0), obs("o", Confirmed, 100*h, 100*h, 0), obs("y", Passed, 120*h, 120*h, 0), obs("o", Confirmed, 110*h, 130*h, 0)},
			[]Outcome{Counted, Stale, Counted, Reassessed}, Counts{Confirmed: 1, Passed: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			applyEach(t, NewModel(24*h), tc.events, tc.outcomes, tc.all, t0.Add(200*h))
		})
	}
}

// applyEach applies events to m one batch each and requires the outcomes and, at time at, the
// all-time counts.
func applyEach(t *testing.T, m *Model, events []Observation, outcomes []Outcome, all Counts, at time.Time) {
	t.Helper()
	var got []Outcome
	for _, e := range events {
		got = append(got, m.ApplyBatch([]Observation{e})...)
	}
	if !slices.Equal(got, outcomes) {
		t.Fatalf("outcomes = %v, want %v", got, outcomes)
	}
	if a := m.Tally(keyLive, at).All; a != all {
		t.Fatalf("all = %+v, want %+v", a, all)
	}
}
