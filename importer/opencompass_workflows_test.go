package importer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// copyTree copies the directory src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Two models evaluated in one OpenCompass run share its directory's timestamp
// (results/<model>/<dataset>.json for each): each is a version of its own and every run of both
// imports (before, the second model's runs were dropped as the same runs of the same version).
func TestOpenCompassModelsOfOneRunAreVersionsOfTheirOwn(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "20261130_080000")
	copyTree(t, filepath.Join("testdata", "opencompass", "20261130_080000"), run)
	for _, part := range []string{"results", "predictions"} {
		copyTree(t, filepath.Join(run, part, "m7b"), filepath.Join(run, part, "m13b"))
	}
	evs, err := OpenCompass(dir, Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	rs := decode(t, evs)
	runs := map[string]int{}
	for _, r := range rs {
		runs[r.Version]++
		if r.Version != r.Scope.Model+"@20261130_080000" {
			t.Fatalf("result of model %s in version %q", r.Scope.Model, r.Version)
		}
	}
	if len(runs) != 2 || runs["m7b@20261130_080000"] != 4 || runs["m13b@20261130_080000"] != 4 {
		t.Fatalf("runs by version %v, want 4 for each model", runs)
	}
	seen := map[string]bool{}
	for _, e := range evs {
		if seen[e.ID] {
			t.Fatalf("two results with event id %s", e.ID)
		}
		seen[e.ID] = true
	}
}

// Results without their predictions file are not a run OpenCompass made (it refuses to evaluate
// one): in a run of several datasets that dataset is skipped with the reason and the others
// import; on its own, nothing importable is found.
func TestOpenCompassResultsWithoutPredictionsAreSkipped(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "20261130_080000")
	copyTree(t, filepath.Join("testdata", "opencompass", "20261130_080000"), run)
	// A second dataset whose predictions are missing.
	b, err := os.ReadFile(filepath.Join(run, "results", "m7b", "gsm8k.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(run, "results", "m7b", "math.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	var skipped []string
	evs, err := OpenCompass(dir, Options{Scope: testScope, Skipped: func(file, why string) { skipped = append(skipped, file+": "+why) }})
	if err != nil {
		t.Fatal(err)
	}
	suites := map[string]int{}
	for _, r := range decode(t, evs) {
		suites[r.Suite]++
	}
	if suites["gsm8k"] != 4 || suites["math"] != 0 {
		t.Fatalf("results by suite %v, want gsm8k's 4 and none of math", suites)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "math.json: no predictions (predictions/m7b/math.json)") {
		t.Fatalf("skipped %v", skipped)
	}
	// Without a Skipped callback (an API caller), the run is refused with the same reason.
	if _, err := OpenCompass(dir, Options{Scope: testScope}); err == nil || !strings.Contains(err.Error(), "no predictions") {
		t.Fatalf("without Skipped: %v", err)
	}

}
