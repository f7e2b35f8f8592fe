package sink_test

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

var limitsNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// Worst-case values of the fields that are not input text: the longest JSON numbers and times.
var (
	worstTime  = time.Date(2199, 12, 31, 23, 59, 59, 999999999, time.UTC) // 30 characters in RFC 3339
	worstFloat = -2.2250738585072014e-308                                 // 24 characters in JSON
	worstInt   = math.MaxInt64                                            // 19 digits
)

func worstF() *float64 { f := worstFloat; return &f }

// fillers are the byte classes an identity field may hold, each with its own expansion into a
// record: a control character is percent-escaped in key and subject (3+3) and \u-escaped in data
// (6); '<' is HTML-escaped in data; non-ASCII is percent-escaped; U+2028 is escaped everywhere.
var fillers = []string{"a", "\x01", "<", `"`, "%", "\x7f", "é", "\u2028", "😀"}

// fill returns exactly n bytes of valid UTF-8 made of f, padded with 'a'.
func fill(f string, n int) string {
	s := strings.Repeat(f, n/len(f))
	return s + strings.Repeat("a", n-len(s))
}

// binaryEvent is a binary-mode CloudEvent message of type typ with data d.
func binaryEvent(t *testing.T, typ string, d map[string]any) kafka.Message {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return kafka.Message{Value: b, Headers: []kafka.Header{
		{Key: "ce_specversion", Value: []byte("1.0")}, {Key: "ce_id", Value: []byte("e")},
		{Key: "ce_source", Value: []byte("s")}, {Key: "ce_type", Value: []byte(typ)},
		{Key: "content-type", Value: []byte("application/json")}}}
}

// evalData is an eval result (a correction check) whose identity fields all hold id, except the
// fields named in over, which hold id and one more byte.
func evalData(id string, runs int, over ...string) map[string]any {
	v := func(name string) string {
		for _, o := range over {
			if o == name {
				return id + "a"
			}
		}
		return id
	}
	return map[string]any{
		"scope": map[string]any{"workspace": v("scope.workspace"), "model": v("scope.model"), "run": v("scope.run"),
			"checkpoint": v("scope.checkpoint"), "artifact": v("scope.artifact")},
		"suite": v("suite"), "case_id": v("case_id"), "version": v("version"), "version_seq": 1,
		"run_index": runs - 1, "runs": runs, "result": "fail", "prediction": strings.Repeat("again ", 100),
		"correction_id": v("correction_id"), "opportunity_id": v("opportunity_id"),
		"occurred_at": "2026-11-29T11:00:00Z", "assessed_at": "2026-11-29T11:00:00Z",
	}
}

func liveData(id string, over ...string) map[string]any {
	d := evalData(id, 1, over...)
	for _, k := range []string{"suite", "case_id", "version", "version_seq", "run_index", "runs", "result", "prediction"} {
		delete(d, k)
	}
	d["outcome"] = schemas.OutcomeConfirmedRepeat
	return d
}

// worstOutputs are the outputs of the largest valid eval result, with every other field at its
// longest and every list at and beyond its cap.
func worstOutputs(t *testing.T, ev cloudevent.Event) map[string]sink.Out {
	t.Helper()
	r := ev.Eval
	o, ok := ev.Observation()
	if !ok {
		t.Fatal("not a correction check")
	}
	c := aggregator.Counts{Confirmed: int64(worstInt), Passed: int64(worstInt), Unscored: int64(worstInt)}
	snap := aggregator.Tally{All: c, Hour: c, Day: c, Week: c, First: aggregator.Micros(worstTime), Last: aggregator.Micros(worstTime),
		Version: int64(worstInt)}.Snapshot(o.Key, worstTime)
	snap.ObservedAt, snap.OpportunityWindow = worstTime, &schemas.Span{First: worstTime, Last: worstTime}
	for _, w := range []*schemas.Window{&snap.Windows.All, &snap.Windows.Hour, &snap.Windows.Day, &snap.Windows.Week} {
		w.Rate, w.Percentage, w.CI95 = worstF(), worstF(), &schemas.Interval{Low: worstFloat, High: worstFloat}
		w.Status = schemas.StatusNotMeasured
	}

	revived := make([]string, 10*schemas.MaxListedCases) // ten times the cap: cut when published
	for i := range revived {
		revived[i] = r.CaseID
	}
	disc := schemas.SuiteDiscrimination{Workspace: r.Scope.Workspace, Suite: r.Suite, MinHistory: worstInt,
		JudgeLastVersions: worstInt, VersionsSeen: worstInt, AlwaysPass: worstInt, AlwaysFail: worstInt,
		Discriminating: worstInt, TooNew: worstInt, Judged: worstInt, Floor: worstF(), Ceiling: worstF(),
		AchievableRange: worstF(), LatestVersion: r.Version, LatestPassRate: worstF(), LatestPassRateDiscriminating: worstF(),
		Revived: revived, RevivedTotal: worstInt, ObservedAt: worstTime}

	cfg := suite.Config{}
	cfg.Validate() // default G-Pass@k thresholds
	stab := schemas.SuiteStability{Workspace: r.Scope.Workspace, Suite: r.Suite, Version: r.Version, Runs: schemas.MaxRuns,
		Cases: worstInt, Mean: worstF(), StdDev: worstF(), Min: worstF(), Max: worstF(),
		PassAtK: map[string]*float64{}, GPassAtK: map[string]map[string]*float64{}, MGPassAtK: map[string]*float64{},
		ReplyLength:     schemas.ReplyLength{Count: worstInt, Mean: worstF(), P75: worstF(), P90: worstF()},
		AbnormalSamples: worstInt, MissingRunsTotal: int64(worstInt), ObservedAt: worstTime}
	for range schemas.MaxRuns { // one score per run at most: run_index < runs <= MaxRuns
		stab.RunScores = append(stab.RunScores, worstFloat)
	}
	for i := range schemas.MaxPassAtK { // k <= MaxRuns
		k := strconv.Itoa(schemas.MaxRuns - i)
		stab.PassAtK[k], stab.MGPassAtK[k] = worstF(), worstF()
		stab.GPassAtK[k] = map[string]*float64{}
		for _, tau := range cfg.Taus {
			stab.GPassAtK[k][strconv.FormatFloat(tau, 'f', -1, 64)] = worstF()
		}
	}
	for range 10 * schemas.MaxListedCases {
		m := schemas.MissingRuns{CaseID: r.CaseID, Count: int64(worstInt)}
		for j := range schemas.MaxMissingRunIndexes {
			m.RunIndexes = append(m.RunIndexes, int64(schemas.MaxRuns-1-j))
		}
		stab.MissingRuns = append(stab.MissingRuns, m)
	}

	rev := schemas.CaseRevived{Workspace: r.Scope.Workspace, Suite: r.Suite, CaseID: r.CaseID, Version: r.Version,
		From: "pass", To: "fail", Streak: worstInt, Regression: true}
	ab := schemas.AbnormalSample{Workspace: r.Scope.Workspace, Suite: r.Suite, Version: r.Version, CaseID: r.CaseID,
		RunIndex: r.RunIndex, Metric: "repeat_pattern", Tokens: worstInt, GzipRatio: worstFloat,
		Fragment: fill(r.Scope.Workspace[:1], 10*schemas.MaxFragmentBytes), Repeats: worstInt, FragmentShare: worstFloat}
	return map[string]sink.Out{
		"snapshot":        sink.SnapshotOut(&snap),
		"discrimination":  sink.DiscriminationOut(&disc),
		"stability":       sink.StabilityOut(&stab),
		"case revived":    sink.RevivedOut(&rev, worstTime),
		"abnormal sample": sink.AbnormalOut(&ab, worstTime),
	}
}

// TestOutputLimits: the largest input that passes validation — every identity field at
// schemas.MaxIdentityBytes of the most expensive byte class, runs at schemas.MaxRuns — produces
// outputs, every number, time and list at its longest, that fit sink.MaxRecordBytes as the real
// encoders write them; one byte more in any field, or one run more, is dead-lettered with its
// reason. (The regression of issue 9: a 330 KB non-ASCII workspace was valid and its snapshot
// record was 2.2 MB.)
func TestOutputLimits(t *testing.T) {
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	worst := map[string]int{}
	worstBy := map[string]string{}
	for _, f := range fillers {
		id := fill(f, schemas.MaxIdentityBytes)
		m := binaryEvent(t, schemas.TypeEvalResult, evalData(id, schemas.MaxRuns))
		ev, err := dec.Decode(&m, limitsNow)
		if err != nil {
			t.Fatalf("filler %q: the largest valid eval result is rejected: %v", f, err)
		}
		lm := binaryEvent(t, schemas.TypeLiveAttempt, liveData(id))
		if _, err := dec.Decode(&lm, limitsNow); err != nil {
			t.Fatalf("filler %q: the largest valid live attempt is rejected: %v", f, err)
		}
		for name, o := range worstOutputs(t, ev) {
			rec, err := sink.Record(&o, limitsNow)
			if err != nil {
				t.Fatal(err)
			}
			if n := sink.RecordSize(&rec); n > worst[name] {
				worst[name], worstBy[name] = n, f
			}
		}
	}
	for name, n := range worst {
		t.Logf("%-16s worst record %7d bytes (filler %q), limit %d", name, n, worstBy[name], sink.MaxRecordBytes)
		if n > sink.MaxRecordBytes {
			t.Errorf("%s: the largest valid input gives a %d-byte record, above MaxRecordBytes %d", name, n, sink.MaxRecordBytes)
		}
	}

	// One byte more, in each field that reaches an output, or one run more: dead-lettered.
	id := fill("\x01", schemas.MaxIdentityBytes)
	over := []struct {
		name   string
		msg    kafka.Message
		reason schemas.Reason
	}{
		{"runs", binaryEvent(t, schemas.TypeEvalResult, evalData(id, schemas.MaxRuns+1)), schemas.ReasonBadValue},
		{"330 KB non-ASCII workspace", binaryEvent(t, schemas.TypeLiveAttempt, map[string]any{
			"scope":          map[string]any{"workspace": strings.Repeat("é", 165<<10), "model": "m", "run": "r", "checkpoint": "c", "artifact": "a"},
			"opportunity_id": "o", "correction_id": "c", "outcome": "passed",
			"occurred_at": "2026-11-29T11:00:00Z", "assessed_at": "2026-11-29T11:00:00Z"}), schemas.ReasonTooLarge},
	}
	for _, f := range []string{"scope.workspace", "scope.model", "scope.run", "scope.checkpoint", "scope.artifact",
		"correction_id", "opportunity_id", "suite", "case_id", "version"} {
		over = append(over, struct {
			name   string
			msg    kafka.Message
			reason schemas.Reason
		}{"eval " + f, binaryEvent(t, schemas.TypeEvalResult, evalData(id, schemas.MaxRuns, f)), schemas.ReasonTooLarge})
		if !strings.HasPrefix(f, "scope.") && f != "correction_id" && f != "opportunity_id" {
			continue
		}
		over = append(over, struct {
			name   string
			msg    kafka.Message
			reason schemas.Reason
		}{"live " + f, binaryEvent(t, schemas.TypeLiveAttempt, liveData(id, f)), schemas.ReasonTooLarge})
	}
	for _, tc := range over {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dec.Decode(&tc.msg, limitsNow)
			if schemas.ReasonOf(err) != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
		})
	}
}

// TestSuiteListsCapped: suite snapshots list at most MaxListedCases cases and say how many there
// are; abnormal samples quote at most MaxFragmentBytes.
func TestSuiteListsCapped(t *testing.T) {
	cases := make([]string, schemas.MaxListedCases+5)
	missing := make([]schemas.MissingRuns, schemas.MaxListedCases+5)
	for i := range cases {
		cases[i] = "case-" + strconv.Itoa(i)
		missing[i] = schemas.MissingRuns{CaseID: cases[i], Count: 1, RunIndexes: []int64{0}}
	}
	d := schemas.SuiteDiscrimination{Workspace: "w", Suite: "s", Revived: cases}
	var gotD schemas.SuiteDiscrimination
	decodeData(t, sink.DiscriminationOut(&d), &gotD)
	if len(gotD.Revived) != schemas.MaxListedCases || gotD.RevivedTotal != len(cases) || gotD.Revived[0] != "case-0" {
		t.Errorf("revived lists %d (first %q), total %d; want %d of %d", len(gotD.Revived), gotD.Revived[0], gotD.RevivedTotal,
			schemas.MaxListedCases, len(cases))
	}
	if len(d.Revived) != len(cases) {
		t.Errorf("the caller's snapshot was changed")
	}
	s := schemas.SuiteStability{Workspace: "w", Suite: "s", Version: "v", MissingRuns: missing, MissingRunsTotal: int64(len(missing))}
	var gotS schemas.SuiteStability
	decodeData(t, sink.StabilityOut(&s), &gotS)
	if len(gotS.MissingRuns) != schemas.MaxListedCases || gotS.MissingRunsTotal != int64(len(missing)) {
		t.Errorf("missing_runs lists %d cases, total %d", len(gotS.MissingRuns), gotS.MissingRunsTotal)
	}
	a := schemas.AbnormalSample{Fragment: strings.Repeat("é", schemas.MaxFragmentBytes)}
	var gotA schemas.AbnormalSample
	decodeData(t, sink.AbnormalOut(&a, limitsNow), &gotA)
	if len(gotA.Fragment) != schemas.MaxFragmentBytes || gotA.Fragment != strings.Repeat("é", schemas.MaxFragmentBytes/2) {
		t.Errorf("fragment of %d bytes: %q", len(gotA.Fragment), gotA.Fragment)
	}
}

func decodeData(t *testing.T, o sink.Out, v any) {
	t.Helper()
	b, err := sink.Encode(&o)
	if err != nil {
		t.Fatal(err)
	}
	var e struct{ Data json.RawMessage }
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(e.Data, v); err != nil {
		t.Fatal(err)
	}
}

// A compressing writer's batches leave compression's room below the topic's limit, and the
// smallest output topic it accepts still holds the largest output record.
func TestCompressedBatchBytesHoldTheLargestRecord(t *testing.T) {
	for _, limit := range []int{sink.MinCompressedTopicLimit, sink.DefaultTopicLimit, 16 << 20} {
		n := sink.CompressedWriterBatchBytes(limit)
		if room := sink.WriterBatchBytes(limit) - n; room < int64(sink.CompressionOverhead(int(n))) {
			t.Errorf("limit %d: %d bytes left for compression, under its overhead bound", limit, room)
		}
		if n < sink.MaxRecordBytes {
			t.Errorf("limit %d: compressed batches of %d bytes cannot hold a %d-byte record", limit, n, sink.MaxRecordBytes)
		}
	}
	if n := sink.CompressedWriterBatchBytes(sink.MinCompressedTopicLimit - 1); n >= sink.MaxRecordBytes {
		t.Errorf("MinCompressedTopicLimit is not the smallest: one byte less still holds %d", n)
	}
}
