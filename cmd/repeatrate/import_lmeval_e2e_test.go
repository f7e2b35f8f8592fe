package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// TestImportLMEvalIntoSuiteSnapshots: what lm_eval 0.4.13 wrote (test/lmeval/make_samples.sh) goes
// through `repeatrate import lm-eval --to-kafka` into the input topic, and `run` on real Kafka and
// Redis publishes suite snapshots with the numbers lm_eval reports for the same run: the
// generation task's pass@1 and each of its three run scores are lm_eval's exact_match (the dummy
// model gives one reply three times), the multiple-choice task's pass@1 its acc.
func TestImportLMEvalIntoSuiteSnapshots(t *testing.T) {
	out := filepath.Join("..", "..", ".cache", "lmeval-out", "run")
	results, _ := filepath.Glob(filepath.Join(out, "*", "results_*.json"))
	if len(results) != 1 {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no lm_eval output in %s (deploy/local/test.sh makes it)", out)
		}
		t.Skipf("no lm_eval output in %s; run test/lmeval/make_samples.sh", out)
	}
	b, err := os.ReadFile(results[0])
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Results   map[string]map[string]any `json:"results"`
		ModelName string                    `json:"model_name"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	version := res.ModelName + "@" + strings.TrimSuffix(strings.TrimPrefix(filepath.Base(results[0]), "results_"), ".json")
	exactMatch, acc := res.Results["tiny_qa"]["exact_match,none"].(float64), res.Results["tiny_mc"]["acc,none"].(float64)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg, kc := isolated(ctx, t, "import-lmeval", 2)
	var stderr bytes.Buffer
	if err := importCommand(ctx, []string{"lm-eval", "--in", out, "--workspace", "acme", "--to-kafka", strings.Join(cfg.Kafka.Brokers, ","),
		"--topic", cfg.Kafka.InputTopics[0]}, io.Discard, &stderr); err != nil {
		t.Fatalf("import: %v\n%s", err, stderr.String())
	}
	defer startImportProcessor(ctx, t, cfg)()

	stability := func(runs int64, cases int, scores []float64, pass1 float64) func([]byte) string {
		return func(b []byte) string {
			return checkStability(b, func(s *schemas.SuiteStability) string {
				if s.Runs != runs || s.Cases != cases || len(s.RunScores) != len(scores) {
					return fmt.Sprintf("runs %d cases %d run_scores %v, want %d, %d, %v", s.Runs, s.Cases, s.RunScores, runs, cases, scores)
				}
				for i, w := range scores {
					if math.Abs(s.RunScores[i]-w) > 1e-12 {
						return fmt.Sprintf("run_scores %v, want %v", s.RunScores, scores)
					}
				}
				if p := s.PassAtK["1"]; p == nil || math.Abs(*p-pass1) > 1e-12 {
					return fmt.Sprintf("pass@1 %v, want lm_eval's %v", deref(p), pass1)
				}
				return ""
			})
		}
	}
	awaitSuiteOutputs(ctx, t, kc, cfg.Kafka.SuiteTopic, map[string]func([]byte) string{
		"stability tiny_qa " + version: stability(3, 7, []float64{exactMatch, exactMatch, exactMatch}, exactMatch),
		"stability tiny_mc " + version: stability(1, 6, []float64{acc}, acc),
	})
}
