package suite

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
)

// Key names one eval suite of one workspace.
type Key struct {
	Workspace, Suite string
}

// ID is the suite's escaped identity text, used in Kafka keys and Redis hash tags.
func (k Key) ID() string {
	return schemas.JoinEscaped(k.Workspace, k.Suite)
}

// RunKey names one graded run: (workspace, suite, case, version, run_index); see
// docs/semantics.md (suite discrimination).
type RunKey struct {
	Key
	Version, Case string
	RunIndex      int64
}

// RunRecord is what is kept of a graded run: its result, ordering fields and reply numbers.
type RunRecord struct {
	Result     byte // 'p' pass, 'f' fail, 'e' error
	VersionSeq int64
	Runs       int64
	Occurred   int64 // µs
	Assessed   int64 // µs
	Seq        int64
	Reply      bool // a prediction was present; the fields below describe it
	Tokens     int
	GzipRatio  float64
	Trigger    string // abnormal trigger, "" when normal
}

// RunObservation is one eval result as the suite stores see it.
type RunObservation struct {
	Key    RunKey
	Record RunRecord
	Stats  ReplyStats // full reply analysis, for the abnormal-sample event
}

// FromEvalRun maps an eval result to its run observation, analysing its reply with mode.
func FromEvalRun(r *schemas.EvalResult, mode ReplyMode) RunObservation {
	o := RunObservation{
		Key: RunKey{Key: Key{r.Scope.Workspace, r.Suite}, Version: r.Version, Case: r.CaseID, RunIndex: r.RunIndex},
		Record: RunRecord{Result: r.Result[0], VersionSeq: r.VersionSeq, Runs: r.Runs,
			Occurred: aggregator.Micros(r.OccurredAt), Assessed: aggregator.Micros(r.AssessedAt), Seq: r.AssessmentSeq},
	}
	if r.Prediction != nil {
		o.Stats = AnalyzeReply(*r.Prediction, mode)
		if r.ReplyTokens != nil {
			// The harness's own count (OpenCompass's res_length) is the reply's length, as
			// OpenCompass's analysis takes it; the rules still read the text's tokens.
			o.Stats.Tokens = int(*r.ReplyTokens)
		}
		o.Record.Reply, o.Record.Tokens, o.Record.GzipRatio, o.Record.Trigger = true, o.Stats.Tokens, o.Stats.GzipRatio, o.Stats.Trigger
	}
	return o
}

// Config holds the suite-health parameters.
type Config struct {
	MinHistory        int           // versions with an outcome before a case is judged (default 5)
	JudgeLastVersions int           // judge only the suite's last R versions; 0 judges all
	Ks                []int         // pass@k levels (default 1, 5, 10)
	Taus              []float64     // G-Pass@k thresholds (default 0, .25, .5, .75, 1)
	MissingAfter      time.Duration // planned runs count as missing this long after a case's first run (default 1h)
	ReplyMode         ReplyMode
}

// Validate fills defaults and rejects a JudgeLastVersions window that is negative or shorter than
// MinHistory: a case can have at most JudgeLastVersions judged outcomes, so every case would stay
// too_new forever.
func (c *Config) Validate() error {
	if c.MinHistory <= 0 {
		c.MinHistory = 5
	}
	if c.JudgeLastVersions < 0 {
		return fmt.Errorf("suite judge_last_versions %d must be 0 (judge every version) or positive", c.JudgeLastVersions)
	}
	if c.JudgeLastVersions > 0 && c.JudgeLastVersions < c.MinHistory {
		return fmt.Errorf("suite judge_last_versions %d is below min_history %d: no case could ever be judged "+
			"(every case would stay too_new); use 0 to judge every version, or at least %d",
			c.JudgeLastVersions, c.MinHistory, c.MinHistory)
	}
	if len(c.Ks) == 0 {
		c.Ks = []int{1, 5, 10}
	}
	if len(c.Taus) == 0 {
		c.Taus = []float64{0, 0.25, 0.5, 0.75, 1}
	}
	if c.MissingAfter <= 0 {
		c.MissingAfter = time.Hour
	}
	return nil
}

// RunEntry is one stored run.
type RunEntry struct {
	Key    RunKey
	Record RunRecord
}

// MergeRun applies the re-assessment rule of docs/semantics.md to one run: the record with the
// greater (Assessed, Seq) wins; an equal one is a duplicate.
func MergeRun(held *RunRecord, ok bool, in RunRecord) (RunRecord, aggregator.Outcome) {
	switch {
	case !ok:
		return in, aggregator.Counted
	case newer(in.Assessed, in.Seq, held.Assessed, held.Seq):
		return in, aggregator.Reassessed
	case in.Assessed == held.Assessed && in.Seq == held.Seq:
		return *held, aggregator.Duplicate
	}
	return *held, aggregator.Stale
}

// missingRuns returns how many of the planned run indexes 0 … planned−1 are not among arrived,
// and the smallest of them, at most schemas.MaxMissingRunIndexes. Time and memory grow with
// len(arrived), never with planned (up to 2^31−1): the count is planned minus the distinct arrived
// indexes below planned, and the sample walks the gaps between sorted arrived indexes. It sorts
// arrived in place.
func missingRuns(planned int64, arrived []int64) (int64, []int64) {
	slices.Sort(arrived)
	arrived = slices.Compact(arrived)
	lo, _ := slices.BinarySearch(arrived, 0)
	hi, _ := slices.BinarySearch(arrived, planned)
	n := planned - int64(hi-lo)
	if n <= 0 {
		return 0, nil
	}
	sample := make([]int64, 0, min(n, schemas.MaxMissingRunIndexes))
	next := int64(0) // smallest index not yet known to be arrived or sampled
	for _, a := range arrived[lo:hi] {
		for ; next < a && len(sample) < cap(sample); next++ {
			sample = append(sample, next)
		}
		next = a + 1
	}
	for ; next < planned && len(sample) < cap(sample); next++ {
		sample = append(sample, next)
	}
	return n, sample
}

// SortRuns orders runs by version, case and run index.
func SortRuns(es []RunEntry) {
	slices.SortFunc(es, func(a, b RunEntry) int {
		return cmp.Or(cmp.Compare(a.Key.Version, b.Key.Version), cmp.Compare(a.Key.Case, b.Key.Case), cmp.Compare(a.Key.RunIndex, b.Key.RunIndex))
	})
}

// VersionRuns returns the runs of one version out of a suite's runs.
func VersionRuns(es []RunEntry, version string) []RunEntry {
	var out []RunEntry
	for _, e := range es {
		if e.Key.Version == version {
			out = append(out, e)
		}
	}
	return out
}

// newer reports whether assessment (a, s) is newer than (b, t): a later assessed time, then a
// greater sequence number.
func newer(a, s, b, t int64) bool { return a > b || (a == b && s > t) }
