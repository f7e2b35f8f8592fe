package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/repeatrate/repeatrate/schemas"
)

// The lm-evaluation-harness example of docs/feeding.md runs as written from the repository root:
// lm_eval (the venv test/lmeval/make_samples.sh makes) writes its output, and `repeatrate import
// lm-eval` turns it into one eval result per doc and repeat, as many as lm_eval evaluated.
func TestLMEvalExampleFromTheDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs lm_eval and builds the binary")
	}
	root, example := feedingExample(t, "### lm-evaluation-harness")
	venv := filepath.Join(root, ".cache", "lmeval-venv", "bin")
	if _, err := os.Stat(filepath.Join(venv, "lm_eval")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no lm_eval in %s (test/lmeval/make_samples.sh installs it)", venv)
		}
		t.Skipf("no lm_eval in %s; run test/lmeval/make_samples.sh", venv)
	}
	tmp := t.TempDir()
	script := strings.ReplaceAll(example, "lm-out/", filepath.Join(tmp, "lm-out")+"/")
	script = strings.ReplaceAll(script, "results.ndjson", filepath.Join(tmp, "results.ndjson"))
	bin := buildBinary(t)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+venv+":"+filepath.Dir(bin)+":"+os.Getenv("PATH"), "HF_HOME="+filepath.Join(tmp, "hf"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the docs' example: %v\n%s", err, out)
	}
	// As many results as lm_eval's samples files hold docs times replies.
	want := 0
	samples, _ := filepath.Glob(filepath.Join(tmp, "lm-out", "*", "samples_*.jsonl"))
	for _, f := range samples {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			var line struct{ Resps [][]any }
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(f, "tiny_qa") {
				want += len(line.Resps[0])
			} else {
				want++
			}
		}
	}
	f, err := os.Open(filepath.Join(tmp, "results.ndjson"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ce struct{ Data schemas.EvalResult }
		if err := json.Unmarshal(sc.Bytes(), &ce); err != nil {
			t.Fatal(err)
		}
		if ce.Data.Scope.Workspace != "acme" || ce.Data.Result == schemas.ResultError {
			t.Fatalf("result %+v", ce.Data)
		}
		got++
	}
	if len(samples) != 2 || got != want {
		t.Fatalf("%d results from %d samples files, want %d (docs × replies)", got, len(samples), want)
	}
}
