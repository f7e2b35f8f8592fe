package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/repeatrate/repeatrate/alert"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/ingest"
	"github.com/repeatrate/repeatrate/readside"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

const (
	dashboardFile = "grafana/repeatrate-dashboard.json"
	rulesFile     = "prometheus/repeatrate-rules.yaml"
	rulesTestFile = "prometheus/repeatrate-rules.test.yaml"
)

// describing is a Registerer that keeps the name and variable labels of every metric registered
// through it.
type describing struct {
	reg    *prometheus.Registry
	labels map[string][]string
}

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

func (d *describing) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		m := descRE.FindStringSubmatch(desc.String())
		if m == nil {
			return fmt.Errorf("unreadable descriptor %s", desc)
		}
		var labels []string
		if m[2] != "" {
			labels = strings.Split(m[2], ",")
		}
		d.labels[m[1]] = labels
	}
	return d.reg.Register(c)
}

func (d *describing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := d.Register(c); err != nil {
			panic(err)
		}
	}
}

func (d *describing) Unregister(c prometheus.Collector) bool { return d.reg.Unregister(c) }

// registered registers the processor's collectors as `repeatrate run` does, through their own
// constructors, and returns every metric name with its variable labels. (The one counter
// cmd/repeatrate defines inline, repeatrate_redis_roundtrips_total, is not reachable from here;
// the dashboard and rules do not use it.)
func registered(t *testing.T) map[string][]string {
	t.Helper()
	d := &describing{reg: prometheus.NewRegistry(), labels: map[string][]string{}}
	d.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	consumer.NewMetrics(d)
	alert.NewMetrics(d)
	readside.NewRecorder(nil, nil, d, zap.NewNop())
	readside.NewHTTP(readside.HTTPConfig{Registerer: d}, nil, d.reg, time.Now, zap.NewNop())
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ingest.New(ingest.Config{LiveTopic: "l", EvalTopic: "e", Registerer: d}, dec, nil, time.Now, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	return d.labels
}

// query is one PromQL expression and where it is.
type query struct{ where, expr string }

func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []query
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s: %v", dashboardFile, err)
			}
			for _, tg := range p.Targets {
				out = append(out, query{"panel " + p.Title, tg.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	labelValues := regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)
	for _, v := range dash.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: unexpected definition %q", v.Name, v.Definition)
			continue
		}
		out = append(out, query{"variable " + v.Name, fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
	}
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// ruleQueries returns the rules' expressions and the recording rules' names with the labels their
// series keep (their grouping labels).
func ruleQueries(t *testing.T) ([]query, map[string][]string) {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var out []query
	recorded := map[string][]string{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if r.Record != "" {
				name = r.Record
				_, _, grouping := refs(r.Expr)
				recorded[r.Record] = grouping
			}
			out = append(out, query{g.Name + " " + name, r.Expr})
		}
	}
	return out, recorded
}

var (
	stringRE   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	matchersRE = regexp.MustCompile(`\{[^}]*\}`)
	matcherRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	groupingRE = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	rangeRE    = regexp.MustCompile(`\[[^\]]*\]`)
	tokenRE    = regexp.MustCompile(`\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|\$?[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(?`)
	keywords   = []string{"and", "or", "unless", "bool", "offset", "inf", "nan"}
)

// refs reads a PromQL expression's metric names, the label names its matchers use, and the label
// names of its grouping clauses (by, without, on, ignoring, group_left, group_right). It is not a
// parser; it handles the expressions these files hold (promtool checks their syntax).
func refs(expr string) (metrics, matched, grouping []string) {
	e := stringRE.ReplaceAllString(expr, `""`)
	for _, blk := range matchersRE.FindAllString(e, -1) {
		for _, m := range matcherRE.FindAllStringSubmatch(blk, -1) {
			matched = append(matched, m[1])
		}
	}
	e = matchersRE.ReplaceAllString(e, " ")
	for _, m := range groupingRE.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				grouping = append(grouping, l)
			}
		}
	}
	e = groupingRE.ReplaceAllString(e, " ")
	e = rangeRE.ReplaceAllString(e, " ")
	for _, tok := range tokenRE.FindAllString(e, -1) {
		tok = strings.TrimSpace(tok)
		switch {
		case tok[0] >= '0' && tok[0] <= '9', tok[0] == '$', strings.HasSuffix(tok, "("), slices.Contains(keywords, strings.ToLower(tok)):
			continue // a number, a Grafana variable, a function, a keyword
		}
		metrics = append(metrics, tok)
	}
	return metrics, matched, grouping
}

// check returns what is wrong with q: metrics the processor does not register (nor the rules
// record), and labels that none of the expression's metrics carries.
func check(q query, reg, recorded map[string][]string) []string {
	metrics, matched, grouping := refs(q.expr)
	if len(metrics) == 0 {
		return []string{fmt.Sprintf("%s: no metric in %q", q.where, q.expr)}
	}
	var problems []string
	allowed := map[string]bool{"job": true, "instance": true}
	for _, m := range metrics {
		labels, ok := reg[m]
		if !ok {
			labels, ok = recorded[m]
		}
		if !ok && m == "up" { // Prometheus's own series for every target
			ok = true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, cut := strings.CutSuffix(m, suffix); !ok && cut {
				if labels, ok = reg[base]; ok && suffix == "_bucket" {
					labels = append(slices.Clone(labels), "le")
				}
			}
		}
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: metric %s is not registered by the processor", q.where, m))
		}
		for _, l := range labels {
			allowed[l] = true
		}
	}
	for _, l := range append(matched, grouping...) {
		if !allowed[l] {
			problems = append(problems, fmt.Sprintf("%s: label %q is on none of %v", q.where, l, metrics))
		}
	}
	return problems
}

// TestDashboardAndRulesUseRegisteredMetrics: every metric and label that the Grafana dashboard
// and the Prometheus rules query is one the processor registers, and every repeatrate_* metric
// the processor registers is on the dashboard.
func TestDashboardAndRulesUseRegisteredMetrics(t *testing.T) {
	reg := registered(t)
	rq, recorded := ruleQueries(t)
	dq := dashboardQueries(t)
	if len(dq) < 20 || len(rq) < 10 {
		t.Fatalf("read %d dashboard and %d rule queries", len(dq), len(rq))
	}
	onDashboard := map[string]bool{}
	for _, q := range append(dq, rq...) {
		for _, p := range check(q, reg, recorded) {
			t.Error(p)
		}
	}
	for _, q := range dq {
		ms, _, _ := refs(q.expr)
		for _, m := range ms {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suffix)
			}
			onDashboard[m] = true
		}
	}
	var missing []string
	for m := range reg {
		if strings.HasPrefix(m, "repeatrate_") && !onDashboard[m] {
			missing = append(missing, m)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("the processor registers metrics no dashboard panel shows (add a panel to %s): %v", dashboardFile, missing)
	}

	// The check itself finds a misspelt metric and a label the metric does not have.
	bad := check(query{"probe", `sum by (reasons) (rate(repeatrate_dead_letter_total{job="x"}[5m])) / sum(repeatrate_events_total{typ="a"})`}, reg, recorded)
	if len(bad) != 3 {
		t.Errorf("the check found %d problems in a bad query, want 3 (metric, two labels): %v", len(bad), bad)
	}
}

// TestRulesPromtool validates the rules with Prometheus's promtool (Debian's prometheus package):
// syntax and types (check rules), then the alerting rules' unit tests (test rules). Without
// promtool it skips, except under CI=true; deploy/local/test.sh installs it.
func TestRulesPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is required under CI=true (apt-get install prometheus)")
		}
		t.Skip("promtool not installed (apt-get install prometheus, or run deploy/local/test.sh)")
	}
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
