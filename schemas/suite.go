package schemas

import "time"

// CloudEvent types of the suite-health outputs (docs/semantics.md: suite discrimination and
// repeated-sampling stability).
const (
	TypeSuiteDiscrimination = "repeatrate.suite.discrimination.v1"
	TypeSuiteStability      = "repeatrate.suite.stability.v1"
	TypeCaseRevived         = "repeatrate.case.revived.v1"
	TypeSampleAbnormal      = "repeatrate.sample.abnormal.v1"
)

// SuiteDiscrimination is the data of a repeatrate.suite.discrimination.v1 event: which cases of a
// suite still tell shipped versions apart. Ratios are fractions in [0,1], null when judged is 0.
// Revived lists revived case ids in case order, at most MaxListedCases of them (the rest are cut
// when the snapshot is published; each revived case is also its own case.revived event);
// RevivedTotal counts them all.
type SuiteDiscrimination struct {
	Workspace                    string    `json:"workspace"`
	Suite                        string    `json:"suite"`
	MinHistory                   int       `json:"min_history"`
	JudgeLastVersions            int       `json:"judge_last_versions"`
	VersionsSeen                 int       `json:"versions_seen"`
	AlwaysPass                   int       `json:"always_pass"`
	AlwaysFail                   int       `json:"always_fail"`
	Discriminating               int       `json:"discriminating"`
	TooNew                       int       `json:"too_new"`
	Judged                       int       `json:"judged"`
	Floor                        *float64  `json:"floor"`
	Ceiling                      *float64  `json:"ceiling"`
	AchievableRange              *float64  `json:"achievable_range"`
	LatestVersion                string    `json:"latest_version"`
	LatestPassRate               *float64  `json:"latest_pass_rate"`
	LatestPassRateDiscriminating *float64  `json:"latest_pass_rate_discriminating"`
	Revived                      []string  `json:"revived"`
	RevivedTotal                 int       `json:"revived_total"`
	ObservedAt                   time.Time `json:"observed_at"`
	// SnapshotVersion is strictly increasing per suite, as an aggregate snapshot's version:
	// subscribers keep the greatest (absent, so 0, in events published before it existed).
	SnapshotVersion int64 `json:"snapshot_version"`
}

// SuiteStability is the data of a repeatrate.suite.stability.v1 event: repeated-sampling stability
// of one suite version. StdDev is the sample standard deviation (n−1), null for one run.
// PassAtK[k] is the mean pass@k over cases with at least k scored runs, null when there are none
// (the opencompass reply mode averages over every case with a run: docs/semantics.md#stability).
type SuiteStability struct {
	Workspace string                         `json:"workspace"`
	Suite     string                         `json:"suite"`
	Version   string                         `json:"version"`
	Runs      int64                          `json:"runs"`
	Cases     int                            `json:"cases"`
	RunScores []float64                      `json:"run_scores"`
	Mean      *float64                       `json:"mean"`
	StdDev    *float64                       `json:"stddev"`
	Min       *float64                       `json:"min"`
	Max       *float64                       `json:"max"`
	PassAtK   map[string]*float64            `json:"pass_at_k"`
	GPassAtK  map[string]map[string]*float64 `json:"g_pass_at_k"`
	MGPassAtK map[string]*float64            `json:"mg_pass_at_k"`
	// Tokenizer names what reply_length and the reply analysis count as a token: whitespace,
	// o200k_base or cl100k_base (tiktoken encodings).
	Tokenizer       string      `json:"tokenizer"`
	ReplyLength     ReplyLength `json:"reply_length"`
	AbnormalSamples int         `json:"abnormal_samples"`
	// MissingRuns lists, per case (in case order), the planned runs that had not arrived by the
	// deadline: only cases with at least one missing run appear, at most MaxListedCases of them
	// (the rest are cut when the snapshot is published; MissingRunsTotal still counts them).
	MissingRuns []MissingRuns `json:"missing_runs"`
	// MissingRunsTotal is the sum of MissingRuns' counts over every case of the version.
	MissingRunsTotal int64     `json:"missing_runs_total"`
	ObservedAt       time.Time `json:"observed_at"`
	// SnapshotVersion is the suite's snapshot version (SuiteDiscrimination.SnapshotVersion).
	SnapshotVersion int64 `json:"snapshot_version"`
}

// ReplyLength summarises reply lengths in tokens of the snapshot's tokenizer; percentile q is the sorted
// lengths' element at index floor(N·q). All null when no reply was seen.
type ReplyLength struct {
	Count int      `json:"count"`
	Mean  *float64 `json:"mean"`
	P75   *float64 `json:"p75"`
	P90   *float64 `json:"p90"`
}

// MaxMissingRunIndexes caps MissingRuns.RunIndexes: a case may plan up to 2^31−1 runs, and a
// snapshot must not grow (nor its computation allocate) with the number planned.
const MaxMissingRunIndexes = 10

// MissingRuns describes the planned runs of one case that had not arrived by the deadline: planned
// run indexes are 0 … runs−1, where runs is the largest planned count among the case's results.
// Count is how many of them are missing (at least 1); RunIndexes holds the smallest missing
// indexes in ascending order, at most MaxMissingRunIndexes of them, so it is complete exactly when
// Count ≤ MaxMissingRunIndexes.
type MissingRuns struct {
	CaseID     string  `json:"case_id"`
	Count      int64   `json:"count"`
	RunIndexes []int64 `json:"run_indexes"`
}

// CaseRevived is the data of a repeatrate.case.revived.v1 event: a case whose first MinHistory or
// more outcomes were identical flipped. Regression is true for pass → fail.
type CaseRevived struct {
	Workspace  string `json:"workspace"`
	Suite      string `json:"suite"`
	CaseID     string `json:"case_id"`
	Version    string `json:"version"`
	From       string `json:"from"`
	To         string `json:"to"`
	Streak     int    `json:"streak"`
	Regression bool   `json:"regression"`
}

// AbnormalSample is the data of a repeatrate.sample.abnormal.v1 event: one reply over a
// repetition threshold.
type AbnormalSample struct {
	Workspace     string  `json:"workspace"`
	Suite         string  `json:"suite"`
	Version       string  `json:"version"`
	CaseID        string  `json:"case_id"`
	RunIndex      int64   `json:"run_index"`
	Metric        string  `json:"metric"`
	Tokens        int     `json:"tokens"`
	GzipRatio     float64 `json:"gzip_ratio"`
	Fragment      string  `json:"fragment"`
	Repeats       int     `json:"repeats"`
	FragmentShare float64 `json:"fragment_share"`
}
