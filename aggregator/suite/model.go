package suite

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
)

// cellKey names what one case holds in one version.
type cellKey struct{ version, c string }

// modelSuite is one suite in memory: its stored runs, and the bounds every result ever received
// sets (docs/semantics.md: a version's order, a case's planned runs and first occurrence are the
// greatest and earliest any of its results carried, superseded or not, so they never depend on
// the order results arrive in).
type modelSuite struct {
	runs    map[RunKey]RunRecord
	vseq    map[string]int64 // version → greatest version_seq
	planned map[cellKey]int64
	first   map[cellKey]int64 // earliest occurred_at, µs
}

// Model holds every run of every suite in memory under the rule of MergeRun, and computes each
// suite's summaries from scratch: the pure reference that replay uses and the Redis suite store,
// which keeps the same summaries incrementally, is tested against.
//
// It keeps a suite forever, where the Redis store drops it: the processor's store re-arms a suite's
// expiry (RedisConfig.IdleTTL, by default the retention) on every batch with a result for that
// suite, so a suite that sees no result for IdleTTL of wall-clock time loses every run and
// announcement, and its next result starts a new history. The model has no wall clock: replay
// reads an NDJSON file without arrival times, so it cannot apply the same rule and does not
// approximate it. Replay's suite outputs therefore equal the processor's only when no suite went
// IdleTTL without a result while the processor ran.
type Model struct {
	suites map[Key]*modelSuite
}

// NewModel returns an empty model.
func NewModel() *Model { return &Model{suites: map[Key]*modelSuite{}} }

// Apply merges observations in order and returns each one's outcome.
func (m *Model) Apply(obs []RunObservation) []aggregator.Outcome {
	out := make([]aggregator.Outcome, len(obs))
	for i, o := range obs {
		s := m.suites[o.Key.Key]
		if s == nil {
			s = &modelSuite{runs: map[RunKey]RunRecord{}, vseq: map[string]int64{},
				planned: map[cellKey]int64{}, first: map[cellKey]int64{}}
			m.suites[o.Key.Key] = s
		}
		r := o.Record
		if q, ok := s.vseq[o.Key.Version]; !ok || r.VersionSeq > q {
			s.vseq[o.Key.Version] = r.VersionSeq
		}
		ck := cellKey{o.Key.Version, o.Key.Case}
		s.planned[ck] = max(s.planned[ck], r.Runs)
		if f, ok := s.first[ck]; !ok || r.Occurred < f {
			s.first[ck] = r.Occurred
		}
		held, ok := s.runs[o.Key]
		s.runs[o.Key], out[i] = MergeRun(&held, ok, r)
	}
	return out
}

// Runs returns the runs of suite k, ordered by version, case and run index.
func (m *Model) Runs(k Key) []RunEntry {
	var es []RunEntry
	if s := m.suites[k]; s != nil {
		for rk, r := range s.runs {
			es = append(es, RunEntry{rk, r})
		}
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

// Versions returns the versions of suite k in order: by version_seq, then label.
func (m *Model) Versions(k Key) []string {
	s := m.suites[k]
	if s == nil {
		return nil
	}
	vs := make([]string, 0, len(s.vseq))
	for v := range s.vseq {
		vs = append(vs, v)
	}
	slices.SortFunc(vs, func(a, b string) int { return cmp.Or(cmp.Compare(s.vseq[a], s.vseq[b]), cmp.Compare(a, b)) })
	return vs
}

// judgedFrom returns the first judged version of an ordered list ("" when every version is).
func judgedFrom(versions []string, cfg Config) string {
	if cfg.JudgeLastVersions > 0 && len(versions) > cfg.JudgeLastVersions {
		return versions[len(versions)-cfg.JudgeLastVersions]
	}
	return ""
}

// caseOutcome is a case's outcome in one version.
type caseOutcome struct {
	version string
	pass    bool
}

// ranks returns suite k's versions in order, the rank of each, and the rank of the first judged
// version.
func (m *Model) ranks(k Key, cfg Config) (versions []string, rank map[string]int, from int) {
	versions = m.Versions(k)
	rank = make(map[string]int, len(versions))
	for i, v := range versions {
		rank[v] = i
	}
	if f := judgedFrom(versions, cfg); f != "" {
		from = rank[f]
	}
	return versions, rank, from
}

// outcomesByCase returns each case's outcome in every version it has one in: fail when any scored
// run failed, pass when it has scored runs and all passed, none (left out) when all its runs
// errored.
func (s *modelSuite) outcomesByCase() map[string][]caseOutcome {
	scored, failed := map[cellKey]bool{}, map[cellKey]bool{}
	for rk, r := range s.runs {
		x := cellKey{rk.Version, rk.Case}
		switch r.Result {
		case 'p':
			scored[x] = true
		case 'f':
			scored[x], failed[x] = true, true
		}
	}
	byCase := map[string][]caseOutcome{}
	for x := range scored {
		byCase[x.c] = append(byCase[x.c], caseOutcome{x.version, !failed[x]})
	}
	return byCase
}

// Discrimination summarises suite k, and returns every revived case with the flip that revived it.
func (m *Model) Discrimination(k Key, cfg Config) (DiscSummary, map[string]schemas.CaseRevived) {
	s := m.suites[k]
	revived := map[string]schemas.CaseRevived{}
	if s == nil {
		return DiscSummary{}, revived
	}
	versions, rank, from := m.ranks(k, cfg)
	d := DiscSummary{VersionsSeen: len(versions)}
	if len(versions) > 0 {
		d.Latest = versions[len(versions)-1]
	}
	for c, outs := range s.outcomesByCase() {
		slices.SortFunc(outs, func(a, b caseOutcome) int { return cmp.Compare(rank[a.version], rank[b.version]) })
		streak := 1
		for streak < len(outs) && outs[streak].pass == outs[0].pass {
			streak++
		}
		if streak >= cfg.MinHistory && streak < len(outs) {
			revived[c] = schemas.CaseRevived{Workspace: k.Workspace, Suite: k.Suite, CaseID: c,
				Version: outs[streak].version, From: passWord(outs[0].pass), To: passWord(outs[streak].pass),
				Streak: streak, Regression: outs[0].pass}
		}
		var pass, fail int
		var inLatest, latestOK bool
		for _, o := range outs {
			if rank[o.version] < from {
				continue
			}
			if o.pass {
				pass++
			} else {
				fail++
			}
			if o.version == d.Latest {
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
			d.LatestN++
			d.LatestDiscN += b2i(disc)
			if latestOK {
				d.LatestPass++
				d.LatestDiscPass += b2i(disc)
			}
		}
	}
	names := make([]string, 0, len(revived))
	for c := range revived {
		names = append(names, c)
	}
	sort.Strings(names)
	d.RevivedTotal = len(names)
	if len(names) > 0 {
		d.Revived = names[:min(len(names), schemas.MaxListedCases)]
	}
	return d, revived
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Version summarises version v of suite k as observed at time at, which decides which planned
// runs count as missing: those of cases whose first run occurred cfg.MissingAfter or more before.
func (m *Model) Version(k Key, v string, cfg Config, at time.Time) VersionSummary {
	out := VersionSummary{Version: v}
	s := m.suites[k]
	if s == nil {
		return out
	}
	type cell struct {
		n, c    int64
		arrived []int64
	}
	cells := map[string]*cell{}
	byRun := map[int64]*RunScore{}
	lengths, abnormal := map[int64]int64{}, map[int64]int64{}
	for rk, r := range s.runs {
		if rk.Version != v {
			continue
		}
		cs := cells[rk.Case]
		if cs == nil {
			cs = &cell{}
			cells[rk.Case] = cs
		}
		cs.arrived = append(cs.arrived, rk.RunIndex)
		if r.Reply {
			lengths[int64(r.Tokens)]++
			if r.Trigger != "" {
				abnormal[int64(r.Tokens)]++
			}
		}
		if r.Result == 'e' {
			continue
		}
		cs.n++
		rs := byRun[rk.RunIndex]
		if rs == nil {
			rs = &RunScore{Index: rk.RunIndex}
			byRun[rk.RunIndex] = rs
		}
		rs.N++
		if r.Result == 'p' {
			cs.c++
			rs.Pass++
		}
	}
	for _, rs := range byRun {
		out.RunScores = append(out.RunScores, *rs)
	}
	hist, attempts := map[[2]int64]int64{}, map[[2]int64]int64{}
	for _, cs := range cells {
		if cs.n > 0 {
			hist[[2]int64{cs.n, cs.c}]++
		}
		attempts[[2]int64{int64(len(cs.arrived)), cs.c}]++ // every stored run, errored ones too
	}
	for nc, count := range hist {
		out.Cases = append(out.Cases, CaseCount{N: nc[0], C: nc[1], Cases: count})
	}
	for nc, count := range attempts {
		out.Attempts = append(out.Attempts, CaseCount{N: nc[0], C: nc[1], Cases: count})
	}
	for t, count := range lengths {
		out.Lengths = append(out.Lengths, LengthCount{t, count})
	}
	for t, count := range abnormal {
		out.Abnormal = append(out.Abnormal, LengthCount{t, count})
	}
	for ck, p := range s.planned {
		if ck.version == v {
			out.Runs = max(out.Runs, p)
		}
	}
	deadline := aggregator.Micros(at) - int64(cfg.MissingAfter/time.Microsecond)
	names := make([]string, 0, len(cells))
	for c := range cells {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		ck := cellKey{v, c}
		if s.first[ck] > deadline {
			continue
		}
		if n, sample := missingRuns(s.planned[ck], cells[c].arrived); n > 0 {
			if len(out.Missing) < schemas.MaxListedCases {
				out.Missing = append(out.Missing, schemas.MissingRuns{CaseID: c, Count: n, RunIndexes: sample})
			}
			out.MissingTotal += n
		}
	}
	sortSummary(&out)
	return out
}

// Summary summarises suite k after a batch that touched versions: the discrimination counts, the
// touched versions' sums (in the order given) and the revived cases still to announce — every
// revived case not in announced, in case order, so a batch applied again reports what it reported
// the first time.
func (m *Model) Summary(k Key, versions []string, announced map[string]bool, cfg Config, at time.Time) Summary {
	d, revived := m.Discrimination(k, cfg)
	sum := Summary{Discrimination: d}
	for _, v := range versions {
		sum.Versions = append(sum.Versions, m.Version(k, v, cfg, at))
	}
	for _, c := range slices.Sorted(maps.Keys(revived)) {
		if !announced[c] {
			sum.Revived = append(sum.Revived, revived[c])
		}
	}
	return sum
}

// touched returns the suites of obs in first-seen order, and each one's versions in label order.
func touched(obs []RunObservation) ([]Key, map[Key][]string) {
	var keys []Key
	sets := map[Key]map[string]bool{}
	for _, o := range obs {
		k := o.Key.Key
		if sets[k] == nil {
			keys = append(keys, k)
			sets[k] = map[string]bool{}
		}
		sets[k][o.Key.Version] = true
	}
	out := map[Key][]string{}
	for k, s := range sets {
		out[k] = slices.Sorted(maps.Keys(s))
	}
	return keys, out
}

// Memory is Model behind the same interface as Redis, for replay and unit tests.
type Memory struct {
	Model     *Model
	Config    Config
	announced map[Key]map[string]bool
	versions  map[Key]int64 // snapshot versions, by the rule of suite.lua
}

// NewMemory returns an empty in-memory suite store with configuration cfg (validated).
func NewMemory(cfg Config) *Memory {
	cfg.Validate()
	return &Memory{Model: NewModel(), Config: cfg, announced: map[Key]map[string]bool{}, versions: map[Key]int64{}}
}

// Apply merges obs and returns what Redis.Apply returns.
func (m *Memory) Apply(_ context.Context, obs []RunObservation, at time.Time) (Applied, error) {
	keys, versions := touched(obs)
	res := Applied{Outcomes: m.Model.Apply(obs), Suites: keys, Summaries: map[Key]*Summary{}}
	changed := map[Key]bool{}
	for i, o := range res.Outcomes {
		if o == aggregator.Counted || o == aggregator.Reassessed {
			changed[obs[i].Key.Key] = true
		}
	}
	for _, k := range keys {
		if changed[k] {
			m.versions[k] = max(m.versions[k]+1, aggregator.Micros(at))
		}
		s := m.Model.Summary(k, versions[k], m.announced[k], m.Config, at)
		s.SnapshotVersion = m.versions[k]
		res.Summaries[k] = &s
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

// Applied is the result of applying runs: each run's outcome in input order, the touched suites
// in first-seen order, and each one's summary after the apply.
type Applied struct {
	Outcomes  []aggregator.Outcome
	Suites    []Key
	Summaries map[Key]*Summary
}

// entriesModel loads stored runs into a model, as if each had been received once.
func entriesModel(runs []RunEntry) *Model {
	m := NewModel()
	for _, e := range runs {
		m.Apply([]RunObservation{{Key: e.Key, Record: e.Record}})
	}
	return m
}

// Discrimination computes the discrimination snapshot of suite k from a set of its runs, and the
// revived cases in case order: the rules of docs/semantics.md stated over runs, for tests and
// one-off reports.
func Discrimination(k Key, runs []RunEntry, cfg Config, at time.Time) (schemas.SuiteDiscrimination, []schemas.CaseRevived) {
	d, revived := entriesModel(runs).Discrimination(k, cfg)
	var rv []schemas.CaseRevived
	for _, c := range slices.Sorted(maps.Keys(revived)) {
		rv = append(rv, revived[c])
	}
	return DiscriminationOf(k, &d, cfg, at), rv
}

// Stability computes the stability snapshot of one version of suite k from that version's runs,
// as observed at time at.
func Stability(k Key, version string, runs []RunEntry, cfg Config, at time.Time) schemas.SuiteStability {
	v := entriesModel(runs).Version(k, version, cfg, at)
	return StabilityOf(k, &v, cfg, at)
}
