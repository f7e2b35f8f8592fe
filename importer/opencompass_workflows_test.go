package importer

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
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

// fixtureRun copies the fixture's run (testdata/opencompass) into a new work directory and
// returns the work directory, its run directory, and a writer of files in that run.
func fixtureRun(t *testing.T) (dir, run string, write func(rel, body string)) {
	t.Helper()
	dir = t.TempDir()
	run = filepath.Join(dir, "20261130_080000")
	copyTree(t, filepath.Join("testdata", "opencompass", "20261130_080000"), run)
	return dir, run, func(rel, body string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(run, rel), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Two models evaluated in one OpenCompass run share its directory's timestamp
// (results/<model>/<dataset>.json for each): each is a version of its own and every run of both
// imports (before, the second model's runs were dropped as the same runs of the same version).
func TestOpenCompassModelsOfOneRunAreVersionsOfTheirOwn(t *testing.T) {
	dir, run, _ := fixtureRun(t)
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
	dir, run, _ := fixtureRun(t)
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

// format_details (openicl_eval.py) writes the details of an evaluator that gives none of its own
// (AccEvaluator, the usual one for multiple-choice datasets) as an object of entries by index
// beside "type": GEN entries with the prediction and reference texts and no correct flag, PPL
// entries with one. Both import (a GEN example correct when its prediction is its reference, as
// AccEvaluator counts), and a results file that cannot be read is skipped with the reason, the
// run's other datasets imported (before, one such file aborted the whole directory).
func TestOpenCompassFormatDetailsImport(t *testing.T) {
	dir, _, write := fixtureRun(t)
	// As format_details writes them (results[str(i)] = {...}; results['type'] = 'GEN' or 'PPL').
	write("results/m7b/mmlu.json", `{"accuracy": 50.0, "details": {"type": "GEN",
		"0": {"prompt": "Q0", "origin_prediction": "The answer is A", "predictions": "A", "references": "A"},
		"1": {"prompt": "Q1", "origin_prediction": "The answer is C", "predictions": "C", "references": "B"}}}`)
	write("predictions/m7b/mmlu.json", `{"0": {"origin_prompt": "Q0", "prediction": "The answer is A", "gold": "A"},
		"1": {"origin_prompt": "Q1", "prediction": "The answer is C", "gold": "B"}}`)
	write("results/m7b/piqa.json", `{"accuracy": 50.0, "details": {"type": "PPL",
		"0": {"origin_prediction": {"A": {"prompt": "p", "PPL": 1.2}}, "predictions": "A", "references": "A", "correct": true},
		"1": {"origin_prediction": {"A": {"prompt": "p", "PPL": 3.4}}, "predictions": "A", "references": "B", "correct": false}}}`)
	write("predictions/m7b/piqa.json", `{"0": {"label: A": {"testing input": "t", "prompt": "p", "PPL": 1.2}, "prediction": "A", "gold": "A"},
		"1": {"label: A": {"testing input": "t", "prompt": "p", "PPL": 3.4}, "prediction": "A", "gold": "B"}}`)
	write("results/m7b/broken.json", `{"details": "not details"}`)
	write("predictions/m7b/broken.json", `{"0": {"prediction": "x"}}`)
	var skipped []string
	evs, err := OpenCompass(dir, Options{Scope: testScope, Skipped: func(file, why string) { skipped = append(skipped, file+": "+why) }})
	if err != nil {
		t.Fatal(err)
	}
	bySuite := map[string]map[string][]string{}
	for _, r := range decode(t, evs) {
		if bySuite[r.Suite] == nil {
			bySuite[r.Suite] = map[string][]string{}
		}
		bySuite[r.Suite][r.CaseID] = append(bySuite[r.Suite][r.CaseID], r.Result)
	}
	for suite, want := range map[string]map[string][]string{
		"mmlu": {"0": {"pass"}, "1": {"fail"}},
		"piqa": {"0": {"pass"}, "1": {"fail"}},
	} {
		for c, w := range want {
			if got := bySuite[suite][c]; len(got) != len(w) || got[0] != w[0] {
				t.Errorf("%s case %s: %v, want %v", suite, c, got, w)
			}
		}
	}
	if len(bySuite["gsm8k"]) != 2 || len(bySuite["broken"]) != 0 {
		t.Fatalf("suites imported: %v", bySuite)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "broken.json: details is a string, not what OpenCompass writes there") || strings.Contains(skipped[0], "importer.") {
		t.Fatalf("skipped %v, want broken.json with its reason", skipped)
	}
}

// --model over the files of several models is refused, naming them: it would merge their runs into
// one model's, each case's runs of one replacing the other's (and, with the same ids, one id would
// stand for two predictions).
func TestModelOverrideOverSeveralModelsIsRefused(t *testing.T) {
	dir, run, _ := fixtureRun(t)
	for _, part := range []string{"results", "predictions"} {
		copyTree(t, filepath.Join(run, part, "m7b"), filepath.Join(run, part, "m13b"))
	}
	opt := Options{Scope: testScope}
	opt.Scope.Model = "shared"
	if _, err := OpenCompass(dir, opt); err == nil || !strings.Contains(err.Error(), "2 models (m13b, m7b)") {
		t.Fatalf("--model over two OpenCompass models: %v", err)
	}
	if _, err := Inspect(inspectLogs(t, "models"), opt); err == nil || !strings.Contains(err.Error(), "mockllm/model, mockllm/other") {
		t.Fatalf("--model over two Inspect models: %v", err)
	}
	// Over one model's files it renames, as before.
	one := filepath.Join(t.TempDir(), "20261130_080000")
	copyTree(t, filepath.Join("testdata", "opencompass", "20261130_080000"), one)
	if evs, err := OpenCompass(filepath.Dir(one), opt); err != nil || len(evs) != 4 {
		t.Fatalf("--model over one model: %d events, %v", len(evs), err)
	}
}

// A dataset run n > 1 times under AccEvaluator: evaluate names the metric "accuracy (n runs
// average)", and format_details writes an entry per prediction (the dataset repeated n times), so
// entry i is replica i / size of example i % size — 2 examples × 2 runs, not 4 examples of one run.
// And what cannot be read is said in the user's terms, never with Go type names.
func TestOpenCompassFormatDetailsOfRepeatedRuns(t *testing.T) {
	dir, _, write := fixtureRun(t)
	write("results/m7b/mmlu.json", `{"accuracy (2 runs average)": 50.0, "details": {"type": "GEN",
		"0": {"prompt": "Q0", "predictions": "A", "references": "A"},
		"1": {"prompt": "Q1", "predictions": "C", "references": "B"},
		"2": {"prompt": "Q0", "predictions": "B", "references": "A"},
		"3": {"prompt": "Q1", "predictions": "B", "references": "B"}}}`)
	write("predictions/m7b/mmlu.json", `{"0": {"prediction": "A"}, "1": {"prediction": "C"}, "2": {"prediction": "B"}, "3": {"prediction": "B"}}`)
	write("results/m7b/arr.json", `{"accuracy": 1, "details": [{"correct": true}]}`)
	write("predictions/m7b/arr.json", `[{"prediction": "x"}]`)
	write("results/m7b/listbad.json", `{"details": [{"correct": true}, "oops"]}`)
	write("predictions/m7b/listbad.json", `{"0": {"prediction": "x"}, "1": {"prediction": "y"}}`)
	var skipped []string
	evs, err := OpenCompass(dir, Options{Scope: testScope, Skipped: func(file, why string) { skipped = append(skipped, filepath.Base(file)+": "+why) }})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, r := range decode(t, evs) {
		if r.Suite == "mmlu" {
			if r.Runs != 2 {
				t.Fatalf("mmlu run %+v: want runs 2", r)
			}
			for int64(len(got[r.CaseID])) <= r.RunIndex {
				got[r.CaseID] = append(got[r.CaseID], "")
			}
			got[r.CaseID][r.RunIndex] = r.Result
		}
	}
	if !slices.Equal(got["0"], []string{"pass", "fail"}) || !slices.Equal(got["1"], []string{"fail", "pass"}) || len(got) != 2 {
		t.Fatalf("mmlu: %v, want 0: pass, fail and 1: fail, pass", got)
	}
	slices.Sort(skipped)
	if len(skipped) != 2 || !strings.Contains(skipped[0], "arr.json: arr.json (predictions: an object of records by index) is an array") ||
		!strings.Contains(skipped[1], "listbad.json: an entry of details is a string") {
		t.Fatalf("skipped %q", skipped)
	}
	for _, s := range skipped {
		if strings.Contains(s, "Go value") || strings.Contains(s, "importer.") || strings.Contains(s, "map[") {
			t.Errorf("a reason in Go's terms: %s", s)
		}
	}
}

// Progress is told after each file how many results were made and how many files of all were
// read, ending at all of them: what `import` shows on a terminal.
func TestImportReportsProgress(t *testing.T) {
	dir, _, write := fixtureRun(t)
	write("results/m7b/second.json", `{"details": [{"correct": [true, false]}]}`)
	write("predictions/m7b/second.json", `{"0": {"prediction": "a"}, "1": {"prediction": "b"}}`)
	var seen [][3]int
	evs, err := OpenCompass(dir, Options{Scope: testScope, Progress: func(results, done, total int) { seen = append(seen, [3]int{results, done, total}) }})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) == 0 || seen[len(seen)-1] != [3]int{len(evs), 2, 2} {
		t.Fatalf("progress %v, want it to end at %d results, 2 of 2 files", seen, len(evs))
	}
	for i := 1; i < len(seen); i++ {
		if seen[i][0] < seen[i-1][0] || seen[i][1] < seen[i-1][1] || seen[i][2] != 2 {
			t.Fatalf("progress went back or changed its total: %v", seen)
		}
	}
	var inspectSeen [][3]int
	if _, err := Inspect(inspectLogs(t, "models"), Options{Scope: testScope, Progress: func(r, d, n int) { inspectSeen = append(inspectSeen, [3]int{r, d, n}) }}); err != nil {
		t.Fatal(err)
	}
	if last := inspectSeen[len(inspectSeen)-1]; last != [3]int{12, 2, 2} {
		t.Fatalf("Inspect progress %v, want it to end at 12 results, 2 of 2 files", inspectSeen)
	}
}

// A prediction's res_length (the reply's length in tokens as the model counted it, a list of one
// count per round for a multi-round prediction) is the result's reply_tokens, a list summed as
// OpenCompass's repeat analysis sums it; a record without one has none; a res_length that is no
// count skips the dataset saying so.
func TestOpenCompassResLengthIsReplyTokens(t *testing.T) {
	dir, _, write := fixtureRun(t)
	write("predictions/m7b/gsm8k.json", `{"0": {"prediction": "4", "res_length": 12},
 "1": {"prediction": ["7", "and then 7"], "res_length": [3, 4]},
 "2": {"prediction": "4", "res_length": null},
 "3": {"prediction": "6"}}`)
	evs, err := OpenCompass(dir, Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	// A list whose sum is whole counts, as sum() gives it: [1.5, 1.5] is 3.
	write("predictions/m7b/gsm8k.json", `{"0": {"prediction": "4", "res_length": [1.5, 1.5]}}`)
	if three, err := OpenCompass(dir, Options{Scope: testScope}); err != nil || len(three) == 0 || decode(t, three)[0].ReplyTokens == nil || *decode(t, three)[0].ReplyTokens != 3 {
		t.Fatalf("res_length [1.5, 1.5]: %v, want reply_tokens 3", err)
	}
	got := map[string]string{}
	for _, r := range decode(t, evs) {
		v := "none"
		if r.ReplyTokens != nil {
			v = fmt.Sprint(*r.ReplyTokens)
		}
		got[fmt.Sprint(r.CaseID, "/", r.RunIndex)] = v
	}
	// The fixture's dataset ran twice over two examples: prediction i is replica i / 2 of example i % 2.
	want := map[string]string{"0/0": "12", "1/0": "7", "0/1": "none", "1/1": "none"}
	if !maps.Equal(got, want) {
		t.Fatalf("reply_tokens by case/run %v, want %v", got, want)
	}
	for _, bad := range []string{`-1`, `1.5`, `"12"`, `[3, "x"]`, `3000000000`, `[5, null]`, `[null]`, `true`} {
		write("predictions/m7b/gsm8k.json", `{"0": {"prediction": "4", "res_length": `+bad+`}}`)
		var skipped []string
		if _, err := OpenCompass(dir, Options{Scope: testScope, Skipped: func(f, why string) { skipped = append(skipped, why) }}); err != nil {
			t.Fatal(err)
		}
		if len(skipped) != 1 || !strings.Contains(skipped[0], "res_length") {
			t.Errorf("res_length %s: skipped %q, want the dataset skipped naming res_length", bad, skipped)
		}
	}
}
