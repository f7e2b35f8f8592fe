package synth_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/synth"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// TestNewUnchanged pins what New produces for its existing callers (the benchmark's today shape
// and the end-to-end test's mix): a new Config field at its zero value must not change a byte.
// The hashes were taken before Spread existed.
func TestNewUnchanged(t *testing.T) {
	for _, tc := range []struct {
		cfg  synth.Config
		want string
	}{
		// test/bench's today shape with 20 % duplicates.
		{synth.Config{Seed: 11, Workspaces: 10, Corrections: 10, Duplicates: 0.2, Reassessed: 0.1, EvalShare: 0.3},
			"2072733eddc85c15ab0e004b0c41e8e9a5a7278be0771e977ce9c44ae7670789"},
		// cmd/repeatrate's end-to-end mix, with poison.
		{synth.Config{Seed: 42, Workspaces: 4, Corrections: 3, Duplicates: 0.2, Reassessed: 0.1, Poison: 0.01, EvalShare: 0.3},
			"55b5c72abb8bd70f10de5dd825f3d1b8a17d2c4989213dc7d239496c848b36ac"},
	} {
		g := synth.New(tc.cfg)
		h := sha256.New()
		for range 20000 {
			l, _ := g.Line(now)
			h.Write(l)
			h.Write([]byte{'\n'})
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != tc.want {
			t.Errorf("seed %d: stream hash %s, want %s", tc.cfg.Seed, got, tc.want)
		}
	}
}

// TestSkippedCountsNameOtherOpportunities holds what the prefilled bench's rounds rely on: two
// generators of one seed whose counts never meet share no opportunity id and no event id, so
// each stream is new to a store that holds the other.
func TestSkippedCountsNameOtherOpportunities(t *testing.T) {
	const n = 20000
	ids := func(skip int) (opps, events map[string]bool) {
		g := synth.New(synth.Config{Seed: 11, Workspaces: 10, Corrections: 10, Duplicates: 0.2, Reassessed: 0.1, EvalShare: 0.3, Skip: skip})
		opps, events = map[string]bool{}, map[string]bool{}
		for range n {
			l, _ := g.Line(now)
			var ev struct {
				ID   string `json:"id"`
				Data struct {
					Opp string `json:"opportunity_id"`
				} `json:"data"`
			}
			if err := json.Unmarshal(l, &ev); err != nil {
				t.Fatal(err)
			}
			opps[ev.Data.Opp], events[ev.ID] = true, true
		}
		return opps, events
	}
	opps0, events0 := ids(0)
	opps1, events1 := ids(n)
	if len(opps1) < n/2 {
		t.Fatalf("%d opportunities in %d lines, want most lines new", len(opps1), n)
	}
	for o := range opps1 {
		if opps0[o] {
			t.Fatalf("opportunity %s in both streams", o)
		}
	}
	for e := range events1 {
		if events0[e] {
			t.Fatalf("event id %s in both streams", e)
		}
	}
}

// TestSpread checks that new opportunities occur over the whole spread and never after now.
func TestSpread(t *testing.T) {
	const spread = 30 * 24 * time.Hour
	g := synth.New(synth.Config{Seed: 1, Workspaces: 3, Corrections: 10, Spread: spread})
	oldest, newest := now, now.Add(-spread)
	for range 5000 {
		l, _ := g.Line(now)
		var ev struct {
			Data struct {
				Occurred time.Time `json:"occurred_at"`
			} `json:"data"`
		}
		if err := json.Unmarshal(l, &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Data.Occurred.Before(oldest) {
			oldest = ev.Data.Occurred
		}
		if ev.Data.Occurred.After(newest) {
			newest = ev.Data.Occurred
		}
		if ev.Data.Occurred.After(now) || ev.Data.Occurred.Before(now.Add(-spread)) {
			t.Fatalf("occurred_at %s outside [now-%s, now]", ev.Data.Occurred, spread)
		}
	}
	if newest.Sub(oldest) < 29*24*time.Hour {
		t.Errorf("occurred_at spans %s, want most of %s", newest.Sub(oldest), spread)
	}
}

// TestEval checks the eval-heavy stream: every line decodes; exactly Runs graded runs, each
// (case, run_index) once with RunsPerCase runs per case, all in one version with a prediction;
// live attempts and correction checks near their shares, a case's runs all checks of one
// correction or none.
func TestEval(t *testing.T) {
	const runs, perCase = 10_000, 5
	g := synth.NewEval(synth.EvalConfig{Seed: 3, Runs: runs, RunsPerCase: perCase, LiveShare: 0.1, Checks: 0.5})
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		c string
		i int64
	}
	seen := map[run]bool{}
	perCaseRuns := map[string]int{}
	caseCorr := map[string]string{}
	var lines, live, checks int
	for {
		l, ok := g.Next(now)
		if !ok {
			break
		}
		lines++
		ev, err := dec.DecodeStructured(l, now)
		if err != nil {
			t.Fatalf("line %d does not decode: %v: %s", lines, err, l)
		}
		if ev.Live != nil {
			live++
			continue
		}
		e := ev.Eval
		if e.Version != "v1" || e.Runs != perCase || e.Prediction == nil || *e.Prediction == "" {
			t.Fatalf("eval result %s: version %q, runs %d, prediction %v", l, e.Version, e.Runs, e.Prediction)
		}
		if seen[run{e.CaseID, e.RunIndex}] {
			t.Fatalf("run %s/%d twice", e.CaseID, e.RunIndex)
		}
		seen[run{e.CaseID, e.RunIndex}] = true
		perCaseRuns[e.CaseID]++
		if e.IsCorrectionCheck() {
			checks++
		}
		// A case's runs check one correction, or none does: its runs share a partition key.
		if corr, ok := caseCorr[e.CaseID]; ok && corr != e.CorrectionID {
			t.Fatalf("case %s checks %q and %q", e.CaseID, corr, e.CorrectionID)
		}
		caseCorr[e.CaseID] = e.CorrectionID
	}
	if len(seen) != runs || g.Runs() != runs {
		t.Errorf("%d graded runs (generator says %d), want %d", len(seen), g.Runs(), runs)
	}
	if len(perCaseRuns) != runs/perCase {
		t.Errorf("%d cases, want %d", len(perCaseRuns), runs/perCase)
	}
	for c, n := range perCaseRuns {
		if n != perCase {
			t.Fatalf("case %s has %d runs, want %d", c, n, perCase)
		}
	}
	if share := float64(live) / float64(lines); share < 0.08 || share > 0.12 {
		t.Errorf("live share %.3f, want about 0.1", share)
	}
	if share := float64(checks) / float64(runs); share < 0.45 || share > 0.55 {
		t.Errorf("correction-check share %.3f, want about 0.5", share)
	}
}
