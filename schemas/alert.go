package schemas

import "time"

// CloudEvent types of rule alerts (docs/semantics.md#alerting), published on the alerts topic.
const (
	TypeAlertFiring   = "repeatrate.alert.firing.v1"
	TypeAlertResolved = "repeatrate.alert.resolved.v1"
)

// Alert is the data of a repeatrate.alert.firing.v1 or repeatrate.alert.resolved.v1 event: one
// alerting rule's lifecycle for one subject (an aggregate, a scope and correction for the badge's
// source, a suite, a suite version or a revived case) changed to firing or resolved.
type Alert struct {
	// Rule and Kind name the rule in the rules file.
	Rule string `json:"rule"`
	Kind string `json:"kind"`
	// Subject is the subject's key, unique within the rule; Fields are its parts (workspace,
	// model, … or workspace, suite, …), the ones the rule's matchers read.
	Subject string            `json:"subject"`
	Fields  map[string]string `json:"fields"`
	// Labels and Annotations are the rule's, as sent to Alertmanager.
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	// State is firing or resolved.
	State string `json:"state"`
	// ActiveAt is when the condition started to hold, FiredAt when the alert fired (it names the
	// firing episode), ResolvedAt when it resolved (null while firing).
	ActiveAt   time.Time     `json:"active_at"`
	FiredAt    time.Time     `json:"fired_at"`
	ResolvedAt *time.Time    `json:"resolved_at"`
	Evidence   AlertEvidence `json:"evidence"`
}

// AlertEvidence is what the rule saw at the evaluation that changed the alert's state.
type AlertEvidence struct {
	// EvaluatedAt is the evaluation time; ObservedAt the observation time of the snapshot read
	// (null when there was none, as for a subject that disappeared).
	EvaluatedAt time.Time  `json:"evaluated_at"`
	ObservedAt  *time.Time `json:"observed_at"`
	// Source is the repeat rate's source read (live or evaluation), empty for suite rules.
	Source string `json:"source"`
	// Value is the measured quantity compared with Threshold: a rate, a range, a share, a count of
	// missing runs, or the seconds without a scored opportunity. Null when not measured.
	Value     *float64 `json:"value"`
	Threshold *float64 `json:"threshold"`
	// LastScoredAt is, for not_measured_for, when a scored opportunity was last seen.
	LastScoredAt *time.Time `json:"last_scored_at"`
	// Windows are the windows read with their counts and intervals.
	Windows []AlertWindow `json:"windows"`
	// Test is the change rule's statistical test, null for other kinds.
	Test *AlertTest `json:"test"`
}

// AlertWindow is one window's counts as a rule read them. Baseline windows are the longer window
// less the recent one.
type AlertWindow struct {
	Name             string    `json:"name"`
	ConfirmedRepeats int64     `json:"confirmed_repeats"`
	Scored           int64     `json:"scored"`
	Rate             *float64  `json:"rate"`
	Interval         *Interval `json:"interval"`
	// IntervalKind is wilson95 (the snapshot's interval) or confidence_sequence (the change test's,
	// at level alpha_per_epoch/2).
	IntervalKind string `json:"interval_kind"`
}

// AlertTest is the change rule's anytime-valid test (docs/semantics.md#alerting).
type AlertTest struct {
	Method string  `json:"method"`
	Alpha  float64 `json:"alpha"`
	// Subjects is how many subjects of the rule share Alpha, and AlphaPerSubject what this
	// subject's test spends (Alpha/Subjects): the probability of any false alarm of this subject
	// per Horizon is at most AlphaPerSubject, and across up to Subjects subjects at most Alpha.
	// Beyond Subjects subjects the rule may raise up to (subjects ÷ Subjects)·Alpha between them.
	// Both are absent from the notifications an older build queued (before the field existed).
	Subjects        int     `json:"subjects,omitempty"`
	AlphaPerSubject float64 `json:"alpha_per_subject,omitempty"`
	Horizon         string  `json:"horizon"`
	Epoch           string  `json:"epoch"`
	AlphaPerEpoch   float64 `json:"alpha_per_epoch"`
	MinIncrease     float64 `json:"min_increase"`
	// LowerDifference is the recent rate's lower bound less the baseline's upper bound: the
	// increase is at least this, at the test's confidence. Under method sequential it is the
	// windows' reading beside the detector and decides nothing.
	LowerDifference float64 `json:"lower_difference"`
	// FisherPOneLook is Fisher's exact one-sided p-value on the same counts, valid for a single
	// look only; it is shown for reading and decides nothing.
	FisherPOneLook float64 `json:"fisher_p_one_look"`
	// Detector is the sequential detector's reading (method sequential), absent otherwise.
	Detector *AlertDetector `json:"detector,omitempty"`
}

// AlertDetector is the sequential change detector's state as a change rule with method
// sequential read it (docs/semantics.md#detector).
type AlertDetector struct {
	// Statistic is the log of the mixture CUSUM (nats); the rule fires while it is at least
	// Threshold = log(2 · minutes in the horizon ÷ alpha per subject).
	Statistic float64 `json:"statistic"`
	Threshold float64 `json:"threshold"`
	// BaselineHigh is the baseline's upper confidence bound the last judged outcomes were
	// compared with (the pre-change rate), at level alpha per subject ÷ 2 per epoch.
	BaselineHigh float64 `json:"baseline_high"`
	// Scored is how many scored outcomes the detector has judged for this subject.
	Scored int64 `json:"scored"`
}
