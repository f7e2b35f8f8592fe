package alert

import (
	"os"
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
