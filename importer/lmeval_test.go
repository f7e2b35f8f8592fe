package importer

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

// lmevalOut is the folder lm_eval wrote for these tests (test/lmeval/make_samples.sh, run by
// deploy/local/test.sh), holding part; the test skips without it, except under CI=true.
func lmevalOut(t *testing.T, part string) string {
	t.Helper()
	dir := filepath.Join("..", ".cache", "lmeval-out", part)
	if _, err := os.Stat(dir); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no lm_eval output in %s (deploy/local/test.sh makes it)", dir)
		}
		t.Skipf("no lm_eval output in %s; run test/lmeval/make_samples.sh", dir)
	}
	return dir
}

// lmevalReport is what lm_eval itself says of one task of a run: each doc's value of each metric
// (from the samples file) and each metric's mean (from the results file).
type lmevalReport struct {
	docs  map[string]map[string]float64 // doc_id → metric → value
	means map[string]float64            // "<metric>,none" → value
}

func readLMEvalReport(t *testing.T, dir, task string) lmevalReport {
	t.Helper()
	results, _ := filepath.Glob(filepath.Join(dir, "*", "results_*.json"))
	samples, _ := filepath.Glob(filepath.Join(dir, "*", "samples_"+task+"_*.jsonl"))
	if len(results) != 1 || len(samples) != 1 {
		t.Fatalf("want one results and one %s samples file in %s, got %v %v", task, dir, results, samples)
	}
	var res struct {
		Results map[string]map[string]any `json:"results"`
	}
	b, err := os.ReadFile(results[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	r := lmevalReport{docs: map[string]map[string]float64{}, means: map[string]float64{}}
	for k, v := range res.Results[task] {
		if f, ok := v.(float64); ok {
			r.means[k] = f
		}
	}
	f, err := os.Open(samples[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		vals := map[string]float64{}
		for _, m := range line["metrics"].([]any) {
			vals[m.(string)] = line[m.(string)].(float64)
		}
		r.docs[fmt.Sprint(line["doc_id"])] = vals
	}
	return r
}

// Every doc and repeat of a run lm_eval wrote is a run of its task's suite: the generation task's
// three replies per doc each scored with its exact_match (ignore_case, ignore_punctuation), the
// multiple-choice task's doc by the chosen metric, as lm_eval scored it. Each doc's first run
// has lm_eval's own verdict, and the share of docs whose first run passed is the metric lm_eval
// reports for the task.
func TestLMEvalImportsEveryDocAndRepeat(t *testing.T) {
	dir := lmevalOut(t, "run")
	for _, metric := range []string{"", "acc_norm"} {
		evs, err := LMEval(dir, Options{Scope: testScope, Metric: metric})
		if metric == "acc_norm" {
			// Not a metric of the generation task: it is refused, the other imported.
			var skipped []string
			evs, err = LMEval(dir, Options{Scope: testScope, Metric: metric, Skipped: func(f, why string) { skipped = append(skipped, why) }})
			if len(skipped) != 1 || !strings.Contains(skipped[0], `no metric "acc_norm" (it has exact_match)`) {
				t.Fatalf("skipped %q, want the generation task for having no acc_norm", skipped)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		bySuite := map[string][]schemas.EvalResult{}
		for _, r := range decode(t, evs) {
			bySuite[r.Suite] = append(bySuite[r.Suite], r)
		}
		check := func(task, m string, runs int) {
			t.Helper()
			rs := bySuite[task]
			rep := readLMEvalReport(t, dir, task)
			if len(rs) != len(rep.docs)*runs {
				t.Fatalf("%s: %d results, want %d docs × %d", task, len(rs), len(rep.docs), runs)
			}
			passed := 0
			for c, verdicts := range tally(rs) {
				want := "fail"
				if rep.docs[c][m] == 1 {
					want = "pass"
				}
				if len(verdicts) != runs || verdicts[0] != want {
					t.Errorf("%s doc %s: %v, lm_eval's %s %v", task, c, verdicts, m, rep.docs[c][m])
				}
				if verdicts[0] == "pass" {
					passed++
				}
			}
			if got, want := float64(passed)/float64(len(rep.docs)), rep.means[m+",none"]; got != want {
				t.Errorf("%s: %v of docs passed their first run, lm_eval reports %s %v", task, got, m, want)
			}
			for _, r := range rs {
				if r.Runs != int64(runs) || r.Version != r.Scope.Model+"@"+r.Scope.Run || r.Scope.Workspace != testScope.Workspace {
					t.Fatalf("%s: %+v", task, r)
				}
			}
		}
		if metric == "" {
			check("tiny_qa", "exact_match", 3)
			check("tiny_mc", "acc", 1)
			// The dummy model answers "lol": matched by lol, LOL, lol. and L.O.L once case and
			// punctuation are ignored, not by Paris, 4 or ΛΟΛ.
			want := map[string][]string{"0": {"pass", "pass", "pass"}, "1": {"pass", "pass", "pass"}, "2": {"pass", "pass", "pass"},
				"3": {"fail", "fail", "fail"}, "4": {"pass", "pass", "pass"}, "5": {"fail", "fail", "fail"}, "6": {"fail", "fail", "fail"}}
			for c, v := range tally(bySuite["tiny_qa"]) {
				if !slices.Equal(v, want[c]) {
					t.Errorf("tiny_qa doc %s: %v, want %v", c, v, want[c])
				}
			}
			for _, r := range bySuite["tiny_qa"] {
				if r.Prediction == nil || *r.Prediction != "lol" {
					t.Fatalf("tiny_qa doc %s run %d: prediction %v, want the reply", r.CaseID, r.RunIndex, r.Prediction)
				}
			}
		} else {
			check("tiny_mc", "acc_norm", 1)
		}
	}
}

// editedRun copies the run lm_eval wrote to a temporary folder, with edit applied to each line of
// the samples file of task (a map of the line's JSON), and returns the folder.
func editedRun(t *testing.T, task string, edit func(line map[string]any) bool) string {
	t.Helper()
	src := lmevalOut(t, "run")
	dst := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(src, "*", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(filepath.Base(f), "samples_"+task+"_") {
			var out []string
			for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				var line map[string]any
				if err := json.Unmarshal([]byte(l), &line); err != nil {
					t.Fatal(err)
				}
				if !edit(line) {
					continue
				}
				nb, _ := json.Marshal(line)
				out = append(out, string(nb))
			}
			b = []byte(strings.Join(out, "\n") + "\n")
		}
		p := filepath.Join(dst, filepath.Base(filepath.Dir(f)), filepath.Base(f))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// lm_eval scores only a doc's first reply; the importer scores each of them with the task's
// exact_match. Here the later replies of the real run are changed to texts that match or miss
// under ignore_case and ignore_punctuation.
func TestLMEvalScoresEveryReply(t *testing.T) {
	later := map[float64][2]string{0: {"LOL!", "Paris"}, 3: {"paris.", "lol"}, 5: {"4", " 4"}, 6: {"λολ", "ΛΟΛ"}}
	dir := editedRun(t, "tiny_qa", func(line map[string]any) bool {
		if l, ok := later[line["doc_id"].(float64)]; ok {
			r := line["resps"].([]any)[0].([]any)
			r[1], r[2] = l[0], l[1]
		}
		return true
	})
	evs, err := LMEval(dir, Options{Scope: testScope})
	if err != nil {
		t.Fatal(err)
	}
	got := tally(slices.DeleteFunc(decode(t, evs), func(r schemas.EvalResult) bool { return r.Suite != "tiny_qa" }))
	want := map[string][]string{"0": {"pass", "pass", "fail"}, "3": {"fail", "pass", "fail"}, "5": {"fail", "pass", "fail"}, "6": {"fail", "pass", "pass"}}
	for c, w := range want {
		if !slices.Equal(got[c], w) {
			t.Errorf("doc %s: %v, want %v", c, got[c], w)
		}
	}
}

// What cannot be imported as lm_eval scored it is refused with the reason, the run's other tasks
// imported: a first reply whose verdict is not lm_eval's, a samples file missing docs the results
// counted, and a run made without --log_samples.
func TestLMEvalRefusesWhatItCannotReproduce(t *testing.T) {
	cases := []struct {
		name, why string
		dir       func(t *testing.T) string
	}{
		{"a verdict not lm_eval's", "lm_eval's exact_match of its first reply is 0, repeatrate's is 1", func(t *testing.T) string {
			return editedRun(t, "tiny_qa", func(line map[string]any) bool {
				if line["doc_id"].(float64) == 0 {
					line["exact_match"] = 0.0
				}
				return true
			})
		}},
		{"a partial samples file", "6 docs have samples with the filter \"none\", the results say 7 were evaluated", func(t *testing.T) string {
			return editedRun(t, "tiny_qa", func(line map[string]any) bool { return line["doc_id"].(float64) != 4 })
		}},
		{"no --log_samples", "run lm_eval with --log_samples", func(t *testing.T) string { return lmevalOut(t, "nosamples") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var skipped []string
			evs, err := LMEval(c.dir(t), Options{Scope: testScope, Skipped: func(f, why string) { skipped = append(skipped, filepath.Base(f)+": "+why) }})
			if err != nil {
				t.Fatal(err)
			}
			if len(skipped) == 0 || !strings.Contains(skipped[0], c.why) {
				t.Fatalf("skipped %q, want one saying %q", skipped, c.why)
			}
			if c.name != "no --log_samples" && len(evs) == 0 {
				t.Fatal("the run's other task was not imported")
			}
		})
	}
}

// pyLower is Python's str.lower (what lm_eval's ignore_case applies through numpy), checked
// against the python3 on the machine.
func TestPythonLower(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	texts := []string{"LOL", "İstanbul", "ΟΔΟΣ", "ΟΔΟΣ.", "Σ", "ΑΣ Β", "Α'Σ", "ΑΣ'Β", "ΑΣ\u0301", "\u0301Σ", "ÀÉÎ", "ǅ", "ẞ", "Ⅻ", "ℌ", "K", "ᾼ", "ΣΑΣ:Σ", "aΣ·b", "Ω", "x\u00adΣ"}
	in, _ := json.Marshal(texts)
	out, err := exec.Command(py, "-c", "import json,sys; print(json.dumps([s.lower() for s in json.loads(sys.argv[1])]))", string(in)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	for i, s := range texts {
		if got := pyLower(s); got != want[i] {
			t.Errorf("lower(%q) = %q, Python %q", s, got, want[i])
		}
	}
}
