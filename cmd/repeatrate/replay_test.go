package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/repeatrate/repeatrate/replay"
)

func liveLine(id, opp, outcome, occurred, assessed string) string {
	return `{"specversion":"1.0","id":"` + id + `","source":"t","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"` + opp +
		`","correction_id":"fix","occurred_at":"` + occurred + `","assessed_at":"` + assessed + `","outcome":"` + outcome + `"}}`
}

func TestReplayCommand(t *testing.T) {
	dir := t.TempDir()
	in := strings.Join([]string{
		liveLine("1", "a", "confirmed_repeat", "2026-01-10T10:00:00Z", "2026-01-10T10:00:00Z"),
		liveLine("2", "b", "passed", "2026-01-10T10:30:00Z", "2026-01-10T10:30:00Z"),
		liveLine("2", "b", "passed", "2026-01-10T10:30:00Z", "2026-01-10T10:30:00Z"), // duplicate
		liveLine("3", "a", "passed", "2026-01-10T10:00:00Z", "2026-01-10T11:00:00Z"), // re-assessment
		liveLine("4", "c", "unscored", "2026-01-09T12:00:00Z", "2026-01-09T12:00:00Z"),
		"",
		"{not json",
		strings.Replace(liveLine("5", "d", "passed", "2026-01-10T10:00:00Z", "2026-01-10T10:00:00Z"), `"workspace":"w"`, `"workspace":""`, 1),
	}, "\n")
	inFile := filepath.Join(dir, "in.ndjson")
	os.WriteFile(inFile, []byte(in), 0o600)
	outFile, dlqFile := filepath.Join(dir, "out.ndjson"), filepath.Join(dir, "dlq.ndjson")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"replay", "--in", inFile, "--as-of", "2026-01-10T10:45:00Z", "--out", outFile, "--dlq", dlqFile},
		func(string) string { return "" }, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	out, _ := os.ReadFile(outFile)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d snapshot lines, want 1:\n%s", len(lines), out)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["type"] != "repeatrate.snapshot.v1" || doc["subject"] != "w|m|r|c|a|fix|live" {
		t.Fatalf("envelope %v %v", doc["type"], doc["subject"])
	}
	windows := doc["data"].(map[string]any)["windows"].(map[string]any)
	counts := func(w string) [3]float64 {
		m := windows[w].(map[string]any)
		return [3]float64{m["confirmed_repeats"].(float64), m["passed"].(float64), m["unscored"].(float64)}
	}
	// a was re-assessed to passed; b counted once; c is 22h45m old: outside 1h, inside 24h.
	if c := counts("all"); c != [3]float64{0, 2, 1} {
		t.Errorf("all = %v", c)
	}
	if c := counts("1h"); c != [3]float64{0, 2, 0} {
		t.Errorf("1h = %v", c)
	}
	if c := counts("24h"); c != [3]float64{0, 2, 1} {
		t.Errorf("24h = %v", c)
	}
	if v := doc["data"].(map[string]any)["version"].(float64); v != 4 {
		t.Errorf("version = %v, want 4 (four changing events)", v)
	}
	dlq, _ := os.ReadFile(dlqFile)
	var reasons []string
	for _, l := range strings.Split(strings.TrimSpace(string(dlq)), "\n") {
		var d replay.DeadLetter
		if err := json.Unmarshal([]byte(l), &d); err != nil {
			t.Fatal(err)
		}
		reasons = append(reasons, d.Reason)
		if d.Value == "" {
			t.Errorf("dead letter of line %d lost its value", d.Line)
		}
	}
	if strings.Join(reasons, ",") != "undecodable,missing_field" {
		t.Fatalf("dead-letter reasons %v", reasons)
	}
}

func TestReplayLongLine(t *testing.T) {
	long := strings.Repeat("x", 3000)
	in := liveLine("1", "a", "passed", "2026-01-10T10:00:00Z", "2026-01-10T10:00:00Z") + "\n" + long + "\n"
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"replay", "--in", "-", "--max-message-bytes", "1000"},
		func(string) string { return "" }, strings.NewReader(in), &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr.String(), `"reason":"too_large"`) || strings.Count(stdout.String(), "\n") != 1 {
		t.Fatalf("stdout %q\nstderr %q", stdout.String(), stderr.String())
	}
}
