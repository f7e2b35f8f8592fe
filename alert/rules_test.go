package alert

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/deploy"
)

// TestParseExample: deploy/alert-rules.example.yaml (the README's example, which `dev --demo`
// runs from its embedded copy) parses, and has a rule of every kind.
func TestParseExample(t *testing.T) {
	b, err := os.ReadFile("../deploy/alert-rules.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Parse(b)
	if err != nil {
		t.Fatalf("the example rules file is invalid: %v", err)
	}
	if len(rs.Rules) != 8 || rs.EvaluationInterval != 30*time.Second {
		t.Fatalf("got %d rules, interval %s", len(rs.Rules), rs.EvaluationInterval)
	}
	if !bytes.Equal(b, deploy.AlertRulesExample) {
		t.Error("deploy.AlertRulesExample differs from the file")
	}
	kinds := map[Kind]bool{}
	for _, r := range rs.Rules {
		kinds[r.Kind] = true
	}
	for k := range kindNames {
		if !kinds[k] {
			t.Errorf("no %s rule in the example", k)
		}
	}
	if fast := rs.Rules[1]; fast.Name != "correction-regressed-fast" || fast.Epoch() != time.Minute || fast.MinScored != 200 {
		t.Errorf("fast change rule %+v", fast)
	}
	ch := rs.Rules[0]
	if ch.Kind != KindChange || ch.Window != Window24h || ch.Baseline != Window7d || ch.Alpha != 0.05 ||
		ch.Horizon != 30*24*time.Hour || ch.ResendInterval != time.Minute || ch.Epoch() != time.Hour {
		t.Errorf("change rule %+v", ch)
	}
	if len(ch.Matchers) != 1 || !ch.Matchers[0].Matches("acme") || ch.Matchers[0].Matches("") {
		t.Errorf("matcher %v", ch.Matchers)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // every one must appear in the error
	}{
		// No rules at all.
		{"empty", "rules: []", []string{"at least one rule"}},
		// Unknown top-level and rule fields are refused by the decoder.
		{"unknown field", "rules:\n- name: a\n  kind: threshold\n  value: 0.1\n  treshold: 3", []string{"treshold"}},
		// A rule without a name is named by position; the kind is checked.
		{"no name, bad kind", "rules:\n- kind: ratio", []string{`rule #1: name: is required`, `rule #1: kind: "ratio" is not`}},
		// A threshold needs its value, as a fraction.
		{"threshold value", "rules:\n- name: a\n  kind: threshold\n  value: 20", []string{`rule "a": value: 20 is not a fraction`}},
		{"threshold missing value", "rules:\n- name: a\n  kind: threshold", []string{`rule "a": value: is required`}},
		// Field of another kind.
		{"foreign field", "rules:\n- name: a\n  kind: threshold\n  value: 0.1\n  alpha: 0.05", []string{`rule "a": alpha: does not apply to kind threshold`}},
		// Matchers: bad syntax, bad regexp, a field the kind does not have.
		{"matchers", "rules:\n- name: a\n  kind: threshold\n  value: 0.1\n  matchers: ['workspace', 'model=~\"(\"', 'suite=\"x\"']",
			[]string{`rule "a": matchers: matcher "workspace"`, `rule "a": matchers: matcher "model=~\"(\""`, `threshold rules match on workspace`}},
		// A change baseline must be longer than its window; alpha in (0, 0.5).
		{"change windows", "rules:\n- name: c\n  kind: change\n  window: all\n  baseline: 24h\n  alpha: 0.7",
			[]string{`rule "c": window: "all" is not 1h, 24h, 7d`, `rule "c": alpha: 0.7`}},
		{"change order", "rules:\n- name: c\n  kind: change\n  window: 24h\n  baseline: 24h",
			[]string{`rule "c": baseline: 24h must be longer than window 24h`}},
		// Durations: bad syntax, too short a horizon, duration required for not_measured_for.
		{"durations", "rules:\n- name: d\n  kind: not_measured_for\n  for: soon\n- name: e\n  kind: change\n  horizon: 1h",
			[]string{`rule "d": for: "soon"`, `rule "d": duration: is required`, `rule "e": horizon: "1h"`}},
		// Duplicate names; reserved labels.
		{"duplicates", "rules:\n- name: a\n  kind: revived_regression\n- name: a\n  kind: revived_regression\n  labels: {alertname: x}",
			[]string{`rule "a": name: used by an earlier rule`, `rule "a": labels: "alertname" is set by repeatrate`}},
		// A label the subject already carries (or kind) would override it in Alertmanager, which
		// would merge different subjects into one alert; annotations repeatrate sets likewise.
		{"subject labels", "rules:\n- name: t\n  kind: threshold\n  value: 0.1\n  labels: {workspace: x, correction_id: y, kind: z}\n" +
			"- name: v\n  kind: revived_regression\n  labels: {case_id: x, version: y}\n  annotations: {evidence: x, subject: y}",
			[]string{`rule "t": labels: "workspace" is a field of threshold subjects`, `rule "t": labels: "correction_id" is a field`,
				`rule "t": labels: "kind" is set by repeatrate`, `rule "v": labels: "case_id" is a field of revived_regression subjects`,
				`rule "v": labels: "version" is a field`, `rule "v": annotations: "evidence" is set by repeatrate`, `rule "v": annotations: "subject" is set by repeatrate`}},
		// Annotation names Alertmanager refuses (it would drop every page of the rule).
		{"annotation names", "rules:\n- name: a\n  kind: revived_regression\n  annotations: {runbook-url: x, 1st: y}",
			[]string{`rule "a": annotations: "1st" is not a valid annotation name`, `rule "a": annotations: "runbook-url" is not a valid annotation name`}},
		// A second document would be ignored; an empty file says what it wants.
		{"two documents", "rules:\n- {name: a, kind: revived_regression}\n---\nrules:\n- {name: b, kind: revived_regression}",
			[]string{"more than one YAML document"}},
		{"empty file", "", []string{"the file is empty"}},
		// Rules that could never fire.
		{"never fire", "rules:\n- {name: a, kind: threshold, op: above, value: 1}\n- {name: b, kind: threshold, op: below, value: 0}\n" +
			"- {name: c, kind: change, min_increase: 1}\n- {name: d, kind: missing_runs_above, value: .inf}",
			[]string{`rule "a": value: 1: a rate is never above 1`, `rule "b": value: 0: a rate is never below 0`,
				`rule "c": min_increase: 1: a rate cannot rise by 1`, `rule "d": value: +Inf: want a finite count`}},
		// A source matcher beside the rule's source: never matches, or badge subjects have none.
		{"source matchers", "rules:\n- {name: a, kind: threshold, value: 0.1, source: badge, matchers: ['source=\"live\"']}\n" +
			"- {name: b, kind: change, source: evaluation, matchers: ['source=\"live\"']}",
			[]string{`rule "a": matchers: source="live": badge subjects have no source`, `rule "b": matchers: source="live" can never match`}},
		// abnormal_share_above needs as many replies as a rate rule needs scored by default.
		{"abnormal share default", "rules:\n- {name: a, kind: abnormal_share_above, value: 0.05, min_scored: 0}", []string{`min_scored: 0 must be at least 1`}},
		// A horizon past what a duration holds.
		{"huge horizon", "rules:\n- {name: h, kind: change, horizon: 250000d}", []string{`rule "h": horizon: "250000d"`}},
		// The change rule's method; the detector reads new outcomes from a rolling baseline.
		{"change method", "rules:\n- {name: m, kind: change, method: cusum}\n- {name: n, kind: change, method: sequential, baseline: all}\n" +
			"- {name: o, kind: threshold, value: 0.1, method: sequential}",
			[]string{`rule "m": method: "cusum" is not windows, sequential`, `rule "n": baseline: all: method sequential needs a rolling baseline`,
				`rule "o": method: does not apply to kind threshold`}},
		{"sequential badge", "rules:\n- {name: b, kind: change, method: sequential, source: badge}",
			[]string{`rule "b": source: badge: method sequential judges one source's outcomes`}},
		// Badge has no not_measured_for.
		{"silent badge", "rules:\n- name: s\n  kind: not_measured_for\n  source: badge\n  duration: 1h", []string{`rule "s": source: "badge" is not live, evaluation`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			if !errors.Is(err, ErrRules) {
				t.Fatalf("error %v does not wrap ErrRules", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestMatcher(t *testing.T) {
	tests := []struct {
		in    string
		value string
		match bool
	}{
		{`workspace="acme"`, "acme", true},                // exact
		{`workspace="acme"`, "acme-2", false},             // exact, byte for byte
		{`workspace!="acme"`, "acme-2", true},             // not equal
		{`model=~"support-.*"`, "support-bot", true},      // regexp, anchored at both ends
		{`model=~"support"`, "support-bot", false},        // anchored: a prefix is not a match
		{`model!~"support-.*"`, "sales-bot", true},        // negated regexp
		{`correction_id = "a|b"`, "a|b", true},            // spaces around the operator, special bytes in the value
		{`source=live`, "live", true},                     // unquoted value
		{`source=~"live|evaluation"`, "evaluation", true}, // alternation stays inside the anchors
	}
	for _, tc := range tests {
		m, err := ParseMatcher(tc.in)
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		if got := m.Matches(tc.value); got != tc.match {
			t.Errorf("%s on %q = %v, want %v", tc.in, tc.value, got, tc.match)
		}
	}
}

// An abnormal_share_above rule without min_scored waits for as many replies as a rate rule waits
// for scored opportunities: one abnormal reply of one is not a share worth a page.
func TestAbnormalShareDefaultMinScored(t *testing.T) {
	if r := mustRule(t, "- {name: a, kind: abnormal_share_above, value: 0.05}"); r.MinScored != DefaultMinScored {
		t.Fatalf("min_scored defaults to %d, want %d", r.MinScored, DefaultMinScored)
	}
}

// A sequential rule needs the identity retention to cover its baseline window and the hour by
// which retention is rounded; other rules do not.
func TestSequentialRuleNeedsRetention(t *testing.T) {
	rs, err := Parse([]byte("rules:\n- {name: w, kind: change, baseline: 7d}\n- {name: s, kind: change, method: sequential, baseline: 7d}\n" +
		"- {name: d, kind: change, method: sequential, window: 1h, baseline: 24h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.CheckRetention(30 * 24 * time.Hour); err != nil {
		t.Fatalf("30 days of retention: %v", err)
	}
	err = rs.CheckRetention(7 * 24 * time.Hour)
	if !errors.Is(err, ErrRules) || !strings.Contains(err.Error(), `rule "s": baseline 7d: method sequential needs a retention of at least 169h0m0s`) ||
		strings.Contains(err.Error(), `rule "w"`) || strings.Contains(err.Error(), `rule "d"`) {
		t.Fatalf("7 days of retention: %v, want rule s refused alone", err)
	}
}
