package suite

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// A harness's own count of a reply's tokens (reply_tokens, OpenCompass's res_length) is the
// reply's length, as OpenCompass's analysis takes it: the mean, percentiles and the 75th-percentile
// gate on abnormal replies of a version read it, while the rules still read the text. Checked
// against OpenCompass's own code (test/opencompass/gate.py) on a version whose looping replies
// carry counts on both sides of the gate, some replies without a count.
func TestOpenCompassGateTakesResLength(t *testing.T) {
	py := testenv.PythonVenv(t)
	r := rand.New(rand.NewPCG(7, 11))
	type rec struct {
		Text      string `json:"text"`
		ResLength *int64 `json:"res_length"`
	}
	var recs []rec
	for i := range 60 {
		var words []string
		if i%3 == 0 { // a loop OpenCompass's rules find
			pat := make([]string, 32)
			for j := range pat {
				pat[j] = fmt.Sprint("w", r.IntN(9))
			}
			for range 30 + r.IntN(20) {
				words = append(words, pat...)
			}
		} else {
			for range 20 + r.IntN(300) {
				words = append(words, fmt.Sprint("p", r.IntN(1000)))
			}
		}
		x := rec{Text: strings.Join(words, " ")}
		if i%5 != 4 { // most replies carry a count, unrelated to their text's length
			n := int64(r.IntN(2000))
			x.ResLength = &n
		}
		recs = append(recs, x)
	}
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.json"), filepath.Join(dir, "out.json")
	b, _ := json.Marshal(recs)
	if err := os.WriteFile(in, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(py, filepath.Join("..", "..", "test", "opencompass", "gate.py"), in, out).CombinedOutput(); err != nil {
		t.Fatalf("gate.py: %v\n%s", err, b)
	}
	var want struct {
		Mean, P75, P90 float64
		Abnormal       int
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}

	cfg := Config{ReplyMode: ReplyOpenCompass}
	cfg.Validate()
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	var runs []RunEntry
	for i, x := range recs {
		e := schemas.EvalResult{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"},
			Suite: "s", CaseID: fmt.Sprint(i), Version: "v", VersionSeq: 1, Runs: 1, Result: schemas.ResultPass,
			Prediction: &x.Text, ReplyTokens: x.ResLength, OccurredAt: at, AssessedAt: at}
		o := FromEvalRun(&e, cfg.ReplyMode)
		runs = append(runs, RunEntry{Key: o.Key, Record: o.Record})
	}
	s := Stability(Key{"w", "s"}, "v", runs, cfg, at)
	if s.ReplyLength.Count != len(recs) || math.Abs(*s.ReplyLength.Mean-want.Mean) > 1e-9 || *s.ReplyLength.P75 != want.P75 ||
		*s.ReplyLength.P90 != want.P90 || s.AbnormalSamples != want.Abnormal {
		t.Fatalf("replies %d, mean %v p75 %v p90 %v, abnormal %d; OpenCompass: mean %v p75 %v p90 %v, abnormal %d",
			s.ReplyLength.Count, *s.ReplyLength.Mean, *s.ReplyLength.P75, *s.ReplyLength.P90, s.AbnormalSamples,
			want.Mean, want.P75, want.P90, want.Abnormal)
	}
	if want.Abnormal == 0 || want.Abnormal == len(recs)/3 {
		t.Fatalf("OpenCompass finds %d abnormal of the %d loops: the gate must keep some and drop some", want.Abnormal, len(recs)/3)
	}
}
