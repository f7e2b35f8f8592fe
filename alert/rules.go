package alert

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Kind is what a rule tests.
type Kind uint8

// Rule kinds (docs/semantics.md#alerting).
const (
	// KindThreshold: a window's rate above or below a value, with at least MinScored scored.
	KindThreshold Kind = iota + 1
	// KindChange: the rate of a recent window significantly and substantially above a disjoint
	// baseline, by an anytime-valid test (ChangeTest).
	KindChange
	// KindNotMeasuredFor: no scored opportunity for Duration.
	KindNotMeasuredFor
	// KindRevivedRegression: a revived case whose flip was pass → fail.
	KindRevivedRegression
	// KindAchievableRangeBelow: a suite's achievable range below Value.
	KindAchievableRangeBelow
	// KindAbnormalShareAbove: a suite version's abnormal samples over its replies above Value.
	KindAbnormalShareAbove
	// KindMissingRunsAbove: a suite version's missing runs above Value.
	KindMissingRunsAbove
)

var kindNames = map[Kind]string{
	KindThreshold: "threshold", KindChange: "change", KindNotMeasuredFor: "not_measured_for",
	KindRevivedRegression: "revived_regression", KindAchievableRangeBelow: "achievable_range_below",
	KindAbnormalShareAbove: "abnormal_share_above", KindMissingRunsAbove: "missing_runs_above",
}

// UnknownKind is the kind a resolved alert carries when its rule has left the rules file and its
// record, written before records kept the kind they fired with, does not say (the resolved
// event's JSON Schema allows it; the firing one's does not).
const UnknownKind = "unknown"

// String returns the kind as written in a rules file, or UnknownKind.
func (k Kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return UnknownKind
}

// Subject kinds a rule evaluates over, and the matcher fields each offers.
var (
	aggregateFields      = []string{"workspace", "model", "run", "checkpoint", "artifact", "correction_id", "source"}
	discriminationFields = []string{"workspace", "suite"}
	stabilityFields      = []string{"workspace", "suite", "version"}
	revivedFields        = []string{"workspace", "suite", "case_id", "version"}
)

// fields lists the matcher fields of the kind's subjects.
func (k Kind) fields() []string {
	switch k {
	case KindRevivedRegression:
		return revivedFields
	case KindAchievableRangeBelow:
		return discriminationFields
	case KindAbnormalShareAbove, KindMissingRunsAbove:
		return stabilityFields
	}
	return aggregateFields
}

// Sources a rate rule reads. SourceBadge is the badge's choice: live when live is measured over
// all time, else evaluation (docs/semantics.md#badge).
const (
	SourceLive       = "live"
	SourceEvaluation = "evaluation"
	SourceBadge      = "badge"
)

// Methods of a change rule.
const (
	MethodWindows    = "windows"
	MethodSequential = "sequential"
)

// Window names, as in a snapshot.
const (
	WindowAll  = "all"
	Window1h   = "1h"
	Window24h  = "24h"
	Window7d   = "7d"
	windowsAll = "all, 1h, 24h or 7d"
)

// windowOrder ranks windows by length: each contains the shorter ones ending at the same time.
var windowOrder = map[string]int{Window1h: 1, Window24h: 2, Window7d: 3, WindowAll: 4}

// Defaults of a rules file.
const (
	// DefaultResendInterval is Prometheus's resend delay: Alertmanager keeps alerts in memory,
	// and one that restarted knows a firing alert again only once it is posted again.
	DefaultResendInterval     = time.Minute
	DefaultEvaluationInterval = 30 * time.Second
	DefaultAlpha              = 0.05
	DefaultHorizon            = 30 * 24 * time.Hour
	DefaultMinScored          = 20
)

// Rules is a validated rules file.
type Rules struct {
	// EvaluationInterval is how often every rule is evaluated on the clock, besides on every
	// snapshot: pending alerts mature and silent feeds are noticed without new snapshots.
	EvaluationInterval time.Duration
	Rules              []Rule
}

// Rule is one validated alerting rule. Fields that do not apply to its kind are zero.
type Rule struct {
	Name     string
	Kind     Kind
	Matchers []Matcher
	// Source is live, evaluation or badge (rate rules).
	Source string
	// Window is the threshold's window, or the change rule's recent window.
	Window string
	// Baseline is the change rule's longer window; the baseline is it less Window.
	Baseline string
	// Above is true for "op: above" (threshold).
	Above bool
	// Value is the threshold.
	Value float64
	// MinScored is the fewest scored opportunities a rate rule needs in each window it reads
	// (threshold, change); for abnormal_share_above, the fewest replies.
	MinScored int64
	// Alpha bounds the change rule's false alarms per Horizon per subject, or, with Subjects above
	// 1, across up to Subjects subjects of the rule.
	Alpha float64
	// Subjects is how many subjects the change rule shares Alpha among (default 1): each
	// subject's test runs at Alpha/Subjects, so by the union bound the probability of any false
	// alarm among up to that many subjects per Horizon is at most Alpha. With the default, N
	// subjects may raise up to N·Alpha false alarms per Horizon between them.
	Subjects int
	// MinIncrease is the smallest increase of the rate the change rule reports, as a fraction.
	MinIncrease float64
	// Horizon is the period over which the change rule spends Alpha.
	Horizon time.Duration
	// Sequential is the change rule's method: false tests the recent window against the
	// baseline's (ChangeTest), true runs the sequential detector (Detector) on every scored
	// outcome the snapshots add.
	Sequential bool
	// Duration is not_measured_for's silence.
	Duration      time.Duration
	For           time.Duration
	KeepFiringFor time.Duration
	// ResendInterval is how often a firing alert is posted again to Alertmanager.
	ResendInterval time.Duration
	Labels         map[string]string
	Annotations    map[string]string
}

// CheckRetention refuses sequential rules whose baseline window, plus the hour by which
// retention is rounded, is longer than the identity retention: expiring hours would leave the
// window between two snapshots of one hour and hide the passes they held from the detector.
func (rs Rules) CheckRetention(retention time.Duration) error {
	var errs []error
	for _, r := range rs.Rules {
		if r.Sequential && windowLength(r.Baseline)+time.Hour > retention {
			errs = append(errs, fmt.Errorf("rule %q: baseline %s: method sequential needs a retention of at least %s (it is %s)",
				r.Name, r.Baseline, windowLength(r.Baseline)+time.Hour, retention))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrRules, errors.Join(errs...))
	}
	return nil
}

// Timing is the part of a rule the lifecycle needs.
func (r *Rule) Timing() Timing {
	return Timing{For: r.For, KeepFiringFor: r.KeepFiringFor, ResendInterval: r.ResendInterval}
}

// fileWire and ruleWire are the YAML forms; pointers tell a field that is absent from a zero.
type fileWire struct {
	EvaluationInterval *string    `yaml:"evaluation_interval"`
	ResendInterval     *string    `yaml:"resend_interval"`
	Rules              []ruleWire `yaml:"rules"`
}

type ruleWire struct {
	Name           string            `yaml:"name"`
	Kind           string            `yaml:"kind"`
	Matchers       []string          `yaml:"matchers"`
	Source         *string           `yaml:"source"`
	Window         *string           `yaml:"window"`
	Baseline       *string           `yaml:"baseline"`
	Op             *string           `yaml:"op"`
	Value          *float64          `yaml:"value"`
	MinScored      *int64            `yaml:"min_scored"`
	Alpha          *float64          `yaml:"alpha"`
	Subjects       *int              `yaml:"subjects"`
	MinIncrease    *float64          `yaml:"min_increase"`
	Horizon        *string           `yaml:"horizon"`
	Method         *string           `yaml:"method"`
	Duration       *string           `yaml:"duration"`
	For            *string           `yaml:"for"`
	KeepFiringFor  *string           `yaml:"keep_firing_for"`
	ResendInterval *string           `yaml:"resend_interval"`
	Labels         map[string]string `yaml:"labels"`
	Annotations    map[string]string `yaml:"annotations"`
}

// ErrRules marks an invalid rules file.
var ErrRules = errors.New("invalid rules")

var ruleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.:-]*$`)

// labelName is what Alertmanager accepts as a label name.
var labelName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Parse reads and validates a rules file. Every error is reported at once, each naming the rule
// (by name, or by position when it has none) and the field; all wrap ErrRules.
func Parse(b []byte) (Rules, error) {
	var w fileWire
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&w); errors.Is(err, io.EOF) {
		return Rules{}, fmt.Errorf("%w: the file is empty: want evaluation_interval, resend_interval and rules (deploy/alert-rules.example.yaml)", ErrRules)
	} else if err != nil {
		return Rules{}, fmt.Errorf("%w: %v", ErrRules, err)
	}
	// A second document would be ignored: refuse it rather than run half the rules.
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return Rules{}, fmt.Errorf("%w: the file holds more than one YAML document (a line ---): put every rule under one rules list", ErrRules)
	}
	var errs []error
	out := Rules{EvaluationInterval: DefaultEvaluationInterval}
	resend := DefaultResendInterval
	if w.EvaluationInterval != nil {
		d, err := parseDuration(*w.EvaluationInterval)
		if err != nil || d < time.Second {
			errs = append(errs, fmt.Errorf("evaluation_interval %q: want a duration of at least 1s", *w.EvaluationInterval))
		} else {
			out.EvaluationInterval = d
		}
	}
	if w.ResendInterval != nil {
		d, err := parseDuration(*w.ResendInterval)
		if err != nil || d < time.Minute {
			errs = append(errs, fmt.Errorf("resend_interval %q: want a duration of at least 1m", *w.ResendInterval))
		} else {
			resend = d
		}
	}
	if len(w.Rules) == 0 {
		errs = append(errs, errors.New("rules: at least one rule is required"))
	}
	seen := map[string]bool{}
	for i, rw := range w.Rules {
		name := fmt.Sprintf("#%d", i+1)
		if rw.Name != "" {
			name = strconv.Quote(rw.Name)
		}
		r, rerrs := parseRule(rw, resend)
		if rw.Name != "" && seen[rw.Name] {
			rerrs = append(rerrs, errors.New("name: used by an earlier rule"))
		}
		seen[rw.Name] = true
		for _, e := range rerrs {
			errs = append(errs, fmt.Errorf("rule %s: %w", name, e))
		}
		out.Rules = append(out.Rules, r)
	}
	if len(errs) > 0 {
		return Rules{}, fmt.Errorf("%w: %w", ErrRules, errors.Join(errs...))
	}
	return out, nil
}

// parseRule validates one rule; each error names its field.
func parseRule(w ruleWire, resend time.Duration) (Rule, []error) {
	var errs []error
	bad := func(field, f string, a ...any) { errs = append(errs, fmt.Errorf(field+": "+f, a...)) }
	r := Rule{Name: w.Name, Labels: w.Labels, Annotations: w.Annotations, ResendInterval: resend}
	if w.Name == "" {
		bad("name", "is required")
	} else if !ruleName.MatchString(w.Name) {
		bad("name", "%q: use letters, digits, _ . : - (not starting with a digit)", w.Name)
	}
	for k, v := range kindNames {
		if v == w.Kind {
			r.Kind = k
		}
	}
	if r.Kind == 0 {
		bad("kind", "%q is not threshold, change, not_measured_for, revived_regression, achievable_range_below, abnormal_share_above or missing_runs_above", w.Kind)
		return r, errs
	}
	fields := r.Kind.fields()
	for _, s := range w.Matchers {
		m, err := ParseMatcher(s)
		if err != nil {
			bad("matchers", "%v", err)
			continue
		}
		if !slices.Contains(fields, m.Name) {
			bad("matchers", "%q: %s rules match on %s", s, r.Kind, strings.Join(fields, ", "))
			continue
		}
		r.Matchers = append(r.Matchers, m)
	}
	// Alertmanager knows an alert by its labels, which hold the subject's fields (Labels): a rule
	// label of the same name would override a field, merging different subjects into one alert.
	for _, k := range slices.Sorted(maps.Keys(r.Labels)) {
		switch {
		case !labelName.MatchString(k):
			bad("labels", "%q is not a valid label name", k)
		case k == "alertname" || k == "rule" || k == "kind":
			bad("labels", "%q is set by repeatrate", k)
		case slices.Contains(fields, k):
			bad("labels", "%q is a field of %s subjects, which repeatrate sets as a label: choose another name", k, r.Kind)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.Annotations)) {
		switch {
		case !labelName.MatchString(k):
			// Alertmanager refuses the whole alert (400 invalid annotations): every page of the
			// rule would be dropped.
			bad("annotations", "%q is not a valid annotation name (letters, digits and _, not starting with a digit: Alertmanager refuses it)", k)
		case k == "evidence" || k == "subject":
			bad("annotations", "%q is set by repeatrate", k)
		}
	}
	dur := func(field string, p *string, min time.Duration) time.Duration {
		if p == nil {
			return 0
		}
		d, err := parseDuration(*p)
		if err != nil || d < min {
			bad(field, "%q: want a duration of at least %s (Go syntax or whole days like 7d)", *p, min)
		}
		return d
	}
	r.For = dur("for", w.For, 0)
	r.KeepFiringFor = dur("keep_firing_for", w.KeepFiringFor, 0)
	if w.ResendInterval != nil {
		r.ResendInterval = dur("resend_interval", w.ResendInterval, time.Minute)
	}

	// allowed lists the kind-specific fields that may appear; every other one present is an error.
	present := map[string]bool{
		"source": w.Source != nil, "window": w.Window != nil, "baseline": w.Baseline != nil,
		"op": w.Op != nil, "value": w.Value != nil, "min_scored": w.MinScored != nil, "alpha": w.Alpha != nil, "subjects": w.Subjects != nil,
		"min_increase": w.MinIncrease != nil, "horizon": w.Horizon != nil, "duration": w.Duration != nil, "method": w.Method != nil,
	}
	var allowed []string
	switch r.Kind {
	case KindThreshold:
		allowed = []string{"source", "window", "op", "value", "min_scored"}
		r.Source = oneOf(&errs, "source", w.Source, SourceLive, SourceLive, SourceEvaluation, SourceBadge)
		r.Window = oneOf(&errs, "window", w.Window, WindowAll, WindowAll, Window1h, Window24h, Window7d)
		op := oneOf(&errs, "op", w.Op, "above", "above", "below")
		r.Above = op == "above"
		r.Value = fraction(&errs, "value", w.Value, true)
		if w.Value != nil && r.Above && r.Value >= 1 {
			bad("value", "%v: a rate is never above 1, so the rule could never fire", r.Value)
		} else if w.Value != nil && !r.Above && op != "" && r.Value <= 0 {
			bad("value", "%v: a rate is never below 0, so the rule could never fire", r.Value)
		}
		r.MinScored = minScored(&errs, w.MinScored)
	case KindChange:
		allowed = []string{"source", "window", "baseline", "alpha", "subjects", "min_increase", "min_scored", "horizon", "method"}
		r.Sequential = oneOf(&errs, "method", w.Method, MethodWindows, MethodWindows, MethodSequential) == MethodSequential
		r.Source = oneOf(&errs, "source", w.Source, SourceLive, SourceLive, SourceEvaluation, SourceBadge)
		r.Window = oneOf(&errs, "window", w.Window, Window24h, Window1h, Window24h, Window7d)
		r.Baseline = oneOf(&errs, "baseline", w.Baseline, Window7d, Window24h, Window7d, WindowAll)
		if r.Window != "" && r.Baseline != "" && windowOrder[r.Baseline] <= windowOrder[r.Window] {
			bad("baseline", "%s must be longer than window %s: the baseline is %s less %s", r.Baseline, r.Window, r.Baseline, r.Window)
		}
		if r.Sequential && r.Baseline == WindowAll {
			// The detector takes new outcomes from the baseline window's growth within an hour;
			// retention expires hours of all at any time, which would hide them.
			bad("baseline", "all: method sequential needs a rolling baseline (24h or 7d)")
		}
		if r.Sequential && r.Source == SourceBadge {
			// Evaluators that read the two sources at different moments would choose different
			// ones and step one detector with both.
			bad("source", "badge: method sequential judges one source's outcomes: use live or evaluation")
		}
		r.Alpha = DefaultAlpha
		if w.Alpha != nil {
			r.Alpha = *w.Alpha
			if !(r.Alpha > 0 && r.Alpha < 0.5) {
				bad("alpha", "%v is not in (0, 0.5)", r.Alpha)
			}
		}
		r.Subjects = 1
		if w.Subjects != nil {
			r.Subjects = *w.Subjects
			if r.Subjects < 1 || r.Subjects > 10_000_000 {
				bad("subjects", "%d is not in 1..10000000 (the subjects the rule's alpha is shared among)", r.Subjects)
			}
		}
		if w.MinIncrease != nil {
			r.MinIncrease = fraction(&errs, "min_increase", w.MinIncrease, false)
			if r.MinIncrease >= 1 {
				bad("min_increase", "%v: a rate cannot rise by 1 or more, so the rule could never fire", r.MinIncrease)
			}
		}
		r.MinScored = minScored(&errs, w.MinScored)
		r.Horizon = DefaultHorizon
		if w.Horizon != nil {
			r.Horizon = dur("horizon", w.Horizon, 24*time.Hour)
		}
	case KindNotMeasuredFor:
		allowed = []string{"source", "duration"}
		r.Source = oneOf(&errs, "source", w.Source, SourceLive, SourceLive, SourceEvaluation)
		if w.Duration == nil {
			bad("duration", "is required")
		} else {
			r.Duration = dur("duration", w.Duration, time.Minute)
		}
	case KindRevivedRegression:
	case KindAchievableRangeBelow:
		allowed = []string{"value"}
		r.Value = fraction(&errs, "value", w.Value, true)
	case KindAbnormalShareAbove:
		allowed = []string{"value", "min_scored"}
		r.Value = fraction(&errs, "value", w.Value, true)
		// As the rate rules: one abnormal reply of one is no share worth a page.
		r.MinScored = minScored(&errs, w.MinScored)
	case KindMissingRunsAbove:
		allowed = []string{"value"}
		if w.Value == nil {
			bad("value", "is required")
		} else if r.Value = *w.Value; r.Value < 0 || math.IsNaN(r.Value) || math.IsInf(r.Value, 0) {
			bad("value", "%v: want a finite count, not negative", r.Value)
		}
	}
	for _, f := range []string{"source", "window", "baseline", "op", "value", "min_scored", "alpha", "subjects", "min_increase", "horizon", "duration", "method"} {
		if present[f] && !slices.Contains(allowed, f) {
			bad(f, "does not apply to kind %s", r.Kind)
		}
	}
	// A matcher on source beside the rule's own source either repeats it or never matches.
	for _, m := range r.Matchers {
		switch {
		case m.Name != "source" || r.Source == "":
		case r.Source == SourceBadge:
			bad("matchers", "%s: badge subjects have no source (the badge chooses live or evaluation): drop it", m)
		case !m.Matches(r.Source):
			bad("matchers", "%s can never match: the rule reads source %s", m, r.Source)
		}
	}
	return r, errs
}

func oneOf(errs *[]error, field string, p *string, def string, allowed ...string) string {
	if p == nil {
		return def
	}
	if !slices.Contains(allowed, *p) {
		*errs = append(*errs, fmt.Errorf("%s: %q is not %s", field, *p, strings.Join(allowed, ", ")))
		return ""
	}
	return *p
}

func fraction(errs *[]error, field string, p *float64, required bool) float64 {
	if p == nil {
		if required {
			*errs = append(*errs, fmt.Errorf("%s: is required", field))
		}
		return 0
	}
	if !(*p >= 0 && *p <= 1) {
		*errs = append(*errs, fmt.Errorf("%s: %v is not a fraction in [0, 1] (write 5 %% as 0.05)", field, *p))
	}
	return *p
}

func minScored(errs *[]error, p *int64) int64 {
	if p == nil {
		return DefaultMinScored
	}
	if *p < 1 {
		*errs = append(*errs, fmt.Errorf("min_scored: %d must be at least 1", *p))
	}
	return *p
}

// maxDays bounds a duration in days: 100 years, far below where time.Duration overflows.
const maxDays = 36500

// parseDuration accepts Go durations plus a whole number of days ("7d"), up to maxDays.
func parseDuration(v string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil {
			return 0, fmt.Errorf("duration %q: %w", v, err)
		}
		if n < 0 || n > maxDays {
			return 0, fmt.Errorf("duration %q: want 0 to %d days", v, maxDays)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(v)
}
