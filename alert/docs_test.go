package alert

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestSemanticsAlertingCurrent: docs/semantics.md#alerting states the Redis key layout as the
// store builds it (outboxes under their own :ob:<sink>: namespace), the kind a removed rule's
// episode-less record resolves with, and every alerting metric the refusals are counted in. It
// failed while the section still described outboxes under the record key and said nothing of
// refusals or the unknown kind.
func TestSemanticsAlertingCurrent(t *testing.T) {
	b, err := os.ReadFile("../docs/semantics.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## Alerting {#alerting}")
	if start < 0 {
		t.Fatal("no Alerting section")
	}
	sec := doc[start:]
	if end := strings.Index(sec[3:], "\n## "); end >= 0 {
		sec = sec[:end+3]
	}
	s, err := NewRedis(nil, "P", []string{"SINK"})
	if err != nil {
		t.Fatal(err)
	}
	doc2 := func(k string) string {
		k = strings.Replace(k, "P:{alerts}", "…", 1)
		return "`" + strings.NewReplacer("RULE", "<rule>", "SUBJ", "<subject>", "SINK", "<sink>").Replace(k) + "`"
	}
	rec := s.Key("RULE", "SUBJ")
	for _, k := range []string{rec, s.index(), s.outbox(rec, "SINK"), s.due("SINK")} {
		if w := doc2(k); !strings.Contains(sec, w) {
			t.Errorf("semantics#alerting lacks the key %s", w)
		}
	}
	if !strings.Contains(sec, "`<key_prefix>:{alerts}:…`") {
		t.Error("semantics#alerting lacks the hash-tagged prefix")
	}
	for _, w := range []string{"kind `" + UnknownKind + "`", "413", "422", "Stale windows", "Removed rules"} {
		if !strings.Contains(sec, w) {
			t.Errorf("semantics#alerting lacks %q", w)
		}
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.refused.WithLabelValues("s", "k").Inc()
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if strings.Contains(mf.GetName(), "refused") && !strings.Contains(sec, mf.GetName()) {
			t.Errorf("semantics#alerting lacks %s", mf.GetName())
		}
	}
}

// TestDocumentedSequentialRule: the sequential rule docs/alerting.md shows is a valid rule
// with method sequential, and docs/semantics.md#detector states the detector's key, grid, threshold
// and hysteresis as the code has them.
func TestDocumentedSequentialRule(t *testing.T) {
	b, err := os.ReadFile("../docs/alerting.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "  - name: correction-regressed-early")
	if start < 0 {
		t.Fatal("docs/alerting.md shows no correction-regressed-early rule")
	}
	end := strings.Index(doc[start:], "```")
	rs, err := Parse([]byte("rules:\n" + doc[start:start+end]))
	if err != nil {
		t.Fatal(err)
	}
	if r := rs.Rules[0]; r.Kind != KindChange || !r.Sequential {
		t.Fatalf("the documented rule is %+v, want a sequential change rule", r)
	}
	b, err = os.ReadFile("../docs/semantics.md")
	if err != nil {
		t.Fatal(err)
	}
	sem := string(b)
	s, _ := NewRedis(nil, "P", []string{"SINK"})
	key := strings.NewReplacer("P:{alerts}", "<key_prefix>:{alerts}", "RULE", "<rule>", "SUBJ", "<subject>").Replace(s.detectorKey("RULE", "SUBJ"))
	grid := make([]string, len(detectorGrid))
	for i, g := range detectorGrid {
		grid[i] = strconv.FormatFloat(g, 'f', -1, 64)
	}
	for _, w := range []string{"`" + key + "`", "{" + strings.Join(grid, ", ") + "}",
		fmt.Sprintf("h = %.2f at α 0.05", detectorThreshold(0.05, DefaultHorizon)),
		fmt.Sprintf("L < h − %g", detectorHysteresis), fmt.Sprintf("at most h + %g", detectorHeadroom)} {
		if !strings.Contains(sem, w) {
			t.Errorf("semantics#detector lacks %q", w)
		}
	}
}
