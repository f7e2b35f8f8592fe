package suite

import (
	"context"
	"fmt"
	"maps"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
)

var suiteK = Key{"ws", "regressions"}

func run(version string, seq int64, c string, idx int64, result byte) RunEntry {
	return RunEntry{Key: RunKey{Key: suiteK, Version: version, Case: c, RunIndex: idx},
		Record: RunRecord{Result: result, VersionSeq: seq, Runs: 1}}
}

func TestDiscriminationToyRows(t *testing.T) {
	// The source document's rows: case_a always passes, case_b varies, case_c always fails, and
	// case_d has three versions of history: too new, in no other bucket.
	rows := []struct {
		v    int64
		c    string
		pass bool
	}{
		{1, "case_a", true}, {2, "case_a", true}, {3, "case_a", true}, {4, "case_a", true}, {5, "case_a", true},
		{1, "case_b", true}, {2, "case_b", false}, {3, "case_b", true}, {4, "case_b", true}, {5, "case_b", false},
		{1, "case_c", false}, {2, "case_c", false}, {3, "case_c", false}, {4, "case_c", false}, {5, "case_c", false},
		{3, "case_d", true}, {4, "case_d", true}, {5, "case_d", false},
	}
	var runs []RunEntry
	for _, r := range rows {
		res := byte('f')
		if r.pass {
			res = 'p'
		}
		runs = append(runs, run(fmt.Sprint("v", r.v), r.v, r.c, 0, res))
	}
	cfg := Config{}
	cfg.Validate()
	d, revived := Discrimination(suiteK, runs, cfg, t0)
	if d.AlwaysPass != 1 || d.AlwaysFail != 1 || d.Discriminating != 1 || d.TooNew != 1 || d.Judged != 3 || d.VersionsSeen != 5 {
		t.Fatalf("buckets = %+v", d)
	}
	if *d.Floor != 1.0/3 || *d.Ceiling != 2.0/3 || *d.AchievableRange != 1.0/3 || d.LatestVersion != "v5" {
		t.Fatalf("ratios = %v %v %v latest %s", *d.Floor, *d.Ceiling, *d.AchievableRange, d.LatestVersion)
	}
	// In v5: a passes, b fails, c fails → 1/3 over judged, 0/1 over discriminating.
	if *d.LatestPassRate != 1.0/3 || *d.LatestPassRateDiscriminating != 0 {
		t.Fatalf("latest = %v %v", *d.LatestPassRate, *d.LatestPassRateDiscriminating)
	}
	if len(revived) != 0 {
		t.Fatalf("revived = %+v: case_b never had a streak of 5", revived)
	}
}

func TestDiscriminationSeedCounts(t *testing.T) {
	// A suite built to the document's counts over 23 versions: 356 always-pass, 59 always-fail,
	// 113 discriminating and 83 too-new cases → floor 67.4 %, ceiling 88.8 %, range 21.4 %.
	var runs []RunEntry
	add := func(prefix string, n int, versions int, result func(i, v int) byte) {
		for i := 0; i < n; i++ {
			for v := 23 - versions + 1; v <= 23; v++ {
				runs = append(runs, run(fmt.Sprintf("v%02d", v), int64(v), fmt.Sprintf("%s-%d", prefix, i), 0, result(i, v)))
			}
		}
	}
	add("pass", 356, 23, func(int, int) byte { return 'p' })
	add("fail", 59, 23, func(int, int) byte { return 'f' })
	add("disc", 113, 23, func(i, v int) byte { return "pf"[(i+v)%2] })
	add("new", 83, 4, func(i, v int) byte { return "pf"[(i+v)%2] })
	cfg := Config{}
	cfg.Validate()
	d, _ := Discrimination(suiteK, runs, cfg, t0)
	if d.AlwaysPass != 356 || d.AlwaysFail != 59 || d.Discriminating != 113 || d.TooNew != 83 || d.Judged != 528 || d.VersionsSeen != 23 {
		t.Fatalf("buckets = %+v", d)
	}
	pct := func(p *float64) float64 { return math.Round(*p*1000) / 10 }
	if pct(d.Floor) != 67.4 || pct(d.Ceiling) != 88.8 || pct(d.AchievableRange) != 21.4 {
		t.Fatalf("floor %v ceiling %v range %v", pct(d.Floor), pct(d.Ceiling), pct(d.AchievableRange))
	}
	if math.Abs(*d.Ceiling-*d.Floor-*d.AchievableRange) > 1e-12 {
		t.Fatal("range must equal ceiling − floor")
	}
}

func TestDiscriminationRules(t *testing.T) {
	cfg := Config{MinHistory: 3}
	cfg.Validate()
	tests := []struct {
		name    string
		runs    []RunEntry
		revived []string
		bucket  func(d *schemas.SuiteDiscrimination) int
	}{
		// A fail in any scored run of a version makes the version's outcome fail.
		{"one failing run fails the version", []RunEntry{
			run("v1", 1, "x", 0, 'p'), run("v1", 1, "x", 1, 'f'),
			run("v2", 2, "x", 0, 'f'), run("v3", 3, "x", 0, 'f')}, nil, func(d *schemas.SuiteDiscrimination) int { return d.AlwaysFail }},
		// A version whose runs all errored gives no outcome: history 2 → too new.
		{"all errors give no outcome", []RunEntry{
			run("v1", 1, "x", 0, 'p'), run("v2", 2, "x", 0, 'e'), run("v3", 3, "x", 0, 'p')}, nil, func(d *schemas.SuiteDiscrimination) int { return d.TooNew }},
		// Three passes then a fail: revived, and a regression.
		{"revived", []RunEntry{
			run("v1", 1, "x", 0, 'p'), run("v2", 2, "x", 0, 'p'), run("v3", 3, "x", 0, 'p'), run("v4", 4, "x", 0, 'f')},
			[]string{"x"}, func(d *schemas.SuiteDiscrimination) int { return d.Discriminating }},
		// Version order is version_seq, not arrival or label order.
		{"version_seq orders", []RunEntry{
			run("b", 4, "x", 0, 'f'), run("a", 1, "x", 0, 'p'), run("c", 2, "x", 0, 'p'), run("d", 3, "x", 0, 'p')},
			[]string{"x"}, func(d *schemas.SuiteDiscrimination) int { return d.Discriminating }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, rv := Discrimination(suiteK, tc.runs, cfg, t0)
			if tc.bucket(&d) != 1 || !slices.Equal(d.Revived, append([]string{}, tc.revived...)) && !(len(d.Revived) == 0 && len(tc.revived) == 0) {
				t.Fatalf("discrimination = %+v", d)
			}
			if len(rv) > 0 && (!rv[0].Regression || rv[0].From != "pass" || rv[0].To != "fail" || rv[0].Streak != 3) {
				t.Fatalf("revived event = %+v", rv[0])
			}
		})
	}
	// Judging over the last R versions lets a dead case revive into discriminating.
	runs := []RunEntry{run("v1", 1, "x", 0, 'f'), run("v2", 2, "x", 0, 'p'), run("v3", 3, "x", 0, 'p'), run("v4", 4, "x", 0, 'p')}
	last := Config{MinHistory: 3, JudgeLastVersions: 3}
	last.Validate()
	if d, _ := Discrimination(suiteK, runs, last, t0); d.AlwaysPass != 1 {
		t.Fatalf("last 3 versions all pass: %+v", d)
	}
}

func TestStability(t *testing.T) {
	cfg := Config{Ks: []int{1, 2, 4}}
	cfg.Validate()
	var runs []RunEntry
	// Four runs planned per case. a passes runs 0-2 and fails 3; b passes run 0 only and its run 3
	// errored; c has only runs 0 and 1 (2 and 3 never arrived).
	results := map[string]string{"a": "pppf", "b": "pffe", "c": "pp"}
	for c, rs := range results {
		for i := range rs {
			e := run("v7", 7, c, int64(i), rs[i])
			e.Record.Runs = 4
			e.Record.Occurred = aggregator.Micros(t0)
			e.Record.Reply, e.Record.Tokens = true, 10*(i+1)
			runs = append(runs, e)
		}
	}
	runs[0].Record.Trigger = "gzip_ratio"
	runs[0].Record.Tokens = 1000
	s := Stability(suiteK, "v7", runs, cfg, t0.Add(2*time.Hour))
	if s.Runs != 4 || s.Cases != 3 {
		t.Fatalf("runs %d cases %d", s.Runs, s.Cases)
	}
	// Run scores: r0 3/3, r1 2/3, r2 1/2, r3 0/1 (b's error left out).
	want := []float64{1, 2.0 / 3, 0.5, 0}
	if !slices.EqualFunc(s.RunScores, want, func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }) {
		t.Fatalf("run scores %v", s.RunScores)
	}
	mean := (1 + 2.0/3 + 0.5) / 4
	var ss float64
	for _, x := range want {
		ss += (x - mean) * (x - mean)
	}
	if math.Abs(*s.Mean-mean) > 1e-12 || math.Abs(*s.StdDev-math.Sqrt(ss/3)) > 1e-12 || *s.Min != 0 || *s.Max != 1 {
		t.Fatalf("mean %v stddev %v min %v max %v", *s.Mean, *s.StdDev, *s.Min, *s.Max)
	}
	// pass@1 over all three: a 3/4, b 1/3, c 2/2. pass@4: only a has 4 scored runs → 1.
	if math.Abs(*s.PassAtK["1"]-(0.75+1.0/3+1)/3) > 1e-12 || *s.PassAtK["4"] != 1 {
		t.Fatalf("pass@k %v %v", *s.PassAtK["1"], *s.PassAtK["4"])
	}
	if s.GPassAtK["1"]["0.5"] == nil || s.MGPassAtK["2"] == nil {
		t.Fatal("G-Pass@k and mG-Pass@k must be reported")
	}
	if s.AbnormalSamples != 1 || s.ReplyLength.Count != 10 {
		t.Fatalf("abnormal %d replies %d", s.AbnormalSamples, s.ReplyLength.Count)
	}
	if len(s.MissingRuns) != 1 || s.MissingRuns[0].CaseID != "c" || s.MissingRuns[0].Count != 2 ||
		!slices.Equal(s.MissingRuns[0].RunIndexes, []int64{2, 3}) || s.MissingRunsTotal != 2 {
		t.Fatalf("missing %+v total %d", s.MissingRuns, s.MissingRunsTotal)
	}
	// Before the deadline nothing is missing yet.
	if s := Stability(suiteK, "v7", runs, cfg, t0.Add(time.Minute)); len(s.MissingRuns) != 0 {
		t.Fatalf("missing before the deadline: %+v", s.MissingRuns)
	}
	// One run: no standard deviation.
	if s := Stability(suiteK, "v7", runs[:1], cfg, t0); s.StdDev != nil || len(s.RunScores) != 1 {
		t.Fatalf("one run: %+v", s)
	}
}

func TestMissingRuns(t *testing.T) {
	tests := []struct {
		name    string
		planned int64
		arrived []int64
		count   int64
		sample  []int64
	}{
		// Everything arrived: nothing missing, and no sample.
		{"complete", 3, []int64{2, 0, 1}, 0, nil},
		// Nothing arrived below planned but one index past it (a result that planned more runs).
		{"only beyond planned", 3, []int64{5}, 3, []int64{0, 1, 2}},
		// Duplicated arrivals count once.
		{"duplicates", 4, []int64{1, 1, 3, 3}, 2, []int64{0, 2}},
		// The gaps between arrivals, in order.
		{"gaps", 8, []int64{6, 0, 3}, 5, []int64{1, 2, 4, 5, 7}},
		// More missing than the cap: the count is exact, the sample the smallest indexes.
		{"capped", 100, []int64{0, 2, 4, 6, 8, 10, 12}, 93, []int64{1, 3, 5, 7, 9, 11, 13, 14, 15, 16}},
		// The cap is reached inside the last gap.
		{"capped after the last arrival", 1<<31 - 1, []int64{1}, 1<<31 - 2, []int64{0, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, sample := missingRuns(tc.planned, slices.Clone(tc.arrived))
			if n != tc.count || !slices.Equal(sample, tc.sample) {
				t.Fatalf("missing = %d %v, want %d %v", n, sample, tc.count, tc.sample)
			}
		})
	}
}

// One eval result that plans 2^31−1 runs, whose case's first run is past the deadline: stability
// must report the count without listing (or allocating) one entry per planned run.
func TestStabilityHugeRunsIsBounded(t *testing.T) {
	cfg := Config{}
	cfg.Validate()
	// 2^20 first: a regression fails here at about 50 MB rather than exhausting memory at 2^31.
	for _, planned := range []int64{1 << 20, 1<<31 - 1} {
		e := run("v1", 1, "huge", 0, 'p')
		e.Record.Runs, e.Record.Occurred = planned, aggregator.Micros(t0)
		runs := []RunEntry{e}
		at := t0.Add(cfg.MissingAfter + time.Hour)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s := Stability(suiteK, "v1", runs, cfg, at)
		runtime.ReadMemStats(&after)
		if b := after.TotalAlloc - before.TotalAlloc; b > 64<<10 {
			t.Fatalf("runs=%d: Stability allocated %d bytes, want under 64 KiB", planned, b)
		}
		want := []schemas.MissingRuns{{CaseID: "huge", Count: planned - 1, RunIndexes: []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}}
		if !slices.EqualFunc(s.MissingRuns, want, func(a, b schemas.MissingRuns) bool {
			return a.CaseID == b.CaseID && a.Count == b.Count && slices.Equal(a.RunIndexes, b.RunIndexes)
		}) || s.MissingRunsTotal != planned-1 || s.Runs != planned {
			t.Fatalf("runs=%d: missing %+v total %d runs %d", planned, s.MissingRuns, s.MissingRunsTotal, s.Runs)
		}
		if allocs := testing.AllocsPerRun(10, func() { Stability(suiteK, "v1", runs, cfg, at) }); allocs > 100 {
			t.Fatalf("runs=%d: %v allocations per Stability call", planned, allocs)
		}
	}
}

func TestSuiteConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		err  bool
	}{
		// Judging every version works with any history.
		{"all versions", Config{MinHistory: 5}, false},
		// A window as long as the history needed can judge.
		{"window equals min_history", Config{MinHistory: 5, JudgeLastVersions: 5}, false},
		{"window above min_history", Config{MinHistory: 3, JudgeLastVersions: 10}, false},
		// A window shorter than min_history leaves every case too_new.
		{"window below min_history", Config{MinHistory: 5, JudgeLastVersions: 4}, true},
		// The default min_history (5) is what the window is held to.
		{"window below default min_history", Config{JudgeLastVersions: 3}, true},
		// A negative window means nothing.
		{"negative window", Config{JudgeLastVersions: -1}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (err != nil) != tc.err {
				t.Fatalf("Validate() = %v, want error %v", err, tc.err)
			}
			if err != nil && tc.cfg.JudgeLastVersions > 0 &&
				(!strings.Contains(err.Error(), "judge_last_versions") || !strings.Contains(err.Error(), "min_history")) {
				t.Fatalf("error %q must name judge_last_versions and min_history", err)
			}
		})
	}
}

// graded is an eval result of suiteK version v1 with the given case and reply, assessed d after t0,
// as FromEvalRun makes it.
func graded(c string, d time.Duration, reply string, mode ReplyMode) RunObservation {
	o := RunObservation{Key: RunKey{Key: suiteK, Version: "v1", Case: c},
		Record: RunRecord{Result: 'f', VersionSeq: 1, Runs: 1, Occurred: aggregator.Micros(t0), Assessed: aggregator.Micros(t0.Add(d))}}
	o.Stats = AnalyzeReply(reply, mode)
	o.Record.Reply, o.Record.Tokens, o.Record.GzipRatio, o.Record.Trigger = true, o.Stats.Tokens, o.Stats.GzipRatio, o.Stats.Trigger
	return o
}

// alertID is what an abnormal-sample alert's CloudEvent id is made of (sink.AbnormalOut): its run,
// metric, token count and gzip ratio.
func alertID(a schemas.AbnormalSample) string {
	return fmt.Sprintf("%s|%s|%s|%s|%d %s|%d|%g", a.Workspace, a.Suite, a.Version, a.CaseID, a.RunIndex, a.Metric, a.Tokens, a.GzipRatio)
}

// TestAbnormalAlertsIndependentOfBatching: the abnormal-sample alerts a stream publishes are the
// same however it is cut into batches and whatever a crash between a batch's suite apply and its
// publish makes the consumer deliver again. Alerts used to be raised only for runs whose stored
// record was the batch's own observation, and in OpenCompass mode only above the percentile
// length of the moment: a reply and its re-grade redelivered in one batch published only the
// re-grade's alert.
func TestAbnormalAlertsIndependentOfBatching(t *testing.T) {
	loop := graded("c1", time.Microsecond, strings.Repeat("loop ", 200), ReplyDefault)
	regrade := graded("c1", 2*time.Microsecond, strings.Repeat("again and ", 150), ReplyDefault)
	fine := graded("c1", 3*time.Microsecond, "The refund is accepted within thirty days.", ReplyDefault)
	ocLoop := graded("c1", time.Microsecond, "Refunds are accepted. "+strings.Repeat("a b c d e f g h ", 200), ReplyOpenCompass)
	var words []string
	for i := range 2000 {
		words = append(words, fmt.Sprint("w", i))
	}
	var longer []RunObservation // replies of other cases, longer than ocLoop's and normal
	for i := range 4 {
		longer = append(longer, graded(fmt.Sprint("long", i), 0, strings.Join(words[i:], " "), ReplyOpenCompass))
	}
	for _, o := range append([]RunObservation{loop, regrade, ocLoop}, longer...) {
		if want := o.Key.Case == "c1"; (o.Record.Trigger != "") != want {
			t.Fatalf("reply of %s: trigger %q", o.Key.Case, o.Record.Trigger)
		}
	}
	type step struct {
		batch     []RunObservation
		published bool // false: applied, then a crash before its outputs were published
	}
	tests := []struct {
		name   string
		mode   ReplyMode
		stream []RunObservation // in order; the reference is one batch per result, all published
		steps  []step           // how the consumer delivered it
	}{
		// The review's case: the crash loses [loop]'s alert and the redelivery re-cuts the batches.
		{"re-grade redelivered with the original", ReplyDefault, []RunObservation{loop, regrade},
			[]step{{[]RunObservation{loop}, false}, {[]RunObservation{loop, regrade}, true}}},
		// The same with a normal re-grade: the original's alert must not depend on it.
		{"normal re-grade redelivered with the original", ReplyDefault, []RunObservation{loop, fine},
			[]step{{[]RunObservation{loop}, false}, {[]RunObservation{loop, fine}, true}}},
		// The re-grade arrives first: the original is stale, and alerts all the same.
		{"stale original in one batch", ReplyDefault, []RunObservation{regrade, loop},
			[]step{{[]RunObservation{regrade, loop}, true}}},
		// A result sent twice and redelivered: one alert id.
		{"duplicate", ReplyDefault, []RunObservation{loop, loop},
			[]step{{[]RunObservation{loop}, true}, {[]RunObservation{loop}, false}, {[]RunObservation{loop, loop}, true}}},
		// OpenCompass: longer replies in the same batch raise the version's percentile length
		// past the abnormal reply; the percentile gate no longer decides alerts.
		{"opencompass percentile moved by the batch", ReplyOpenCompass, append([]RunObservation{ocLoop}, longer...),
			[]step{{[]RunObservation{ocLoop}, false}, {append([]RunObservation{ocLoop}, longer...), true}}},
	}
	ctx := context.Background()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{ReplyMode: tc.mode}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			publish := func(store *Memory, batch []RunObservation, into map[string]bool) {
				applied, err := store.Apply(ctx, batch, t0)
				if err != nil {
					t.Fatal(err)
				}
				if into != nil {
					for _, a := range BuildOutput(applied, batch, cfg, t0).Abnormal {
						into[alertID(a)] = true
					}
				}
			}
			want, clean := map[string]bool{}, NewMemory(cfg)
			for _, o := range tc.stream {
				publish(clean, []RunObservation{o}, want)
			}
			got, store := map[string]bool{}, NewMemory(cfg)
			for _, s := range tc.steps {
				into := got
				if !s.published {
					into = nil
				}
				publish(store, s.batch, into)
			}
			if len(want) == 0 {
				t.Fatal("the stream raises no alert: the case checks nothing")
			}
			if !maps.Equal(got, want) {
				t.Fatalf("alerts published %v, one result per batch publishes %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
			}
		})
	}
}
