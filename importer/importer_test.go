package importer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

var testScope = schemas.Scope{Workspace: "acme", Checkpoint: "ckpt-1", Artifact: "eval"}

func decode(t *testing.T, evs []Event) []schemas.EvalResult {
	t.Helper()
	var out []schemas.EvalResult
	for _, e := range evs {
		var ce struct{ Data schemas.EvalResult }
		if err := json.Unmarshal(e.Value, &ce); err != nil {
			t.Fatal(err)
		}
		out = append(out, ce.Data)
	}
	return out
}

// tally counts results per case: "pass/fail/error" strings in run order.
func tally(rs []schemas.EvalResult) map[string][]string {
	m := map[string][]string{}
	for _, r := range rs {
		for int64(len(m[r.CaseID])) <= r.RunIndex {
			m[r.CaseID] = append(m[r.CaseID], "")
		}
		m[r.CaseID][r.RunIndex] = r.Result
	}
	return m
}

// TestInspectLogs imports the logs of a real Inspect AI run (test/inspect/make_logs.py, made by
// deploy/local/test.sh): 3 samples × 3 epochs in .eval (zstd) and .json, and an all-error run.
func TestInspectLogs(t *testing.T) {
	dir := filepath.Join("..", ".cache", "inspect-logs")
	if _, err := os.Stat(filepath.Join(dir, "done")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Inspect AI logs in %s (deploy/local/test.sh makes them)", dir)
		}
		t.Skipf("no Inspect AI logs in %s; run .cache/venv/bin/python test/inspect/make_logs.py %s", dir, dir)
	}
	want := map[string][]string{
		"refund-1": {"pass", "pass", "pass"},
		"refund-2": {"pass", "fail", "fail"},
		"refund-3": {"fail", "fail", "fail"},
	}
	for _, format := range []string{"eval", "json"} {
		t.Run(format, func(t *testing.T) {
			evs, err := Inspect(filepath.Join(dir, format), Options{Scope: testScope})
			if err != nil {
				t.Fatal(err)
			}
			rs := decode(t, evs)
			if len(rs) != 9 {
				t.Fatalf("%d results, want 9", len(rs))
			}
			got := tally(rs)
			for c, w := range want {
				if !slices.Equal(got[c], w) {
					t.Errorf("case %s: %v, want %v", c, got[c], w)
				}
			}
			for _, r := range rs {
				if r.Runs != 3 || r.Suite != "regressions" || r.Scope.Model != "mockllm/model" || r.Prediction == nil || *r.Prediction == "" || r.Score == nil {
					t.Fatalf("result %+v", r)
				}
			}
			again, err := Inspect(filepath.Join(dir, format), Options{Scope: testScope})
			if err != nil {
				t.Fatal(err)
			}
			for i := range evs {
				if string(evs[i].Value) != string(again[i].Value) || evs[i].ID != again[i].ID {
					t.Fatalf("event %d differs on a second import", i)
				}
			}
		})
	}
	evs, err := Inspect(filepath.Join(dir, "error"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	rs := decode(t, evs)
	if len(rs) != 4 {
		t.Fatalf("%d results of the errored run, want 4", len(rs))
	}
	for _, r := range rs {
		if r.Result != schemas.ResultError || r.Runs != 2 {
			t.Fatalf("errored sample imported as %+v", r)
		}
	}
}

func TestInspectScoreMapping(t *testing.T) {
	for _, tc := range []struct {
		value     string
		threshold float64
		result    string
		score     float64 // -1: none
	}{
		{`"C"`, 1, "pass", 1}, {`"I"`, 1, "fail", 0}, {`"N"`, 1, "fail", 0},
		{`"P"`, 1, "fail", 0.5}, {`"P"`, 0.5, "pass", 0.5},
		{`true`, 1, "pass", 1}, {`false`, 1, "fail", 0},
		{`0.8`, 0.75, "pass", 0.8}, {`0.7`, 0.75, "fail", 0.7}, {`3`, 1, "pass", -1},
		{`"X"`, 1, "error", -1}, {`{"a": 1}`, 1, "error", -1},
		{`0`, 0, "pass", 0}, {`"I"`, 0, "pass", 0}, // a threshold of 0 passes every score
	} {
		res, score := inspectResult(json.RawMessage(tc.value), tc.threshold)
		if res != tc.result || (score == nil) != (tc.score < 0) || (score != nil && *score != tc.score) {
			t.Errorf("%s at %v: %s %v, want %s %v", tc.value, tc.threshold, res, score, tc.result, tc.score)
		}
	}
}

// TestOpenCompass imports the fixture (testdata/opencompass/README.md): 2 examples × 2 runs.
func TestOpenCompass(t *testing.T) {
	evs, err := OpenCompass(filepath.Join("testdata", "opencompass"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	rs := decode(t, evs)
	got := tally(rs)
	if !slices.Equal(got["0"], []string{"pass", "pass"}) || !slices.Equal(got["1"], []string{"fail", "pass"}) || len(got) != 2 {
		t.Fatalf("results %v", got)
	}
	for _, r := range rs {
		wantPred := map[string][]string{"0": {"4", "4"}, "1": {"7", "6"}}[r.CaseID][r.RunIndex]
		if r.Runs != 2 || r.Suite != "gsm8k" || r.Scope.Model != "m7b" || r.Version != "m7b@20261130_080000" || r.Prediction == nil || *r.Prediction != wantPred {
			t.Fatalf("result %+v", r)
		}
	}
}

// OpenCompass's evaluators write correct flags as booleans or as 1/0 (and OpenCompass counts them
// with int()): both import, per repeat too; anything else is refused with what it was.
func TestOpenCompassCorrectFlags(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want []bool
	}{
		{`true`, []bool{true}},
		{`1`, []bool{true}},
		{`0`, []bool{false}},
		{`1.0`, []bool{true}},
		{`0.5`, []bool{false}}, // int(0.5) is 0
		{`[1, 0, true, false]`, []bool{true, false, true, false}},
	} {
		got, err := ocFlags(json.RawMessage(c.raw))
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v %v, want %v", c.raw, got, err, c.want)
		}
	}
	for _, bad := range []string{`"yes"`, `[1, "no"]`, `{"a": 1}`} {
		if _, err := ocFlags(json.RawMessage(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
