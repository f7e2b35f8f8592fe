package importer

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

// inspectLogs is the folder of logs Inspect AI wrote for these tests (test/inspect/make_logs.py,
// run by deploy/local/test.sh), holding part; the test skips without it, except under CI=true.
func inspectLogs(t *testing.T, part string) string {
	t.Helper()
	dir := filepath.Join("..", ".cache", "inspect-logs", part)
	if _, err := os.Stat(dir); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Inspect AI logs in %s (deploy/local/test.sh makes them)", dir)
		}
		t.Skipf("no Inspect AI logs in %s; run .cache/venv/bin/python test/inspect/make_logs.py .cache/inspect-logs", dir)
	}
	return dir
}

// One eval() of two models writes two logs with one run id: each model is a version of its own,
// and neither model's runs replace the other's (before, both took the run id as their version,
// and the later log's runs overwrote the other's as re-assessments of the same runs).
func TestInspectModelsOfOneRunAreVersionsOfTheirOwn(t *testing.T) {
	evs, err := Inspect(inspectLogs(t, "models"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	rs := decode(t, evs)
	byVersion := map[string][]schemas.EvalResult{}
	runIDs := map[string]bool{}
	for _, r := range rs {
		byVersion[r.Version] = append(byVersion[r.Version], r)
		runIDs[r.Scope.Run] = true
	}
	if len(runIDs) != 1 {
		t.Fatalf("the logs of one eval() have %d run ids, want 1 (the scenario)", len(runIDs))
	}
	if len(byVersion) != 2 {
		t.Fatalf("versions %v, want one per model", slices.Collect(maps.Keys(byVersion)))
	}
	for v, rs := range byVersion {
		if len(rs) != 6 {
			t.Fatalf("version %s has %d runs, want 3 cases × 2 epochs", v, len(rs))
		}
		want := map[string][]string{"refund-1": {"pass", "pass"}, "refund-2": {"pass", "fail"}, "refund-3": {"fail", "fail"}}
		if rs[0].Scope.Model == "mockllm/other" {
			want["refund-2"] = []string{"fail", "fail"}
		}
		got := tally(rs)
		for c, w := range want {
			if !slices.Equal(got[c], w) {
				t.Errorf("version %s case %s: %v, want %v", v, c, got[c], w)
			}
		}
		if v != rs[0].Scope.Model+"@"+rs[0].Scope.Run {
			t.Errorf("version %q, want model@run", v)
		}
	}
}

// A log scored again (inspect_ai.score with action="overwrite", a stricter scorer) supersedes the
// first verdicts: each run is assessed when the scorer last scored it, later than the first
// scoring, and is another event (another id), so the store takes it as a re-assessment rather
// than a duplicate. Before, every run kept its id and its completion time, and the new verdicts
// were dropped as duplicates.
func TestInspectRescoredLogSupersedesTheFirstScores(t *testing.T) {
	dir := inspectLogs(t, "rescored")
	first, err := Inspect(filepath.Join(dir, "first"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	again, err := Inspect(filepath.Join(dir, "again"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 6 || len(again) != 6 {
		t.Fatalf("%d and %d results, want 6 each", len(first), len(again))
	}
	type run struct {
		caseID string
		index  int64
	}
	before := map[run]schemas.EvalResult{}
	ids := map[string]bool{}
	for i, r := range decode(t, first) {
		before[run{r.CaseID, r.RunIndex}] = r
		ids[first[i].ID] = true
	}
	if got := tally(decode(t, first))["refund-1"]; !slices.Equal(got, []string{"pass", "pass"}) {
		t.Fatalf("refund-1 as first scored: %v", got)
	}
	changed := 0
	for i, r := range decode(t, again) {
		b, ok := before[run{r.CaseID, r.RunIndex}]
		if !ok || r.Version != b.Version {
			t.Fatalf("run %s/%d of the rescored log is not a run of the first (version %q, %q)", r.CaseID, r.RunIndex, r.Version, b.Version)
		}
		if !r.AssessedAt.After(b.AssessedAt) {
			t.Errorf("run %s/%d: assessed at %v again, %v first: the new score would not supersede", r.CaseID, r.RunIndex, r.AssessedAt, b.AssessedAt)
		}
		if ids[again[i].ID] {
			t.Errorf("run %s/%d keeps its event id though its content changed", r.CaseID, r.RunIndex)
		}
		if r.Result != b.Result {
			changed++
		}
	}
	if got := tally(decode(t, again))["refund-1"]; !slices.Equal(got, []string{"fail", "fail"}) || changed != 2 {
		t.Fatalf("refund-1 scored again: %v, %d verdicts changed; want fail, fail and 2", got, changed)
	}
}

// A verdict edited by hand (inspect_ai.log.edit_score) supersedes the first one: the edited run is
// judged twice (score, then edit), later, and is another event; the runs not edited are the same
// events as before, so importing both logs counts each of those once.
func TestInspectEditedScoreSupersedesTheFirst(t *testing.T) {
	dir := inspectLogs(t, "rescored")
	first, err := Inspect(filepath.Join(dir, "first"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	edited, err := Inspect(filepath.Join(inspectLogs(t, "rescored/edited")), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]schemas.EvalResult{}
	for i, r := range decode(t, first) {
		ids[first[i].ID] = r
	}
	changed := 0
	for i, r := range decode(t, edited) {
		if _, same := ids[edited[i].ID]; same {
			continue
		}
		changed++
		if r.CaseID != "refund-3" || r.RunIndex != 0 || r.Result != "pass" || r.AssessmentSeq != 2 {
			t.Errorf("a new event for %s/%d: %+v", r.CaseID, r.RunIndex, r)
		}
	}
	if changed != 1 {
		t.Fatalf("%d runs are new events after one edit, want 1", changed)
	}
}

// A version-1 log, which Inspect still reads (one "score" per sample, its events under
// "transcript", the scorer named only by results.scores), imports as the same log in today's
// layout does: every run with the same verdict and the same assessment (before, every sample read
// as unscored, and the import was refused for having no scorer).
func TestInspectVersionOneLogImportsAsToday(t *testing.T) {
	v1, err := Inspect(inspectLogs(t, "v1"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	v2, err := Inspect(inspectLogs(t, "json"), Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		caseID string
		index  int64
	}
	want := map[run]schemas.EvalResult{}
	for _, r := range decode(t, v2) {
		want[run{r.CaseID, r.RunIndex}] = r
	}
	got := decode(t, v1)
	if len(got) != len(want) || len(got) != 9 {
		t.Fatalf("%d runs from the v1 log, %d from today's", len(got), len(want))
	}
	for _, r := range got {
		w := want[run{r.CaseID, r.RunIndex}]
		if r.Result != w.Result || !r.AssessedAt.Equal(w.AssessedAt) || r.AssessmentSeq != w.AssessmentSeq || r.Version != w.Version {
			t.Errorf("run %s/%d: %s at %v (seq %d) from v1, %s at %v (seq %d) today", r.CaseID, r.RunIndex, r.Result, r.AssessedAt, r.AssessmentSeq,
				w.Result, w.AssessedAt, w.AssessmentSeq)
		}
	}
}
