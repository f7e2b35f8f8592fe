package importer

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/repeatrate/repeatrate/internal/testenv"
)

// predictionCases are predictions as OpenCompass's inferencers write them and as users' own
// post-processors leave them: plain text, multi-round turns, nested lists, records with a
// "prediction" member, other objects (keys out of order, non-ASCII, escapes), numbers of every
// form, booleans and null.
var predictionCases = []string{
	`"plain answer"`, `""`, `"é ✓ 😀 \u0001 \"q\" \\"`,
	`["turn one", "turn two", "turn three"]`, `[]`, `[["a", "b"], "c"]`, `[null, "x"]`,
	`{"prediction": "inner"}`, `{"prediction": ["t1", "t2"]}`, `{"prediction": null}`,
	`{"b": 1, "a": "é\n\"x\"", "c": [true, false, null, 1.0, 0.1, 1e20, 1.5e-7, 100000000000000000000, -0.0]}`,
	`{"z": {"y": {"x": [1, 2.50]}}, "A": "\t\u001f", "ä": 1, "b": "<&>"}`,
	`3`, `-7`, `2.5`, `1.0`, `1e16`, `1e15`, `123456789012345678`, `0.0001`, `0.00001`, `-1.5e300`,
	`true`, `false`, `null`, `-0`, `-0.0`, `1e400`, `-1e400`, `1e-400`, `9007199254740993`,
	`{"a": -0, "b": 1e400, "c": -1e400}`,
}

// The text of each prediction is the one OpenCompass's own _prediction_to_text makes of it
// (test/opencompass/prediction_text.py runs that function from the installed opencompass), so
// repeatrate's opencompass mode reads the same replies as OpenCompass's checks: a multi-round
// prediction's turns joined by newlines, not its JSON.
func TestOpenCompassPredictionText(t *testing.T) {
	py := testenv.PythonVenv(t)
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.json"), filepath.Join(dir, "out.json")
	raw := make([]json.RawMessage, len(predictionCases))
	for i, c := range predictionCases {
		raw[i] = json.RawMessage(c)
	}
	b, _ := json.Marshal(raw)
	if err := os.WriteFile(in, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(py, filepath.Join("..", "test", "opencompass", "prediction_text.py"), in, out).CombinedOutput(); err != nil {
		t.Fatalf("prediction_text.py: %v\n%s", err, b)
	}
	var oracle struct {
		OpenCompass string   `json:"opencompass"`
		Texts       []string `json:"texts"`
	}
	b, err := os.ReadFile(out)
	if err != nil || json.Unmarshal(b, &oracle) != nil || len(oracle.Texts) != len(predictionCases) {
		t.Fatalf("oracle output %s: %v", b, err)
	}
	for i, c := range predictionCases {
		if got := predictionText(json.RawMessage(c)); got != oracle.Texts[i] {
			t.Errorf("%s: %q, OpenCompass %s says %q", c, got, oracle.OpenCompass, oracle.Texts[i])
		}
	}
}
