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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/repeatrate/repeatrate/schemas"
)

// TestImportInspectIntoSuiteSnapshots is the importer end to end: the Inspect AI logs of a real
// mock-model run (test/inspect/make_logs.py, made by deploy/local/test.sh) go through `repeatrate
// import inspect --to-kafka` into the input topic, and `run` on real Kafka and Redis (opencompass
// reply mode, o200k_base tokens, min history 2) publishes suite snapshots whose numbers are the
// log's: refund-1 passes 3 of 3 epochs, refund-2 1 of 3 (its first), refund-3 0 of 3, in two
// versions (the .eval and the .json log of the same run); the "broken" task errors on every run.
func TestImportInspectIntoSuiteSnapshots(t *testing.T) {
	logs := filepath.Join("..", "..", ".cache", "inspect-logs")
	if _, err := os.Stat(filepath.Join(logs, "done")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Inspect AI logs in %s (deploy/local/test.sh makes them)", logs)
		}
		t.Skipf("no Inspect AI logs in %s; run .cache/venv/bin/python test/inspect/make_logs.py %s", logs, logs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg, kc := isolated(ctx, t, "import", 2)
	cfg.Suite.MinHistory, cfg.Suite.ReplyMode, cfg.Suite.Tokenizer = 2, "opencompass", "o200k_base"
	for _, imp := range [][]string{
		{"--in", filepath.Join(logs, "eval"), "--version", "v1", "--version-seq", "1"},
		{"--in", filepath.Join(logs, "json"), "--version", "v2", "--version-seq", "2"},
		{"--in", filepath.Join(logs, "error"), "--version", "v1", "--version-seq", "1"},
	} {
		args := append([]string{"inspect", "--workspace", "acme", "--to-kafka", strings.Join(cfg.Kafka.Brokers, ","),
			"--topic", cfg.Kafka.InputTopics[0]}, imp...)
		var stderr bytes.Buffer
		if err := importCommand(ctx, args, io.Discard, &stderr); err != nil {
			t.Fatalf("import %v: %v\n%s", imp, err, stderr.String())
		}
	}
	defer startImportProcessor(ctx, t, cfg)()

	third, twoThirds, fourNinths := 1.0/3, 2.0/3, 4.0/9
	var stddev = math.Sqrt(((2.0/9)*(2.0/9) + 2*(1.0/9)*(1.0/9)) / 2)
	// The regressions task's numbers, the same in both versions. Replies in o200k_base tokens:
	// "Default output, as always." 6 (refund-1 ×3), "something else" 2 and "the same thing" 3 ×2
	// (refund-2), "I cannot say." 4 (refund-3 ×3), as Python's tiktoken counts them.
	check := func(s *schemas.SuiteStability) string {
		var errs []string
		eq := func(what string, got *float64, want float64) {
			if got == nil || math.Abs(*got-want) > 1e-12 {
				errs = append(errs, fmt.Sprintf("%s %v, want %v", what, deref(got), want))
			}
		}
		if s.Runs != 3 || s.Cases != 3 || len(s.RunScores) != 3 || s.Tokenizer != "o200k_base" || s.AbnormalSamples != 0 ||
			s.MissingRunsTotal != 0 || s.ReplyLength.Count != 9 {
			errs = append(errs, fmt.Sprintf("runs %d cases %d run_scores %v tokenizer %q abnormal %d missing %d replies %d",
				s.Runs, s.Cases, s.RunScores, s.Tokenizer, s.AbnormalSamples, s.MissingRunsTotal, s.ReplyLength.Count))
		} else {
			for i, want := range []float64{twoThirds, third, third} {
				eq(fmt.Sprintf("run_scores[%d]", i), &s.RunScores[i], want)
			}
		}
		eq("mean", s.Mean, fourNinths)
		eq("stddev", s.StdDev, stddev)
		eq("min", s.Min, third)
		eq("max", s.Max, twoThirds)
		// pass@1 is the mean pass fraction; k = 5 and 10 exceed the 3 runs: OpenCompass's values.
		eq("pass@1", s.PassAtK["1"], fourNinths)
		eq("pass@5", s.PassAtK["5"], 1)
		eq("pass@10", s.PassAtK["10"], 1)
		eq("mG-Pass@1", s.MGPassAtK["1"], 0)
		eq("mG-Pass@5", s.MGPassAtK["5"], 0)
		for _, tau := range []string{"0", "0.25", "0.5", "0.75", "1"} {
			eq("G-Pass@1 τ="+tau, s.GPassAtK["1"][tau], fourNinths)
			eq("G-Pass@5 τ="+tau, s.GPassAtK["5"][tau], 0)
		}
		eq("reply mean", s.ReplyLength.Mean, 38.0/9)
		eq("reply p75", s.ReplyLength.P75, 6)
		eq("reply p90", s.ReplyLength.P90, 6)
		return strings.Join(errs, "; ")
	}
	want := map[string]func([]byte) string{
		"stability regressions v1": func(b []byte) string { return checkStability(b, check) },
		"stability regressions v2": func(b []byte) string { return checkStability(b, check) },
		"stability broken v1": func(b []byte) string {
			return checkStability(b, func(s *schemas.SuiteStability) string {
				// Every run errored: nothing scored, no reply; in opencompass mode the errored runs
				// count as failures, so pass@1 is 0 (docs/semantics.md#stability).
				if s.Runs != 2 || s.Cases != 0 || len(s.RunScores) != 0 || s.Mean != nil || s.ReplyLength.Count != 0 || s.MissingRunsTotal != 0 {
					return fmt.Sprintf("%+v", *s)
				}
				if p := s.PassAtK["1"]; p == nil || *p != 0 {
					return fmt.Sprintf("pass@1 %v, want 0: errored runs are failures", p)
				}
				return ""
			})
		},
		"discrimination regressions": func(b []byte) string {
			var d schemas.SuiteDiscrimination
			if err := json.Unmarshal(b, &d); err != nil {
				return err.Error()
			}
			// refund-1 passes in both versions; refund-2 and refund-3 fail in both (a case's
			// outcome fails when any scored run failed).
			if d.VersionsSeen != 2 || d.LatestVersion != "v2" || d.Judged != 3 || d.AlwaysPass != 1 || d.AlwaysFail != 2 ||
				d.Discriminating != 0 || d.TooNew != 0 || deref(d.Floor) != third || deref(d.Ceiling) != third ||
				deref(d.AchievableRange) != 0 || deref(d.LatestPassRate) != third || d.RevivedTotal != 0 {
				return fmt.Sprintf("%+v", d)
			}
			return ""
		},
	}
	awaitSuiteOutputs(ctx, t, kc, cfg.Kafka.SuiteTopic, want)
}

// startImportProcessor runs `run` on cfg until the returned stop is called.
func startImportProcessor(ctx context.Context, t *testing.T, cfg Config) (stop func()) {
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runProcessor(pctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))) }()
	return func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("processor: %v", err)
		}
	}
}

// awaitSuiteOutputs reads the suite topic until the latest output of each name in want
// ("stability <suite> <version>", "discrimination <suite>") passes its check (an empty answer),
// and fails the test when ctx ends first.
func awaitSuiteOutputs(ctx context.Context, t *testing.T, kc *kafkaClients, topic string, want map[string]func([]byte) string) {
	t.Helper()
	var mu sync.Mutex
	latest := map[string][]byte{}
	go tail(ctx, kc, topic, 3*time.Minute, func(m kafka.Message) error {
		var e envelope
		if err := json.Unmarshal(m.Value, &e); err != nil {
			return err
		}
		var id struct{ Suite, Version string }
		json.Unmarshal(e.Data, &id)
		name := ""
		switch e.Type {
		case schemas.TypeSuiteStability:
			name = "stability " + id.Suite + " " + id.Version
		case schemas.TypeSuiteDiscrimination:
			name = "discrimination " + id.Suite
		}
		mu.Lock()
		latest[name] = e.Data
		mu.Unlock()
		return nil
	})
	for {
		mu.Lock()
		diff := ""
		for name, f := range want {
			if b, ok := latest[name]; !ok {
				diff = name + ": not published"
			} else if d := f(b); d != "" {
				diff = name + ": " + d
			}
			if diff != "" {
				break
			}
		}
		mu.Unlock()
		if diff == "" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("suite outputs never matched: %s", diff)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func checkStability(b []byte, f func(*schemas.SuiteStability) string) string {
	var s schemas.SuiteStability
	if err := json.Unmarshal(b, &s); err != nil {
		return err.Error()
	}
	return f(&s)
}

func deref(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// An import that cannot import says so and exits 1, naming what to fix: help is no error; a
// missing argument is named; a folder with no results, and a --scorer no sample was scored by
// (every result would have been an error), are refused rather than "imported" with exit 0.
func TestImportRefusesWhatItCannotImport(t *testing.T) {
	logs := filepath.Join("..", "..", ".cache", "inspect-logs")
	if _, err := os.Stat(filepath.Join(logs, "done")); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Inspect AI logs in %s (deploy/local/test.sh makes them)", logs)
		}
		t.Skipf("no Inspect AI logs in %s", logs)
	}
	empty := t.TempDir()
	// A folder of logs with a stray JSON file (an array) beside them, and that file on its own.
	mixed := t.TempDir()
	stray := filepath.Join(mixed, "notes.json")
	os.WriteFile(stray, []byte(`[1, 2, 3]`), 0o600)
	evals, _ := filepath.Glob(filepath.Join(logs, "eval", "*.eval"))
	if len(evals) == 0 {
		t.Fatal("no .eval log")
	}
	if b, err := os.ReadFile(evals[0]); err != nil || os.WriteFile(filepath.Join(mixed, filepath.Base(evals[0])), b, 0o600) != nil {
		t.Fatal(err)
	}
	var skippedOut, skippedErr bytes.Buffer
	if err := run(context.Background(), []string{"import", "inspect", "--in", mixed, "--workspace", "w", "--out", "-"},
		func(string) string { return "" }, strings.NewReader(""), &skippedOut, &skippedErr); err != nil {
		t.Errorf("a folder of logs with a stray JSON array: %v (before: the whole import aborted)", err)
	}
	if says := skippedErr.String(); !strings.Contains(says, "skipped "+stray+": not an Inspect AI log: its JSON is an array") ||
		!strings.Contains(says, "(1 files skipped, each said above with why)") || strings.Contains(says, "importer.") || skippedOut.Len() == 0 {
		t.Errorf("a folder with a stray file: wrote %d bytes, said %q", skippedOut.Len(), says)
	}
	for _, c := range []struct {
		args []string
		says []string // "" for no error
	}{
		{[]string{"import", "--help"}, nil},
		{[]string{"import", "inspect", "--in", empty}, []string{"missing --workspace", "exactly one of --to-kafka"}},
		{[]string{"import", "inspect", "--in", empty, "--workspace", "w", "--out", "-"}, []string{"no eval results found in " + empty}},
		{[]string{"import", "inspect", "--in", filepath.Join(logs, "eval"), "--workspace", "w", "--out", "-", "--scorer", "nope"},
			[]string{`no sample has a score from scorer "nope"`, "the log's scorers:"}},
		// The stray file named on its own: an error in the user's terms, no Go type names.
		{[]string{"import", "inspect", "--in", stray, "--workspace", "w", "--out", "-"},
			[]string{stray + " is not an Inspect AI log: its JSON is an array, not a log object"}},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), c.args, func(string) string { return "" }, strings.NewReader(""), &out, &errOut)
		if c.says == nil {
			if err != nil {
				t.Errorf("%v: %v", c.args, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%v: no error (wrote %d bytes)", c.args, out.Len())
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%v: %v, want it to say %q", c.args, err, s)
			}
		}
	}
}

// Each format's help lists its own flags: the Inspect-only ones (scorer, archive member bound)
// and the lm-eval-only ones (metric, filter) are not offered where they would do nothing.
func TestImportHelpListsEachFormatsOwnFlags(t *testing.T) {
	own := map[string][]string{
		"inspect":     {"-scorer", "-pass-threshold", "-max-member-bytes"},
		"opencompass": nil,
		"lm-eval":     {"-metric", "-filter", "-pass-threshold"},
	}
	for format, flags := range own {
		var out, errOut bytes.Buffer
		run(context.Background(), []string{"import", format, "-h"}, func(string) string { return "" }, strings.NewReader(""), &out, &errOut)
		help := out.String() + errOut.String()
		for _, f := range []string{"-scorer", "-pass-threshold", "-max-member-bytes", "-metric", "-filter"} {
			if want := slices.Contains(flags, f); strings.Contains(help, f) != want {
				t.Errorf("import %s -h lists %s: %v, want %v", format, f, !want, want)
			}
		}
		if !strings.Contains(help, "-workspace") {
			t.Errorf("import %s -h does not list -workspace:\n%s", format, help)
		}
	}
}
