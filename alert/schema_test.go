package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

// validateEvent checks that a notification, rendered as the alerts topic's CloudEvent, carries
// data valid against the JSON Schema of its type (schemas/alert_*.v1.schema.json).
func validateEvent(t *testing.T, n *Notification) {
	t.Helper()
	o := Out(n)
	b, err := sink.Encode(&o)
	if err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Type string          `json:"type"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatal(err)
	}
	file := strings.TrimPrefix(strings.TrimSuffix(ev.Type, ".v1"), "repeatrate.")
	file = strings.ReplaceAll(file, ".", "_") + ".v1.schema.json"
	sb, err := schemas.Files.ReadFile(file)
	if err != nil {
		t.Fatalf("event type %s: %v", ev.Type, err)
	}
	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(sb))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("mem://"+file, raw); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("mem://" + file)
	if err != nil {
		t.Fatal(err)
	}
	data, err := jsonschema.UnmarshalJSON(bytes.NewReader(ev.Data))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(data); err != nil {
		t.Errorf("%s event invalid against %s: %v\n%s", n.Kind, file, err, ev.Data)
	}
}

// TestEpisodelessResolutionValid: a record that fired before records kept their episode (the
// rule's kind and labels at firing) has none; when its rule leaves the rules file it resolves
// without knowing its kind. The resolved event must still be valid against its JSON Schema (it
// was published with kind "unknown", which the schema did not allow).
func TestEpisodelessResolutionValid(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	kafka := &recordingSink{name: "kafka"}
	clk := &clock{t: t0}
	store, _ := NewRedis(rdb, prefix, []string{"kafka"})
	before := "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20, labels: {severity: page}}\n" +
		"- {name: other, kind: threshold, window: 24h, value: 0.9, min_scored: 20}\n"
	after := "rules:\n- {name: other, kind: threshold, window: 24h, value: 0.9, min_scored: 20}\n"
	high := snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)

	first := newTestEvaluator(t, store, before, []Sink{kafka}, clk)
	first.Apply(Update{Snapshot: high})
	if err := first.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	if err := first.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	keys, err := store.Keys(ctx)
	if err != nil || len(keys) != 1 {
		t.Fatalf("index %v, %v: want the firing record", keys, err)
	}
	// As an older version wrote it: no episode.
	if err := rdb.HDel(ctx, keys[0], "episode").Err(); err != nil {
		t.Fatal(err)
	}
	second := newTestEvaluator(t, store, after, []Sink{kafka}, clk)
	second.Apply(Update{Snapshot: high})
	clk.set(t0.Add(time.Minute))
	if err := second.Evaluate(ctx, clk.now()); err != nil {
		t.Fatal(err)
	}
	if err := second.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	if got := kafka.kinds(); len(got) != 2 || got[1] != "resolved" {
		t.Fatalf("kafka got %v, want [firing resolved]", got)
	}
	for i := range kafka.sent {
		validateEvent(t, &kafka.sent[i])
	}
	if res := kafka.sent[1].Alert; res.Rule != "high" || res.FiredAt != kafka.sent[0].Alert.FiredAt {
		t.Errorf("resolved %+v, want rule high and the firing episode", res)
	}
}
