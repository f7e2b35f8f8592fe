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
	"unicode/utf8"

	"github.com/repeatrate/repeatrate/internal/testenv"
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
// the samples file of task (a map of the line's JSON; false drops the line), and returns the folder.
func editedRun(t *testing.T, task string, edit func(line map[string]any) bool) string {
	t.Helper()
	return editedRunConfig(t, nil, task, edit)
}

// editedRunConfig is editedRun with editResults applied to the results file's JSON too.
func editedRunConfig(t *testing.T, editResults func(res map[string]any), task string, edit func(line map[string]any) bool) string {
	t.Helper()
	src := lmevalOut(t, "run")
	dst := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(src, "*", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		switch name := filepath.Base(f); {
		case strings.HasPrefix(name, "samples_"+task+"_") && edit != nil:
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
		case strings.HasPrefix(name, "results_") && editResults != nil:
			var res map[string]any
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatal(err)
			}
			editResults(res)
			b, _ = json.Marshal(res)
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

// taskConfig returns the config of task in a results file's JSON.
func taskConfig(res map[string]any, task string) map[string]any {
	return res["configs"].(map[string]any)[task].(map[string]any)
}

// lm_eval scores only a doc's first reply; the importer scores each of them with the task's
// exact_match. Here the later replies of the real run are changed to texts that match or miss
// under ignore_case and ignore_punctuation.
func TestLMEvalScoresEveryReply(t *testing.T) {
	later := map[float64][2]string{0: {"LOL!", "Paris"}, 3: {"paris.", "lol"}, 4: {"lol\x00", "l.o.l\x00\x00"}, 5: {"4", " 4"}, 6: {"λολ", "ΛΟΛ"}}
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
	// numpy drops trailing NULs: "lol\x00" is "lol".
	want := map[string][]string{"0": {"pass", "pass", "fail"}, "3": {"fail", "pass", "fail"}, "4": {"pass", "pass", "pass"},
		"5": {"fail", "pass", "fail"}, "6": {"fail", "pass", "pass"}}
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
		// Scoring repeatrate does not reproduce exactly, so the later replies' verdicts could not be
		// lm_eval's: refused rather than guessed.
		{"a list of targets, as lm_eval writes it", "reads as a list of targets", func(t *testing.T) string {
			return editedRun(t, "tiny_qa", func(line map[string]any) bool {
				if line["doc_id"].(float64) == 0 {
					line["target"] = "['lol', 'LOL']"
				}
				return true
			})
		}},
		{"the task's own process_results", "its own process_results", func(t *testing.T) string {
			return editedRunConfig(t, func(res map[string]any) {
				taskConfig(res, "tiny_qa")["process_results"] = "def process_results(doc, results): ..."
			}, "tiny_qa", nil)
		}},
		{"a filter named none that changes the replies", "changes the replies before scoring", func(t *testing.T) string {
			return editedRunConfig(t, func(res map[string]any) {
				taskConfig(res, "tiny_qa")["filter_list"] = []any{map[string]any{"name": "none", "filter": []any{
					map[string]any{"function": "regex", "regex_pattern": "([a-z]+)"}, map[string]any{"function": "take_first"}}}}
			}, "tiny_qa", nil)
		}},
		{"a regex Python reads differently", `uses "\\w"`, func(t *testing.T) string {
			return editedRunConfig(t, func(res map[string]any) {
				taskConfig(res, "tiny_qa")["metric_list"].([]any)[0].(map[string]any)["regexes_to_ignore"] = []any{`\w+$`}
			}, "tiny_qa", nil)
		}},
		{"the options of the last exact_match entry", "lm_eval's exact_match of its first reply is 1.0, repeatrate's is 0", func(t *testing.T) string {
			return editedRunConfig(t, func(res map[string]any) {
				c := taskConfig(res, "tiny_qa")
				c["metric_list"] = append(c["metric_list"].([]any), map[string]any{"metric": "exact_match"})
			}, "tiny_qa", nil)
		}},
		{"no metric_list: lm_eval's default exact_match, without options", "lm_eval's exact_match of its first reply is 1.0, repeatrate's is 0", func(t *testing.T) string {
			return editedRunConfig(t, func(res map[string]any) { delete(taskConfig(res, "tiny_qa"), "metric_list") }, "tiny_qa", nil)
		}},
		{"a metric that is no per-doc score", "not a per-doc score", func(t *testing.T) string {
			return editedRun(t, "tiny_mc", func(line map[string]any) bool {
				line["acc"] = []any{1, 0}
				return true
			})
		}},
		{"an unreadable task config", "its config in the results file", func(t *testing.T) string {
			return editedRunConfig(t, func(res map[string]any) {
				taskConfig(res, "tiny_qa")["repeats"] = "three"
			}, "tiny_qa", nil)
		}},
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
			if c.name != "no --log_samples" && len(skipped) != 1 {
				t.Fatalf("skipped %q, want only the task concerned", skipped)
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
	want := pythonMap(t, py, "s.lower()", texts)
	for i, s := range texts {
		if got := pyLower(s); got != want[i] {
			t.Errorf("lower(%q) = %q, Python %q", s, got, want[i])
		}
	}
}

// Python's json writes NaN for a float that is not a number (a doc field lm_eval copies from a
// dataset, or a metric it could not compute): the samples file still imports, and a doc whose
// value is NaN is unscored (an error result), the others lm_eval's.
func TestLMEvalReadsPythonsNaN(t *testing.T) {
	dir := editedRun(t, "tiny_mc", func(line map[string]any) bool {
		line["doc"].(map[string]any)["weight"] = "@NaN@"
		if line["doc_id"].(float64) == 2 {
			line["acc"] = "@NaN@"
		}
		return true
	})
	files, _ := filepath.Glob(filepath.Join(dir, "*", "samples_tiny_mc_*.jsonl"))
	b, _ := os.ReadFile(files[0])
	if err := os.WriteFile(files[0], []byte(strings.ReplaceAll(string(b), `"@NaN@"`, "NaN")), 0o644); err != nil {
		t.Fatal(err)
	}
	evs, err := LMEval(dir, Options{Scope: testScope, Skipped: func(f, why string) { t.Errorf("skipped %s: %s", f, why) }})
	if err != nil {
		t.Fatal(err)
	}
	rep := readLMEvalReport(t, lmevalOut(t, "run"), "tiny_mc")
	for c, v := range tally(slices.DeleteFunc(decode(t, evs), func(r schemas.EvalResult) bool { return r.Suite != "tiny_mc" })) {
		want := "fail"
		if rep.docs[c]["acc"] == 1 {
			want = "pass"
		}
		if c == "2" {
			want = "error"
		}
		if len(v) != 1 || v[0] != want {
			t.Errorf("doc %s: %v, want %s", c, v, want)
		}
	}
}

// lm_eval lowers with numpy's char.lower, which cuts Python's str.lower to the array's width
// (İ lowers to two code points), and numpy drops trailing NULs; npLower is checked against numpy.
func TestNumpyLower(t *testing.T) {
	py := testenv.PythonVenv(t)
	texts := []string{"LOL", "Aİ", "İİx", "lol\x00", "ΟΔΟΣ", "ǅ", "\x00a\x00", "ẞ", "İ\x00", "İ\x00\x00x"}
	want := pythonMap(t, py, "np.char.lower(np.asarray([s])).tolist()[0]", texts)
	for i, s := range texts {
		// An element is read without its trailing NULs; the array's width counts them.
		if got := npLower(strings.TrimRight(s, "\x00"), utf8.RuneCountInString(s)); got != want[i] {
			t.Errorf("np.char.lower(%q) = %q, npLower %q", s, want[i], got)
		}
	}
}

// More than one run under a folder: --run would make their docs the same runs, so it is refused
// (as --model over several models is).
func TestLMEvalRunOverSeveralRunsRefused(t *testing.T) {
	dir := lmevalOut(t, "run")
	two := t.TempDir()
	for i, d := range []string{"a", "b"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			name := strings.Replace(filepath.Base(f), ".", fmt.Sprintf(".%d", i), 1) // another date
			os.MkdirAll(filepath.Join(two, d), 0o755)
			os.WriteFile(filepath.Join(two, d, name), b, 0o644)
		}
	}
	if _, err := LMEval(two, Options{Scope: testScope}); err != nil {
		t.Fatalf("two runs: %v", err)
	}
	sc := testScope
	sc.Run = "r1"
	if _, err := LMEval(two, Options{Scope: sc}); err == nil || !strings.Contains(err.Error(), "--run") {
		t.Fatalf("--run over two runs: %v, want refused", err)
	}
}

// lm_eval --output_path x.json writes x_<date>.json beside the samples files: a folder or that file
// imports as a model folder does.
func TestLMEvalOutputPathNamedFile(t *testing.T) {
	dir := t.TempDir()
	files, _ := filepath.Glob(filepath.Join(lmevalOut(t, "run"), "*", "*"))
	var named string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		name := filepath.Base(f)
		if strings.HasPrefix(name, "results_") {
			name = "my" + strings.TrimPrefix(name, "results")
			named = filepath.Join(dir, name)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, in := range []string{dir, named} {
		evs, err := LMEval(in, Options{Scope: testScope})
		if err != nil || len(evs) != 7*3+6 {
			t.Fatalf("%s: %d results, %v; want 27", in, len(evs), err)
		}
	}
}

// pythonMap returns expr (of s) for each of texts, as the Python at py computes it.
func pythonMap(t *testing.T, py, expr string, texts []string) []string {
	t.Helper()
	in, _ := json.Marshal(texts)
	prog := "import json, sys\ntry:\n    import numpy as np\nexcept ImportError:\n    pass\nprint(json.dumps([" + expr + " for s in json.loads(sys.argv[1])]))"
	out, err := exec.Command(py, "-c", prog, string(in)).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(texts) {
		t.Fatalf("python: %v %s", err, out)
	}
	return got
}

// exactMatch agrees with lm_eval's own exact_match_hf_evaluate (its venv's Python and numpy), as
// process_results calls it for one reply and one target, on the options and texts where Python,
// numpy and a plain reading part ways: trailing NULs with and without arrays, lowering that
// grows past the width, regexes applied in turn; and the regexes it cannot apply as Python's re
// does are refused.
func TestExactMatchIsLMEvals(t *testing.T) {
	py := filepath.Join("..", ".cache", "lmeval-venv", "bin", "python")
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no lm_eval venv at %s (test/lmeval/make_samples.sh makes it)", py)
		}
		t.Skipf("no lm_eval venv at %s; run test/lmeval/make_samples.sh", py)
	}
	type opts = map[string]any
	cases := []struct {
		Opts          opts   `json:"opts"`
		Reply, Target string `json:"-"`
		R             string `json:"reply"`
		T             string `json:"target"`
	}{
		{Opts: opts{}, R: "lol", T: "lol"},
		{Opts: opts{}, R: "x\x00", T: "x"},
		{Opts: opts{"regexes_to_ignore": []string{}}, R: "x\x00", T: "x"},
		{Opts: opts{"ignore_case": true}, R: "x\x00", T: "X"},
		{Opts: opts{"ignore_case": true}, R: "İ\x00", T: "i\u0307"},
		{Opts: opts{"ignore_case": true}, R: "Aİ", T: "ai"},
		{Opts: opts{"ignore_case": true}, R: "ΟΔΟΣ", T: "οδος"},
		{Opts: opts{"ignore_punctuation": true}, R: "L.O.L!", T: "lol"},
		{Opts: opts{"ignore_case": true, "ignore_punctuation": true}, R: "L.O.L!", T: "lol"},
		{Opts: opts{"ignore_numbers": true}, R: "abc123", T: "abc"},
		{Opts: opts{"ignore_numbers": true}, R: "abc١٢", T: "abc"},
		{Opts: opts{"regexes_to_ignore": []string{"[$]"}}, R: "$100", T: "100"},
		{Opts: opts{"regexes_to_ignore": []string{"x*"}}, R: "axxbx", T: "ab"},
		{Opts: opts{"regexes_to_ignore": []string{"^ +", " +$"}}, R: "  lol  ", T: "lol"},
		{Opts: opts{"regexes_to_ignore": []string{`\d`}}, R: "a1b2", T: "ab"},
		{Opts: opts{"regexes_to_ignore": []string{"q"}, "ignore_case": true}, R: "İ\x00q", T: "i\u0307"},
		{Opts: opts{"regexes_to_ignore": []string{"q", "x"}}, R: "x\x00q", T: ""},
		{Opts: opts{"regexes_to_ignore": []string{"a.c"}}, R: "a\nc", T: "a\nc"},
	}
	for i := range cases {
		cases[i].Reply, cases[i].Target = cases[i].R, cases[i].T
	}
	in, _ := json.Marshal(cases)
	prog := `import json, sys
from lm_eval.api.metrics import exact_match_hf_evaluate
print(json.dumps([float(exact_match_hf_evaluate(predictions=[c["reply"]], references=[c["target"]], **c["opts"])["exact_match"]) for c in json.loads(sys.argv[1])]))`
	out, err := exec.Command(py, "-c", prog, string(in)).Output()
	if err != nil {
		t.Fatalf("lm_eval: %v", err)
	}
	var want []float64
	if err := json.Unmarshal(out, &want); err != nil || len(want) != len(cases) {
		t.Fatalf("lm_eval: %v %s", err, out)
	}
	for i, c := range cases {
		b, _ := json.Marshal(c.Opts)
		var m lmMetric
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		em, err := newExactMatch(m)
		if err != nil {
			t.Fatalf("%v: %v", c.Opts, err)
		}
		got, err := em.match(c.Reply, []string{c.Target})
		if err != nil {
			t.Fatal(err)
		}
		if btof(got) != want[i] {
			t.Errorf("options %s, reply %q, target %q: %v, lm_eval %v", b, c.Reply, c.Target, btof(got), want[i])
		}
	}
	for _, re := range []string{`[$]*|,`, `.*?`, `a??`, `(?:)|a`, `[a-z-[aeiou]]`, `[[:alpha:]]`, `\w+`, `x{,3}`, `(?P<c>x)(?P=c)`, `l\Z`} {
		if _, err := newExactMatch(lmMetric{Metric: "exact_match", RegexesToIgnore: []string{re}, RegexesGiven: true}); err == nil {
			t.Errorf("regex %q accepted; Python's re applies it differently", re)
		}
	}
}
