package suite

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// DiscSummary holds the counts a discrimination snapshot is computed from (docs/semantics.md,
// suite discrimination). The stores keep them up to date as runs arrive, so a snapshot costs what
// the batch changed, not what the suite holds.
type DiscSummary struct {
	VersionsSeen int
	Latest       string // the last version in order; "" with none
	// Case classes over the judged versions; a case with no scored outcome is in none of them.
	AlwaysPass, AlwaysFail, Discriminating, TooNew int
	// Judged cases with an outcome in the latest version, and how many of them passed there; the
	// same over discriminating cases only.
	LatestN, LatestPass, LatestDiscN, LatestDiscPass int
	Revived                                          []string // the first schemas.MaxListedCases revived cases, in case order
	RevivedTotal                                     int
}

// RunScore is what one run index holds in a version: scored runs and how many of them passed.
type RunScore struct {
	Index, Pass, N int64
}

// CaseCount is how many cases of a version have n scored runs of which c passed: pass@k and
// G-Pass@k depend on a case through (n, c) only, so this histogram is all they need.
type CaseCount struct {
	N, C, Cases int64
}

// LengthCount is how many replies of a version have a given length in tokens.
type LengthCount struct {
	Tokens, Count int64
}

// VersionSummary holds the sums a stability snapshot of one version is computed from.
type VersionSummary struct {
	Version   string
	Runs      int64       // the greatest runs any result of the version planned
	RunScores []RunScore  // by index; indexes with nothing scored are left out
	Cases     []CaseCount // by (N, C); cases with nothing scored are left out
	// Attempts is the (n, c) histogram with n counting every stored run of a case, errored ones
	// included (as failures): what the opencompass mode's pass@k and G-Pass@k read. Both stores
	// keep it; a summary without it (built by hand) makes that mode read Cases, which equals it
	// when no run errored.
	Attempts []CaseCount
	Lengths  []LengthCount // every stored run's reply, by length
	Abnormal []LengthCount // stored runs whose reply is abnormal, by length
	// Missing lists the first schemas.MaxListedCases cases (in case order) that had missing runs
	// at the deadline; MissingTotal counts the missing runs of every case.
	Missing      []schemas.MissingRuns
	MissingTotal int64
}

// Summary is one suite after a batch: its discrimination counts, the stability sums of the
// versions the batch touched (in label order), and the revived cases the batch must announce.
type Summary struct {
	Discrimination DiscSummary
	Versions       []VersionSummary
	Revived        []schemas.CaseRevived // revived, not announced before, in case order
	// SnapshotVersion orders the suite's snapshots as an aggregate's version does: a call that
	// changed the suite set it to the greater of the last one + 1 and its observation time in µs.
	SnapshotVersion int64
}

// DiscriminationSnapshot is the discrimination snapshot of suite k this summary stands for,
// observed at time at, with the suite's snapshot version.
func (s *Summary) DiscriminationSnapshot(k Key, cfg Config, at time.Time) schemas.SuiteDiscrimination {
	d := DiscriminationOf(k, &s.Discrimination, cfg, at)
	d.SnapshotVersion = s.SnapshotVersion
	return d
}

// StabilitySnapshot is the stability snapshot of the summary's i-th version, observed at time at,
// with the suite's snapshot version.
func (s *Summary) StabilitySnapshot(k Key, i int, cfg Config, at time.Time) schemas.SuiteStability {
	st := StabilityOf(k, &s.Versions[i], cfg, at)
	st.SnapshotVersion = s.SnapshotVersion
	return st
}

func ratio(a, b int) *float64 {
	if b == 0 {
		return nil
	}
	r := float64(a) / float64(b)
	return &r
}

func f64(v float64) *float64 { return &v }

func passWord(p bool) string {
	if p {
		return "pass"
	}
	return "fail"
}

// DiscriminationOf builds the discrimination snapshot of suite k from its summary.
func DiscriminationOf(k Key, s *DiscSummary, cfg Config, at time.Time) schemas.SuiteDiscrimination {
	d := schemas.SuiteDiscrimination{Workspace: k.Workspace, Suite: k.Suite, MinHistory: cfg.MinHistory,
		JudgeLastVersions: cfg.JudgeLastVersions, VersionsSeen: s.VersionsSeen, LatestVersion: s.Latest,
		AlwaysPass: s.AlwaysPass, AlwaysFail: s.AlwaysFail, Discriminating: s.Discriminating, TooNew: s.TooNew,
		Revived: slices.Clone(s.Revived), RevivedTotal: s.RevivedTotal, ObservedAt: at.UTC()}
	if d.Revived == nil {
		d.Revived = []string{}
	}
	d.Judged = d.AlwaysPass + d.AlwaysFail + d.Discriminating
	d.Floor = ratio(d.AlwaysPass, d.Judged)
	d.Ceiling = ratio(d.AlwaysPass+d.Discriminating, d.Judged)
	d.AchievableRange = ratio(d.Discriminating, d.Judged)
	d.LatestPassRate = ratio(s.LatestPass, s.LatestN)
	d.LatestPassRateDiscriminating = ratio(s.LatestDiscPass, s.LatestDiscN)
	return d
}

// StabilityOf builds the stability snapshot of one version of suite k from its summary. Sums run
// in a fixed order (run index; (n, c); length), so equal summaries give bit-equal snapshots.
func StabilityOf(k Key, v *VersionSummary, cfg Config, at time.Time) schemas.SuiteStability {
	s := schemas.SuiteStability{Workspace: k.Workspace, Suite: k.Suite, Version: v.Version, Runs: v.Runs,
		RunScores: []float64{}, PassAtK: map[string]*float64{}, GPassAtK: map[string]map[string]*float64{},
		MGPassAtK: map[string]*float64{}, Tokenizer: cfg.ReplyMode.Tokenizer().String(), MissingRuns: slices.Clone(v.Missing),
		MissingRunsTotal: v.MissingTotal, ObservedAt: at.UTC()}
	if s.MissingRuns == nil {
		s.MissingRuns = []schemas.MissingRuns{}
	}
	for _, r := range v.RunScores {
		s.RunScores = append(s.RunScores, float64(r.Pass)/float64(r.N))
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
	for _, c := range v.Cases {
		s.Cases += int(c.Cases)
	}
	// The default mode averages over cases with at least k scored runs; the opencompass mode, as
	// OpenCompass's evaluator does, over every case with a run, errored runs counting as failures
	// and a case short of k runs taking what OpenCompass's functions give it (pass@k 1, G-Pass@k
	// and mG-Pass@k 0).
	hist, gpass, mgpass, parity := v.Cases, GPassAtK, MGPassAtK, cfg.ReplyMode.Rules() == ReplyOpenCompass
	if parity {
		gpass, mgpass = OCGPassAtK, OCMGPassAtK
		if len(v.Attempts) > 0 {
			hist = v.Attempts
		}
	}
	for _, k := range cfg.Ks {
		key := strconv.Itoa(k)
		var sum, msum, n float64
		g := make([]float64, len(cfg.Taus))
		for _, c := range hist {
			if c.N < int64(k) && !parity {
				continue
			}
			w := float64(c.Cases)
			n += w
			sum += w * PassAtK(int(c.N), int(c.C), k)
			msum += w * mgpass(int(c.N), int(c.C), k)
			for i, tau := range cfg.Taus {
				g[i] += w * gpass(int(c.N), int(c.C), k, tau)
			}
		}
		s.PassAtK[key], s.MGPassAtK[key] = nil, nil
		s.GPassAtK[key] = map[string]*float64{}
		for i, tau := range cfg.Taus {
			t := strconv.FormatFloat(tau, 'f', -1, 64)
			s.GPassAtK[key][t] = nil
			if n > 0 {
				s.GPassAtK[key][t] = f64(g[i] / n)
			}
		}
		if n > 0 {
			s.PassAtK[key], s.MGPassAtK[key] = f64(sum/n), f64(msum/n)
		}
	}
	// Reply lengths: mean, and OpenCompass's percentile convention, element ⌊N·q⌋ of the sorted
	// lengths, read off the histogram.
	var count, sum int64
	for _, l := range v.Lengths {
		count += l.Count
		sum += l.Tokens * l.Count
	}
	s.ReplyLength.Count = int(count)
	var p75 int64
	if count > 0 {
		p75 = lengthAt(v.Lengths, count*3/4)
		s.ReplyLength.Mean = f64(float64(sum) / float64(count))
		s.ReplyLength.P75 = f64(float64(p75))
		s.ReplyLength.P90 = f64(float64(lengthAt(v.Lengths, count*9/10)))
	}
	for _, a := range v.Abnormal {
		if !parity || a.Tokens >= p75 {
			s.AbnormalSamples += int(a.Count)
		}
	}
	return s
}

// lengthAt returns element i (from 0) of the sorted lengths that histogram h counts.
func lengthAt(h []LengthCount, i int64) int64 {
	for _, l := range h {
		if i < l.Count {
			return l.Tokens
		}
		i -= l.Count
	}
	return h[len(h)-1].Tokens
}

// sortSummary puts a version summary's histograms in their fixed order.
func sortSummary(v *VersionSummary) {
	slices.SortFunc(v.RunScores, func(a, b RunScore) int { return cmp.Compare(a.Index, b.Index) })
	byNC := func(a, b CaseCount) int { return cmp.Or(cmp.Compare(a.N, b.N), cmp.Compare(a.C, b.C)) }
	slices.SortFunc(v.Cases, byNC)
	slices.SortFunc(v.Attempts, byNC)
	slices.SortFunc(v.Lengths, func(a, b LengthCount) int { return cmp.Compare(a.Tokens, b.Tokens) })
	slices.SortFunc(v.Abnormal, func(a, b LengthCount) int { return cmp.Compare(a.Tokens, b.Tokens) })
}

// missingSample returns the smallest run indexes below planned that arrived (a bitmap, bit i of
// byte i/8 from the low bit) does not hold, at most schemas.MaxMissingRunIndexes of them.
func missingSample(planned int64, arrived []byte) []int64 {
	var out []int64
	for i := int64(0); i < planned && len(out) < schemas.MaxMissingRunIndexes; i++ {
		b := i / 8
		if b < int64(len(arrived)) && arrived[b] == 0xff && i%8 == 0 {
			i += 7
			continue
		}
		if b >= int64(len(arrived)) || arrived[b]&(1<<(i%8)) == 0 {
			out = append(out, i)
		}
	}
	return out
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
// suite and a stability snapshot per touched version (from the summaries the batch left), revived
// events for revived cases not yet announced, and an abnormal-sample event for every observation
// of the batch whose own reply is abnormal (docs/semantics.md#alerts).
//
// Abnormal samples depend on the observations alone, never on the stored state: counted,
// re-assessed, duplicate or stale, each abnormal reply raises its alert in whatever batch it
// arrives, so the set of alerts does not depend on how the stream is cut into batches or
// redelivered. Neither does the OpenCompass percentile-length gate apply to alerts: the percentile
// moves with every batch, so it would make the set depend on the cut; it applies to the stability
// snapshot's abnormal_samples count.
func BuildOutput(a Applied, obs []RunObservation, cfg Config, at time.Time) Output {
	var out Output
	for _, k := range a.Suites {
		s := a.Summaries[k]
		if s == nil {
			continue
		}
		out.Discrimination = append(out.Discrimination, s.DiscriminationSnapshot(k, cfg, at))
		out.Revived = append(out.Revived, s.Revived...)
		for i := range s.Versions {
			out.Stability = append(out.Stability, s.StabilitySnapshot(k, i, cfg, at))
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
