package main

import (
	"context"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// keyRecorder keeps the keys of the messages written to it.
type keyRecorder struct{ keys []string }

func (k *keyRecorder) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	for _, m := range msgs {
		k.keys = append(k.keys, string(m.Key))
	}
	return nil
}

// produce keys each line as docs/semantics.md#message-keys says: a live attempt and a correction
// check by aggregate ID, any other eval result by its case (escaped, so a case named with '|'
// cannot pose as another), poison not at all.
func TestProduceKeys(t *testing.T) {
	scope := `"scope":{"workspace":"w s","model":"m","run":"r","checkpoint":"k","artifact":"a"}`
	at := `"occurred_at":"2026-11-30T10:00:00Z","assessed_at":"2026-11-30T10:00:01Z"`
	eval := func(id, extra string) string {
		return `{"specversion":"1.0","id":"` + id + `","source":"t","type":"repeatrate.eval.result.v1","data":{` + scope + `,` + at +
			`,"suite":"s|1","case_id":"c|2","version":"v1","version_seq":1,"run_index":0,"runs":1,"result":"pass"` + extra + `}}`
	}
	lines := []string{
		`{"specversion":"1.0","id":"l1","source":"t","type":"repeatrate.live.attempt.v1","data":{` + scope + `,` + at +
			`,"opportunity_id":"o1","correction_id":"fix","outcome":"passed"}}`,
		eval("e1", `,"correction_id":"fix","opportunity_id":"o2"`),
		eval("e2", ""),
		"poison",
	}
	var w keyRecorder
	if n, err := produce(context.Background(), strings.NewReader(strings.Join(lines, "\n")), &w); err != nil || n != len(lines) {
		t.Fatalf("produced %d of %d: %v", n, len(lines), err)
	}
	agg := schemas.Aggregate{Workspace: "w s", Model: "m", Run: "r", Checkpoint: "k", Artifact: "a", CorrectionID: "fix"}
	live, check := agg, agg
	live.Source, check.Source = "live", "evaluation"
	want := []string{live.ID(), check.ID(), "w%20s|s%7C1|c%7C2", ""}
	for i := range want {
		if w.keys[i] != want[i] {
			t.Errorf("line %d keyed %q, want %q", i, w.keys[i], want[i])
		}
	}
}
