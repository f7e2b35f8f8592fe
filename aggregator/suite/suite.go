package suite

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strconv"
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

type caseOutcome struct {
	version string
	seq     int64
	pass    bool
}

func ratio(a, b int) *float64 {
	if b == 0 {
		return nil
	}
	r := float64(a) / float64(b)
	return &r
}

// versionOrder returns the suite's versions ordered by version_seq (then label) and their seqs.
func versionOrder(runs []RunEntry) ([]string, map[string]int64) {
	seqs := map[string]int64{}
	for _, e := range runs {
		if s, ok := seqs[e.Key.Version]; !ok || e.Record.VersionSeq > s {
			seqs[e.Key.Version] = e.Record.VersionSeq
		}
	}
	vs := make([]string, 0, len(seqs))
	for v := range seqs {
		vs = append(vs, v)
	}
	slices.SortFunc(vs, func(a, b string) int { return cmp.Or(cmp.Compare(seqs[a], seqs[b]), cmp.Compare(a, b)) })
	return vs, seqs
}

// Discrimination computes the discrimination snapshot of one suite from all its runs, and the
// revived cases with the flip that revived them.
func Discrimination(k Key, runs []RunEntry, cfg Config, at time.Time) (schemas.SuiteDiscrimination, []schemas.CaseRevived) {
	versions, seqs := versionOrder(runs)
	// Per (case, version): any scored fail → fail; scored and all pass → pass; only errors → none.
	type cv struct{ c, v string }
	scored, failed := map[cv]bool{}, map[cv]bool{}
	for _, e := range runs {
		x := cv{e.Key.Case, e.Key.Version}
		switch e.Record.Result {
		case 'p':
			scored[x] = true
		case 'f':
			scored[x], failed[x] = true, true
		}
	}
	byCase := map[string][]caseOutcome{}
	for x := range scored {
		byCase[x.c] = append(byCase[x.c], caseOutcome{x.v, seqs[x.v], !failed[x]})
	}
	judgedVersions := map[string]bool{}
	from := 0
	if cfg.JudgeLastVersions > 0 && len(versions) > cfg.JudgeLastVersions {
		from = len(versions) - cfg.JudgeLastVersions
	}
	for _, v := range versions[from:] {
		judgedVersions[v] = true
	}
	d := schemas.SuiteDiscrimination{Workspace: k.Workspace, Suite: k.Suite, MinHistory: cfg.MinHistory,
		JudgeLastVersions: cfg.JudgeLastVersions, VersionsSeen: len(versions), Revived: []string{}, ObservedAt: at.UTC()}
	latest := ""
	if len(versions) > 0 {
		latest = versions[len(versions)-1]
	}
	d.LatestVersion = latest
	var revived []schemas.CaseRevived
	var latestPass, latestN, latestDiscPass, latestDiscN int
	cases := make([]string, 0, len(byCase))
	for c := range byCase {
		cases = append(cases, c)
	}
	sort.Strings(cases)
	for _, c := range cases {
		outs := byCase[c]
		slices.SortFunc(outs, func(a, b caseOutcome) int {
			return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.version, b.version))
		})
		streak := 1
		for streak < len(outs) && outs[streak].pass == outs[0].pass {
			streak++
		}
		if streak >= cfg.MinHistory && streak < len(outs) {
			d.Revived = append(d.Revived, c)
			revived = append(revived, schemas.CaseRevived{Workspace: k.Workspace, Suite: k.Suite, CaseID: c,
				Version: outs[streak].version, From: passWord(outs[0].pass), To: passWord(outs[streak].pass),
				Streak: streak, Regression: outs[0].pass})
		}
		var pass, fail int
		var inLatest, latestOK bool
		for _, o := range outs {
			if !judgedVersions[o.version] {
				continue
			}
			if o.pass {
				pass++
			} else {
				fail++
			}
			if o.version == latest {
				inLatest, latestOK = true, o.pass
			}
		}
		if pass+fail < cfg.MinHistory {
			d.TooNew++
			continue
		}
		disc := false
		switch {
		case fail == 0:
			d.AlwaysPass++
		case pass == 0:
			d.AlwaysFail++
		default:
			d.Discriminating++
			disc = true
		}
		if inLatest {
			latestN++
			if latestOK {
				latestPass++
			}
			if disc {
				latestDiscN++
				if latestOK {
					latestDiscPass++
				}
			}
		}
	}
	d.Judged = d.AlwaysPass + d.AlwaysFail + d.Discriminating
	d.Floor = ratio(d.AlwaysPass, d.Judged)
	d.Ceiling = ratio(d.AlwaysPass+d.Discriminating, d.Judged)
	d.AchievableRange = ratio(d.Discriminating, d.Judged)
	d.LatestPassRate = ratio(latestPass, latestN)
	d.LatestPassRateDiscriminating = ratio(latestDiscPass, latestDiscN)
	return d, revived
}

func passWord(p bool) string {
	if p {
		return "pass"
	}
	return "fail"
}

func f64(v float64) *float64 { return &v }

// Stability computes the stability snapshot of one suite version from that version's runs, as
// observed at time at (which decides which planned runs count as missing).
func Stability(k Key, version string, runs []RunEntry, cfg Config, at time.Time) schemas.SuiteStability {
	s := schemas.SuiteStability{Workspace: k.Workspace, Suite: k.Suite, Version: version,
		RunScores: []float64{}, PassAtK: map[string]*float64{}, GPassAtK: map[string]map[string]*float64{},
		MGPassAtK: map[string]*float64{}, MissingRuns: []schemas.MissingRuns{}, ObservedAt: at.UTC()}
	type caseState struct {
		n, c     int
		planned  int64
		firstOcc int64
		arrived  []int64 // run indexes held, one per stored run
	}
	cases := map[string]*caseState{}
	type runScore struct{ pass, n int }
	byRun := map[int64]*runScore{}
	var lengths []int
	for _, e := range runs {
		r := e.Record
		cs := cases[e.Key.Case]
		if cs == nil {
			cs = &caseState{firstOcc: r.Occurred}
			cases[e.Key.Case] = cs
		}
		cs.planned = max(cs.planned, r.Runs)
		cs.firstOcc = min(cs.firstOcc, r.Occurred)
		cs.arrived = append(cs.arrived, e.Key.RunIndex)
		s.Runs = max(s.Runs, r.Runs)
		if r.Reply {
			lengths = append(lengths, r.Tokens)
		}
		if r.Result == 'e' {
			continue
		}
		cs.n++
		rs := byRun[e.Key.RunIndex]
		if rs == nil {
			rs = &runScore{}
			byRun[e.Key.RunIndex] = rs
		}
		rs.n++
		if r.Result == 'p' {
			cs.c++
			rs.pass++
		}
	}
	// Run scores in run_index order; runs with nothing scored are left out.
	idx := make([]int64, 0, len(byRun))
	for i := range byRun {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for _, i := range idx {
		s.RunScores = append(s.RunScores, float64(byRun[i].pass)/float64(byRun[i].n))
	}
	if n := len(s.RunScores); n > 0 {
		sum, lo, hi := 0.0, math.Inf(1), math.Inf(-1)
		for _, x := range s.RunScores {
			sum += x
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
		mean := sum / float64(n)
		s.Mean, s.Min, s.Max = f64(mean), f64(lo), f64(hi)
		if n > 1 {
			ss := 0.0
			for _, x := range s.RunScores {
				ss += (x - mean) * (x - mean)
			}
			s.StdDev = f64(math.Sqrt(ss / float64(n-1)))
		}
	}
	names := make([]string, 0, len(cases))
	for c, cs := range cases {
		if cs.n > 0 {
			s.Cases++
		}
		names = append(names, c)
	}
	sort.Strings(names)
	for _, k := range cfg.Ks {
		key := strconv.Itoa(k)
		var sum, msum float64
		g := make([]float64, len(cfg.Taus))
		n := 0
		for _, c := range names {
			cs := cases[c]
			if cs.n < k {
				continue
			}
			n++
			sum += PassAtK(cs.n, cs.c, k)
			msum += MGPassAtK(cs.n, cs.c, k)
			for i, tau := range cfg.Taus {
				g[i] += GPassAtK(cs.n, cs.c, k, tau)
			}
		}
		s.PassAtK[key], s.MGPassAtK[key] = nil, nil
		s.GPassAtK[key] = map[string]*float64{}
		for i, tau := range cfg.Taus {
			s.GPassAtK[key][strconv.FormatFloat(tau, 'f', -1, 64)] = nil
			if n > 0 {
				s.GPassAtK[key][strconv.FormatFloat(tau, 'f', -1, 64)] = f64(g[i] / float64(n))
			}
		}
		if n > 0 {
			s.PassAtK[key], s.MGPassAtK[key] = f64(sum/float64(n)), f64(msum/float64(n))
		}
	}
	// Reply lengths: mean and OpenCompass's percentile convention, element floor(N·q) of the sorted.
	s.ReplyLength.Count = len(lengths)
	p75 := 0
	if len(lengths) > 0 {
		slices.Sort(lengths)
		sum := 0
		for _, l := range lengths {
			sum += l
		}
		p75 = lengths[len(lengths)*3/4]
		s.ReplyLength.Mean = f64(float64(sum) / float64(len(lengths)))
		s.ReplyLength.P75 = f64(float64(p75))
		s.ReplyLength.P90 = f64(float64(lengths[len(lengths)*9/10]))
	}
	for _, e := range runs {
		if r := e.Record; r.Reply && r.Trigger != "" && (cfg.ReplyMode != ReplyOpenCompass || r.Tokens >= p75) {
			s.AbnormalSamples++
		}
	}
	deadline := aggregator.Micros(at) - int64(cfg.MissingAfter/time.Microsecond)
	for _, c := range names {
		cs := cases[c]
		if cs.firstOcc > deadline {
			continue
		}
		if n, sample := missingRuns(cs.planned, cs.arrived); n > 0 {
			s.MissingRuns = append(s.MissingRuns, schemas.MissingRuns{CaseID: c, Count: n, RunIndexes: sample})
			s.MissingRunsTotal += n
		}
	}
	return s
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

// Model holds every run of every suite in memory under the rule of MergeRun: the pure
// reference that replay uses and the Redis suite store is tested against.
//
// It keeps a suite forever, where Redis drops it: the processor's store re-arms a suite's
// expiry (aggregator.RedisConfig.IdleTTL, by default the retention) on every batch with a result for that
// suite, so a suite that sees no result for IdleTTL of wall-clock time loses every run and
// announcement, and its next result starts a new history (discrimination, stability, missing runs
// and revivals computed from that result on). The model has no wall clock: replay reads an NDJSON
// file without arrival times, and occurred_at is the producer's time, neither ordered nor the time
// the processor would have seen the result, so replay cannot apply the same rule exactly and does
// not approximate it. Replay's suite outputs therefore equal the processor's only when no suite
// went IdleTTL without a result while the processor ran.
type Model struct {
	suites map[Key]map[RunKey]RunRecord
}

// NewModel returns an empty model.
func NewModel() *Model { return &Model{suites: map[Key]map[RunKey]RunRecord{}} }

// Apply merges observations in order and returns each one's outcome.
func (m *Model) Apply(obs []RunObservation) []aggregator.Outcome {
	out := make([]aggregator.Outcome, len(obs))
	for i, o := range obs {
		runs := m.suites[o.Key.Key]
		if runs == nil {
			runs = map[RunKey]RunRecord{}
			m.suites[o.Key.Key] = runs
		}
		held, ok := runs[o.Key]
		runs[o.Key], out[i] = MergeRun(&held, ok, o.Record)
	}
	return out
}

// Runs returns the runs of suite k, ordered by version, case and run index.
func (m *Model) Runs(k Key) []RunEntry {
	var es []RunEntry
	for rk, r := range m.suites[k] {
		es = append(es, RunEntry{rk, r})
	}
	SortRuns(es)
	return es
}

// Suites returns every suite the model holds, ordered by ID.
func (m *Model) Suites() []Key {
	ks := make([]Key, 0, len(m.suites))
	for k := range m.suites {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, func(a, b Key) int { return cmp.Compare(a.ID(), b.ID()) })
	return ks
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

// Memory is Model behind the same interface as Redis, for replay and unit tests.
type Memory struct {
	Model     *Model
	announced map[Key]map[string]bool
}

// NewMemory returns an empty in-memory suite store.
func NewMemory() *Memory {
	return &Memory{Model: NewModel(), announced: map[Key]map[string]bool{}}
}

// Apply merges obs and returns what Redis.Apply returns.
func (m *Memory) Apply(_ context.Context, obs []RunObservation) (Applied, error) {
	res := Applied{Outcomes: m.Model.Apply(obs), Runs: map[Key][]RunEntry{}, Announced: map[Key]map[string]bool{}}
	for _, o := range obs {
		k := o.Key.Key
		if _, ok := res.Runs[k]; ok {
			continue
		}
		res.Suites = append(res.Suites, k)
		res.Runs[k] = m.Model.Runs(k)
		res.Announced[k] = maps.Clone(m.announced[k])
	}
	return res, nil
}

// MarkAnnounced records published revived events.
func (m *Memory) MarkAnnounced(_ context.Context, k Key, cases []string) error {
	if m.announced[k] == nil {
		m.announced[k] = map[string]bool{}
	}
	for _, c := range cases {
		m.announced[k][c] = true
	}
	return nil
}

// Output is everything a batch of graded runs publishes.
type Output struct {
	Discrimination []schemas.SuiteDiscrimination
	Stability      []schemas.SuiteStability
	Revived        []schemas.CaseRevived // only cases not announced before
	Abnormal       []schemas.AbnormalSample
}

// BuildOutput computes the outputs of applied runs, so that applying the same batch again (a
// redelivery, or a script call re-run by a client retry) yields the same outputs again and
// subscribers drop the copies by their deterministic ids: a discrimination snapshot per touched
// suite and a stability snapshot per touched version (from the stored state the batch left),
// revived events for revived cases not yet announced, and an abnormal-sample event for every
// observation of the batch whose own reply is abnormal (docs/semantics.md#alerts).
//
// Abnormal samples depend on the observations alone, never on the stored state: counted,
// re-assessed, duplicate or stale, each abnormal reply raises its alert in whatever batch it
// arrives, so the set of alerts does not depend on how the stream is cut into batches or
// redelivered. (Raising only for runs whose stored record was the observation lost an alert when a
// redelivery put a reply and its re-grade in one batch.) Neither does the OpenCompass
// percentile-length gate apply to alerts: the percentile moves with every batch, so it would make
// the set depend on the cut; it applies to the stability snapshot's abnormal_samples count.
func BuildOutput(a Applied, obs []RunObservation, cfg Config, at time.Time) Output {
	var out Output
	for _, k := range a.Suites {
		d, revived := Discrimination(k, a.Runs[k], cfg, at)
		out.Discrimination = append(out.Discrimination, d)
		for _, r := range revived {
			if !a.Announced[k][r.CaseID] {
				out.Revived = append(out.Revived, r)
			}
		}
		var versions []string
		seen := map[string]bool{}
		for _, o := range obs {
			if o.Key.Key == k && !seen[o.Key.Version] {
				seen[o.Key.Version] = true
				versions = append(versions, o.Key.Version)
			}
		}
		slices.Sort(versions)
		for _, v := range versions {
			out.Stability = append(out.Stability, Stability(k, v, VersionRuns(a.Runs[k], v), cfg, at))
		}
	}
	type alert struct {
		run    RunKey
		metric string
		tokens int
		gzip   float64
	}
	raised := map[alert]bool{} // what the alert's id is made of (sink.AbnormalOut): one per id
	for _, o := range obs {
		if !o.Record.Reply || o.Record.Trigger == "" {
			continue
		}
		id := alert{o.Key, o.Record.Trigger, o.Stats.Tokens, o.Stats.GzipRatio}
		if raised[id] {
			continue
		}
		raised[id] = true
		out.Abnormal = append(out.Abnormal, schemas.AbnormalSample{
			Workspace: o.Key.Workspace, Suite: o.Key.Suite, Version: o.Key.Version, CaseID: o.Key.Case,
			RunIndex: o.Key.RunIndex, Metric: o.Record.Trigger, Tokens: o.Stats.Tokens, GzipRatio: o.Stats.GzipRatio,
			Fragment: o.Stats.Fragment, Repeats: o.Stats.Repeats, FragmentShare: o.Stats.Share,
		})
	}
	return out
}

// newer reports whether assessment (a, s) is newer than (b, t): a later assessed time, then a
// greater sequence number.
func newer(a, s, b, t int64) bool { return a > b || (a == b && s > t) }
