package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// schemas/examples/events.ndjson is the tour's input (README): real CloudEvents that replay (and
// produce) take as they are. Replayed, it gives what the README says it gives: the live rate
// 2 of 8, the evaluation rate 2 of 4, two suite versions whose three cases are one of each class
// with --min-history 2, and exactly the three poison lines as dead letters with their reasons.
func TestExampleEventsReplayAsTheTourSays(t *testing.T) {
	dir := t.TempDir()
	out, dlq := filepath.Join(dir, "out.ndjson"), filepath.Join(dir, "dlq.ndjson")
	var stdout, stderr bytes.Buffer
	err := run(context.Background(), []string{"replay", "--in", filepath.Join("..", "..", "schemas", "examples", "events.ndjson"),
		"--min-history", "2", "--out", out, "--dlq", dlq}, func(string) string { return "" }, nil, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	b, _ := os.ReadFile(out)
	type window struct {
		Confirmed int64 `json:"confirmed_repeats"`
		Scored    int64 `json:"scored"`
	}
	rates := map[string]window{}
	var disc []int
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var ev struct {
			Type string `json:"type"`
			Data struct {
				Aggregate struct {
					Source string `json:"source"`
				} `json:"aggregate"`
				Windows struct {
					All window `json:"all"`
				} `json:"windows"`
				VersionsSeen   int `json:"versions_seen"`
				AlwaysPass     int `json:"always_pass"`
				AlwaysFail     int `json:"always_fail"`
				Discriminating int `json:"discriminating"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		switch d := ev.Data; ev.Type {
		case "repeatrate.snapshot.v1":
			rates[d.Aggregate.Source] = d.Windows.All
		case "repeatrate.suite.discrimination.v1":
			disc = []int{d.VersionsSeen, d.AlwaysPass, d.AlwaysFail, d.Discriminating}
		}
	}
	if l := rates["live"]; l.Confirmed != 2 || l.Scored != 8 {
		t.Errorf("live: %d of %d confirmed, the README says 2 of 8", l.Confirmed, l.Scored)
	}
	if e := rates["evaluation"]; e.Confirmed != 2 || e.Scored != 4 {
		t.Errorf("evaluation: %d of %d confirmed, the README says 2 of 4", e.Confirmed, e.Scored)
	}
	if want := []int{2, 1, 1, 1}; !slices.Equal(disc, want) {
		t.Errorf("suite (versions, always pass, always fail, discriminating) = %v, the README says %v", disc, want)
	}
	dl, _ := os.ReadFile(dlq)
	var reasons []string
	for _, l := range strings.Split(strings.TrimSpace(string(dl)), "\n") {
		var d struct {
			Reason string `json:"reason"`
		}
		json.Unmarshal([]byte(l), &d)
		reasons = append(reasons, d.Reason)
	}
	if strings.Join(reasons, ",") != "undecodable,unknown_type,bad_enum" {
		t.Errorf("dead letters %v, want the three poison lines: undecodable, unknown_type, bad_enum", reasons)
	}
}
