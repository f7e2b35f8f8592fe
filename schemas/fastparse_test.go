package schemas

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The reference: ParseLiveAttempt and ParseEvalResult as they were before the fast paths, kept
// here unchanged so that the tests below hold today's parsers to exactly their outcomes.

// refParseLiveAttempt (reference) decodes and validates live-attempt data received at now. Errors wrap ErrInvalid.
func refParseLiveAttempt(data []byte, now time.Time, lim Limits) (LiveAttempt, error) {
	var w liveWire
	if err := unmarshalObject(data, &w, false); err != nil {
		return LiveAttempt{}, err
	}
	a := LiveAttempt{
		OpportunityID:  w.OpportunityID,
		CorrectionID:   w.CorrectionID,
		Outcome:        w.Outcome,
		UnscoredReason: w.UnscoredReason,
	}
	var err error
	if a.Scope, err = checkScope(w.Scope); err != nil {
		return LiveAttempt{}, err
	}
	if err = required("opportunity_id", a.OpportunityID, "correction_id", a.CorrectionID); err != nil {
		return LiveAttempt{}, err
	}
	if err = bounded("opportunity_id", a.OpportunityID, "correction_id", a.CorrectionID); err != nil {
		return LiveAttempt{}, err
	}
	switch a.Outcome {
	case OutcomeConfirmedRepeat, OutcomePassed, OutcomeUnscored:
	case "":
		return LiveAttempt{}, Invalid(ReasonMissingField, "outcome is required")
	default:
		return LiveAttempt{}, Invalid(ReasonBadEnum, "outcome %q is not confirmed_repeat, passed or unscored", clip(a.Outcome))
	}
	if a.OccurredAt, a.AssessedAt, a.AssessmentSeq, err = refCheckTimes(w.OccurredAt, w.AssessedAt, w.AssessmentSeq, now, lim); err != nil {
		return LiveAttempt{}, err
	}
	return a, nil
}

// refParseEvalResult (reference) decodes and validates eval-result data received at now. Errors wrap ErrInvalid.
func refParseEvalResult(data []byte, now time.Time, lim Limits) (EvalResult, error) {
	var w evalWire
	if err := unmarshalObject(data, &w, true); err != nil {
		return EvalResult{}, err
	}
	r := EvalResult{
		Suite: w.Suite, CaseID: w.CaseID, Version: w.Version, Result: w.Result,
		Score: w.Score, Prediction: w.Prediction,
		CorrectionID: w.CorrectionID, OpportunityID: w.OpportunityID,
	}
	var err error
	if r.Scope, err = checkScope(w.Scope); err != nil {
		return EvalResult{}, err
	}
	if err = required("suite", r.Suite, "case_id", r.CaseID, "version", r.Version); err != nil {
		return EvalResult{}, err
	}
	if err = bounded("suite", r.Suite, "case_id", r.CaseID, "version", r.Version,
		"correction_id", r.CorrectionID, "opportunity_id", r.OpportunityID); err != nil {
		return EvalResult{}, err
	}
	if r.VersionSeq, err = refInteger("version_seq", w.VersionSeq, true, 0, MaxAssessmentSeq); err != nil {
		return EvalResult{}, err
	}
	if r.RunIndex, err = refInteger("run_index", w.RunIndex, true, 0, 1<<31-1); err != nil {
		return EvalResult{}, err
	}
	if r.Runs, err = refInteger("runs", w.Runs, true, 1, 1<<31-1); err != nil {
		return EvalResult{}, err
	}
	if r.Runs > MaxRuns {
		return EvalResult{}, Invalid(ReasonBadValue, "runs %d is above the limit of %d planned runs", r.Runs, MaxRuns)
	}
	if r.RunIndex >= r.Runs {
		return EvalResult{}, Invalid(ReasonBadValue, "run_index %d is not below runs %d", r.RunIndex, r.Runs)
	}
	switch r.Result {
	case ResultPass, ResultFail, ResultError:
	case "":
		return EvalResult{}, Invalid(ReasonMissingField, "result is required")
	default:
		return EvalResult{}, Invalid(ReasonBadEnum, "result %q is not pass, fail or error", clip(r.Result))
	}
	if r.Score != nil && !(*r.Score >= 0 && *r.Score <= 1) {
		return EvalResult{}, Invalid(ReasonBadValue, "score %v is outside 0..1", *r.Score)
	}
	if r.Prediction != nil && len(*r.Prediction) > lim.MaxPredictionBytes {
		return EvalResult{}, Invalid(ReasonTooLarge, "prediction is %d bytes, limit %d", len(*r.Prediction), lim.MaxPredictionBytes)
	}
	if len(w.ReplyTokens) > 0 && string(w.ReplyTokens) != "null" { // a field added after the fast paths
		n, err := integer("reply_tokens", w.ReplyTokens, true, 0, MaxReplyTokens)
		if err != nil {
			return EvalResult{}, err
		}
		r.ReplyTokens = &n
	}
	if (r.CorrectionID == "") != (r.OpportunityID == "") {
		return EvalResult{}, Invalid(ReasonMissingField, "correction_id and opportunity_id go together: a correction check needs both")
	}
	if r.OccurredAt, r.AssessedAt, r.AssessmentSeq, err = refCheckTimes(w.OccurredAt, w.AssessedAt, w.AssessmentSeq, now, lim); err != nil {
		return EvalResult{}, err
	}
	return r, nil
}

func refCheckTimes(occurred, assessed string, seqRaw json.RawMessage, now time.Time, lim Limits) (time.Time, time.Time, int64, error) {
	occ, err := refParseTime("occurred_at", occurred)
	if err != nil {
		return time.Time{}, time.Time{}, 0, err
	}
	if occ.After(now.Add(lim.MaxFutureSkew)) {
		return time.Time{}, time.Time{}, 0, Invalid(ReasonFutureEvent, "occurred_at %s is more than %s after %s",
			occ.Format(time.RFC3339), lim.MaxFutureSkew, now.UTC().Format(time.RFC3339))
	}
	asd, err := refParseTime("assessed_at", assessed)
	if err != nil {
		return time.Time{}, time.Time{}, 0, err
	}
	// A far-future assessment would win against every later re-assessment of its opportunity.
	if asd.After(now.Add(lim.MaxFutureSkew)) {
		return time.Time{}, time.Time{}, 0, Invalid(ReasonFutureEvent, "assessed_at %s is more than %s after %s",
			asd.Format(time.RFC3339), lim.MaxFutureSkew, now.UTC().Format(time.RFC3339))
	}
	seq, err := refInteger("assessment_seq", seqRaw, false, 0, MaxAssessmentSeq)
	if err != nil {
		return time.Time{}, time.Time{}, 0, err
	}
	return occ, asd, seq, nil
}

func refParseTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, Invalid(ReasonMissingField, "%s is required", name)
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, Invalid(ReasonBadTime, "%s %q is not an RFC 3339 time", name, clip(s))
	}
	if t.Before(minTime) || !t.Before(maxTime) {
		return time.Time{}, Invalid(ReasonBadTime, "%s %q is outside 1970..2200", name, clip(s))
	}
	return t.UTC(), nil
}

// refInteger parses an optional or required JSON integer within [lo, hi].
func refInteger(name string, raw json.RawMessage, needed bool, lo, hi int64) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		if needed {
			return 0, Invalid(ReasonMissingField, "%s is required", name)
		}
		return 0, nil
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return 0, Invalid(ReasonBadValue, "%s is not a number", name)
	}
	if f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		return 0, Invalid(ReasonBadValue, "%s %s is not an integer in %d..%d", name, clip(string(raw)), lo, hi)
	}
	return int64(f), nil
}

// parseBoth parses data as live-attempt (eval false) or eval-result data with the parser under
// test p (nil: the package functions) and with the reference.
func parseBoth(p *Parser, data []byte, eval bool, now time.Time) (got, want any, gotErr, wantErr error) {
	if eval {
		var g EvalResult
		if p == nil {
			g, gotErr = ParseEvalResult(data, now, DefaultLimits)
		} else {
			g, gotErr = p.EvalResult(data, now)
		}
		w, wantErr := refParseEvalResult(data, now, DefaultLimits)
		return g, w, gotErr, wantErr
	}
	var g LiveAttempt
	if p == nil {
		g, gotErr = ParseLiveAttempt(data, now, DefaultLimits)
	} else {
		g, gotErr = p.LiveAttempt(data, now)
	}
	w, wantErr := refParseLiveAttempt(data, now, DefaultLimits)
	return g, w, gotErr, wantErr
}

// sameOutcome fails t unless got and want are the same value (a score's sign bit included, time
// locations too) or the same error (reason and detail).
func sameOutcome(t *testing.T, data []byte, got, want any, gotErr, wantErr error) {
	t.Helper()
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%q:\ngot  %+v, %v\nwant %+v, %v", data, got, gotErr, want, wantErr)
	}
	if wantErr != nil {
		var g, w *InvalidError
		if !errors.As(gotErr, &g) || !errors.As(wantErr, &w) || *g != *w {
			t.Fatalf("%q: error %v, want %v", data, gotErr, wantErr)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\ngot  %+v\nwant %+v", data, got, want)
	}
	if g, ok := got.(EvalResult); ok {
		w := want.(EvalResult)
		if (g.Score == nil) != (w.Score == nil) || g.Score != nil && math.Float64bits(*g.Score) != math.Float64bits(*w.Score) {
			t.Fatalf("%q: score %v, want %v", data, g.Score, w.Score)
		}
	}
}

const validEval = `{"scope":{"workspace":"acme","model":"support-bot","run":"2026-11","checkpoint":"ckpt-42","artifact":"prod"},"suite":"regressions","case_id":"refund-17","version":"v12","version_seq":12,"run_index":3,"runs":5,"result":"fail","score":0.25,"prediction":"You can return it\nwithin 90 days.","correction_id":"refund-policy-fix","opportunity_id":"refund-17/v12/3","occurred_at":"2026-11-29T09:00:00.123456Z","assessed_at":"2026-11-29T09:00:05Z"}`

// TestFastDataAgrees: the edge cases of the fast paths, each parsed by ParseLiveAttempt or
// ParseEvalResult and by a Parser (twice: its string table empty, then holding the strings) to
// the reference's outcome; fast says whether the fast path itself must take the input (the usual
// forms must not fall back to the slow decoder, or the speed is lost).
func TestFastDataAgrees(t *testing.T) {
	live := func(from, to string) string { return strings.Replace(validLive, from, to, 1) }
	eval := func(from, to string) string { return strings.Replace(validEval, from, to, 1) }
	const occ = `"occurred_at":"2026-11-29T11:00:00Z"`
	tests := []struct {
		name string
		data string
		eval bool
		fast bool
	}{
		{"live", validLive, false, true},
		{"eval", validEval, true, true},
		{"eval golden file", mustRead(t, "testdata/eval_result.json"), true, true},
		{"white space around", " \n\t" + validLive + "\r\n ", false, true},
		{"unicode space around", "\u00a0" + validLive + "\u0085", false, true},
		// Numbers: assessment_seq, version_seq, run_index and runs go through a float64.
		{"seq 0", live(`"outcome"`, `"assessment_seq":0,"outcome"`), false, true},
		{"seq max", live(`"outcome"`, `"assessment_seq":9007199254740991,"outcome"`), false, true},
		{"seq 2^53", live(`"outcome"`, `"assessment_seq":9007199254740992,"outcome"`), false, false},
		{"seq 2^53+1 rounds to 2^53", live(`"outcome"`, `"assessment_seq":9007199254740993,"outcome"`), false, false},
		{"seq 2^53-1 as 9.007199254740991e15", live(`"outcome"`, `"assessment_seq":9.007199254740991e15,"outcome"`), false, true},
		{"seq 15 digits", live(`"outcome"`, `"assessment_seq":999999999999999,"outcome"`), false, true},
		{"seq 1.0", live(`"outcome"`, `"assessment_seq":1.0,"outcome"`), false, true},
		{"seq 1e2", live(`"outcome"`, `"assessment_seq":1e2,"outcome"`), false, true},
		{"seq 1E+2", live(`"outcome"`, `"assessment_seq":1E+2,"outcome"`), false, true},
		{"seq 150e-2", live(`"outcome"`, `"assessment_seq":150e-2,"outcome"`), false, false},
		{"seq 1500e-2", live(`"outcome"`, `"assessment_seq":1500e-2,"outcome"`), false, true},
		{"seq -0", live(`"outcome"`, `"assessment_seq":-0,"outcome"`), false, true},
		{"seq -0.0e0", live(`"outcome"`, `"assessment_seq":-0.0e0,"outcome"`), false, true},
		{"seq -1", live(`"outcome"`, `"assessment_seq":-1,"outcome"`), false, false},
		{"seq 1e400", live(`"outcome"`, `"assessment_seq":1e400,"outcome"`), false, false},
		{"seq 1e-400", live(`"outcome"`, `"assessment_seq":1e-400,"outcome"`), false, true},
		{"seq 01", live(`"outcome"`, `"assessment_seq":01,"outcome"`), false, false},
		{"seq 1.", live(`"outcome"`, `"assessment_seq":1.,"outcome"`), false, false},
		{"seq .5", live(`"outcome"`, `"assessment_seq":.5,"outcome"`), false, false},
		{"seq +1", live(`"outcome"`, `"assessment_seq":+1,"outcome"`), false, false},
		{"seq 1e", live(`"outcome"`, `"assessment_seq":1e,"outcome"`), false, false},
		{"seq null", live(`"outcome"`, `"assessment_seq":null,"outcome"`), false, true},
		{"seq string", live(`"outcome"`, `"assessment_seq":"1","outcome"`), false, false},
		{"seq true", live(`"outcome"`, `"assessment_seq":true,"outcome"`), false, false},
		{"version_seq null", eval(`"version_seq":12`, `"version_seq":null`), true, false},
		{"version_seq 2^53-1", eval(`"version_seq":12`, `"version_seq":9007199254740991`), true, true},
		{"runs 2^31-1 over MaxRuns", eval(`"runs":5`, `"runs":2147483647`), true, false},
		{"runs 1e4", eval(`"runs":5`, `"runs":1e4`), true, true},
		{"run_index = runs", eval(`"run_index":3`, `"run_index":5`), true, false},
		{"score 1", eval(`"score":0.25`, `"score":1`), true, true},
		{"score 0.1", eval(`"score":0.25`, `"score":0.1`), true, true},
		{"score 0.333333333333333", eval(`"score":0.25`, `"score":0.333333333333333`), true, true},
		{"score 17 digits", eval(`"score":0.25`, `"score":0.33333333333333331`), true, true},
		{"score 2.5e-1", eval(`"score":0.25`, `"score":2.5e-1`), true, true},
		{"score -0", eval(`"score":0.25`, `"score":-0`), true, false},
		{"score 1.0000000000000001", eval(`"score":0.25`, `"score":1.0000000000000001`), true, true},
		{"score 1.5", eval(`"score":0.25`, `"score":1.5`), true, false},
		{"score null", eval(`"score":0.25`, `"score":null`), true, true},
		{"no score", eval(`"score":0.25,`, ``), true, true},
		{"reply_tokens 0", eval(`"score":0.25`, `"score":0.25,"reply_tokens":0`), true, true},
		{"reply_tokens 2^31-1", eval(`"score":0.25`, `"score":0.25,"reply_tokens":2147483647`), true, true},
		{"reply_tokens 2^31", eval(`"score":0.25`, `"score":0.25,"reply_tokens":2147483648`), true, false},
		{"reply_tokens 1e3", eval(`"score":0.25`, `"score":0.25,"reply_tokens":1e3`), true, true},
		{"reply_tokens 1.5", eval(`"score":0.25`, `"score":0.25,"reply_tokens":1.5`), true, false},
		{"reply_tokens -1", eval(`"score":0.25`, `"score":0.25,"reply_tokens":-1`), true, false},
		{"reply_tokens null", eval(`"score":0.25`, `"score":0.25,"reply_tokens":null`), true, true},
		{"reply_tokens string", eval(`"score":0.25`, `"score":0.25,"reply_tokens":"7"`), true, false},
		{"reply_tokens twice", eval(`"score":0.25`, `"score":0.25,"reply_tokens":7,"reply_tokens":8`), true, false},
		{"prediction null", eval(`"prediction":"You can return it\nwithin 90 days."`, `"prediction":null`), true, true},
		{"prediction escapes", eval(`"You can return it\nwithin 90 days."`, `"tab\t quote\" slash\/ \\ \b\f\r \u00e9 \ud83d\ude00 \u0000"`), true, true},
		{"prediction lone surrogate", eval(`"You can return it\nwithin 90 days."`, `"\ud800"`), true, false},
		{"prediction invalid UTF-8", eval(`"You can return it\nwithin 90 days."`, "\"\xff\""), true, false},
		{"prediction at limit", eval(`"You can return it\nwithin 90 days."`, `"`+strings.Repeat("x", 64<<10)+`"`), true, true},
		{"prediction over limit by an escape", eval(`"You can return it\nwithin 90 days."`, `"`+strings.Repeat("x", 64<<10-1)+`\n\n"`), true, false},
		// Times: the form of time's fast path; other forms, and bad ones, go to time.Parse.
		{"time fraction", live(occ, `"occurred_at":"2026-11-29T11:00:00.5Z"`), false, true},
		{"time 9 digits", live(occ, `"occurred_at":"2026-11-29T11:00:00.123456789Z"`), false, true},
		{"time 12 digits", live(occ, `"occurred_at":"2026-11-29T11:00:00.123456789999Z"`), false, true},
		{"time offset", live(occ, `"occurred_at":"2026-11-29T12:30:00+01:30"`), false, true},
		{"time negative offset", live(occ, `"occurred_at":"2026-11-29T01:00:00-10:00"`), false, true},
		{"time offset -00:00", live(occ, `"occurred_at":"2026-11-29T11:00:00-00:00"`), false, true},
		{"time offset 23:59", live(occ, `"occurred_at":"2026-11-30T10:59:00+23:59"`), false, true},
		{"time offset 24:00", live(occ, `"occurred_at":"2026-11-30T11:00:00+24:00"`), false, false},
		{"time Feb 29 leap", live(occ, `"occurred_at":"2024-02-29T11:00:00Z"`), false, true},
		{"time Feb 29 not leap", live(occ, `"occurred_at":"2025-02-29T11:00:00Z"`), false, false},
		{"time Feb 29 2000", live(occ, `"occurred_at":"2000-02-29T11:00:00Z"`), false, true},
		{"time Apr 31", live(occ, `"occurred_at":"2026-04-31T11:00:00Z"`), false, false},
		{"time hour 24", live(occ, `"occurred_at":"2026-11-29T24:00:00Z"`), false, false},
		{"time leap second", live(occ, `"occurred_at":"2016-12-31T23:59:60Z"`), false, false},
		{"time lower t", live(occ, `"occurred_at":"2026-11-29t11:00:00Z"`), false, false},
		{"time lower z", live(occ, `"occurred_at":"2026-11-29T11:00:00z"`), false, false},
		{"time comma fraction", live(occ, `"occurred_at":"2026-11-29T11:00:00,5Z"`), false, false},
		{"time empty fraction", live(occ, `"occurred_at":"2026-11-29T11:00:00.Z"`), false, false},
		{"time no zone", live(occ, `"occurred_at":"2026-11-29T11:00:00"`), false, false},
		{"time escaped", live(occ, `"occurred_at":"2026-11-29T11:00:00\u005a"`), false, false},
		{"time 1970", live(occ, `"occurred_at":"1970-01-01T00:00:00Z"`), false, true},
		{"time before 1970 by offset", live(occ, `"occurred_at":"1970-01-01T00:00:00+00:01"`), false, false},
		{"time 2199 future", live(occ, `"occurred_at":"2199-12-31T23:59:59.999999999Z"`), false, false},
		{"time at skew", live(occ, `"occurred_at":"2026-11-29T12:05:00Z"`), false, true},
		{"time past skew", live(occ, `"occurred_at":"2026-11-29T12:05:00.000000001Z"`), false, false},
		{"time null", live(occ, `"occurred_at":null`), false, false},
		{"time number", live(occ, `"occurred_at":1`), false, false},
		// Text: escapes decoded, surrogate pairs joined; lone halves and invalid bytes fall back.
		{"escaped identity", live(`"workspace":"w"`, `"workspace":"\u0077\/\"\\\t"`), false, true},
		{"surrogate pair", live(`"workspace":"w"`, `"workspace":"\ud83d\ude00"`), false, true},
		{"surrogate pair upper hex", live(`"workspace":"w"`, `"workspace":"\uD83D\uDE00"`), false, true},
		{"lone high", live(`"workspace":"w"`, `"workspace":"\ud83d"`), false, false},
		{"lone low", live(`"workspace":"w"`, `"workspace":"\ude00x"`), false, false},
		{"high then high", live(`"workspace":"w"`, `"workspace":"\ud83d\ud83d"`), false, false},
		{"escaped backslash u", live(`"workspace":"w"`, `"workspace":"\\ud800"`), false, true},
		{"literal U+FFFD", live(`"workspace":"w"`, `"workspace":"\ufffd`+"\ufffd"+`"`), false, true},
		{"invalid UTF-8 identity", live(`"workspace":"w"`, "\"workspace\":\"w\xc3\""), false, false},
		{"encoded surrogate", live(`"workspace":"w"`, "\"workspace\":\"\xed\xa0\x80\""), false, false},
		{"invalid UTF-8 unknown member", live(`"outcome"`, "\"x\":\"\xff\",\"outcome\""), false, false},
		{"control character", live(`"workspace":"w"`, "\"workspace\":\"w\x01\""), false, false},
		{"bad escape", live(`"workspace":"w"`, `"workspace":"\x41"`), false, false},
		{"short unicode escape", live(`"workspace":"w"`, `"workspace":"\u41"`), false, false},
		{"identity at limit", live(`"workspace":"w"`, `"workspace":"`+strings.Repeat("é", MaxIdentityBytes/2)+`"`), false, true},
		{"identity over limit", live(`"workspace":"w"`, `"workspace":"`+strings.Repeat("x", MaxIdentityBytes+1)+`"`), false, false},
		{"escaped identity over limit", live(`"workspace":"w"`, `"workspace":"`+strings.Repeat(`\u00e9`, MaxIdentityBytes/2+1)+`"`), false, false},
		{"null identity", live(`"workspace":"w"`, `"workspace":null`), false, false},
		{"null unscored_reason", live(`"outcome"`, `"unscored_reason":null,"outcome"`), false, true},
		{"unscored_reason", live(`"outcome":"passed"`, `"unscored_reason":"judge timeout","outcome":"unscored"`), false, true},
		{"escaped outcome", live(`"outcome":"passed"`, `"outcome":"p\u0061ssed"`), false, false},
		{"bad outcome", live(`"outcome":"passed"`, `"outcome":"Passed"`), false, false},
		// Member names: duplicates, case variants and look-alikes fall back to the decoder.
		{"duplicate outcome", live(`"outcome":"passed"`, `"outcome":"unscored","outcome":"passed"`), false, false},
		{"duplicate scope", live(`"opportunity_id"`, `"scope":{"workspace":"x"},"opportunity_id"`), false, false},
		{"duplicate scope part", live(`"model":"m"`, `"model":"m","model":"n"`), false, false},
		{"case variant", live(`"outcome":"passed"`, `"outcome":"passed","Outcome":"unscored"`), false, false},
		{"case variant only", live(`"outcome":"passed"`, `"OUTCOME":"passed"`), false, false},
		{"case variant scope part", live(`"model":"m"`, `"model":"m","Model":"n"`), false, false},
		{"kelvin sign", live(`"outcome":"passed"`, `"outcome":"passed","s\u212aope":{}`), false, false},
		{"kelvin sign raw", live(`"outcome":"passed"`, "\"outcome\":\"passed\",\"s\u212aope\":{}"), false, false},
		{"long s raw", live(`"outcome":"passed"`, "\"outcome\":\"passed\",\"\u017fcope\":{}"), false, false},
		{"escaped name", live(`"outcome":"passed"`, `"outc\u006fme":"passed"`), false, false},
		{"dash variant", live(`"outcome":"passed"`, `"outcome":"passed","correction-id":"x"`), false, false},
		{"underscore dropped", live(`"outcome":"passed"`, `"outcome":"passed","correctionid":"x"`), false, false},
		{"unknown members", live(`"outcome"`, `"extra":{"a":[1,2.5e3,true,false,null,"s",{"b":{}}],"c":[]},"scopes":1,"outcom":"x","outcome"`), false, true},
		{"unknown member in scope", live(`"model":"m"`, `"model":"m","region":"eu"`), false, true},
		{"eval member in live", live(`"outcome"`, `"suite":5,"outcome"`), false, true},
		{"deep unknown", live(`"outcome"`, `"x":`+strings.Repeat("[", 40)+strings.Repeat("]", 40)+`,"outcome"`), false, false},
		{"bad unknown", live(`"outcome"`, `"x":[1,],"outcome"`), false, false},
		{"bad literal", live(`"outcome"`, `"x":nul,"outcome"`), false, false},
		{"trailing comma", live(`"outcome":"passed"`, `"outcome":"passed",`), false, false},
		{"trailing text", validLive + "x", false, false},
		{"two objects", validLive + validLive, false, false},
		{"scope null", live(`"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"}`, `"scope":null`), false, false},
		{"scope array", live(`"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"}`, `"scope":[]`), false, false},
		{"not an object", `[` + validLive + `]`, false, false},
		{"empty object", `{}`, false, false},
		{"correction without opportunity", eval(`"opportunity_id":"refund-17/v12/3",`, ``), true, false},
		{"null correction and opportunity", eval(`"correction_id":"refund-policy-fix","opportunity_id":"refund-17/v12/3"`, `"correction_id":null,"opportunity_id":null`), true, true},
		{"no correction", eval(`"correction_id":"refund-policy-fix","opportunity_id":"refund-17/v12/3",`, ``), true, true},
	}
	p := NewParser(DefaultLimits)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.data)
			var fast bool
			if tc.eval {
				_, fast = fastEval(data, now, DefaultLimits, nil)
			} else {
				_, fast = fastLive(data, now, DefaultLimits, nil)
			}
			if fast != tc.fast {
				t.Errorf("fast path took it: %v, want %v", fast, tc.fast)
			}
			for _, parser := range []*Parser{nil, p, p} {
				got, want, gotErr, wantErr := parseBoth(parser, data, tc.eval, now)
				sameOutcome(t, data, got, want, gotErr, wantErr)
			}
		})
	}
}

func mustRead(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestParseRFC3339: the fast time reader agrees with time.Parse wherever it reads a time, and
// reads the usual forms.
func TestParseRFC3339(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"2026-11-29T11:00:00Z", true},
		{"2026-11-29T11:00:00.1Z", true},
		{"2026-11-29T11:00:00.000000001Z", true},
		{"2026-11-29T11:00:00.1234567891234Z", true},
		{"2026-11-29T11:00:00+05:45", true},
		{"2026-11-29T11:00:00-23:59", true},
		{"0000-01-01T00:00:00Z", true},
		{"9999-12-31T23:59:59.999999999Z", true},
		{"2024-02-29T00:00:00Z", true},
		{"1900-02-29T00:00:00Z", false},
		{"2026-13-01T00:00:00Z", false},
		{"2026-00-01T00:00:00Z", false},
		{"2026-01-00T00:00:00Z", false},
		{"2026-01-01T00:60:00Z", false},
		{"2026-01-01 00:00:00Z", false},
		{"2026-01-01T00:00:00+0100", false},
		{"2026-01-01T00:00:00+01:60", false},
		{"2026-01-01T00:00:00.Z", false},
		{"2026-01-01T00:00:00.5", false},
		{"2026-01-01T00:00:00ZZ", false},
		{"2026-1-01T00:00:00Z", false},
		{"+026-01-01T00:00:00Z", false},
		{"2026-01-01T00:00:00", false},
		{"", false},
	} {
		got, ok := ParseRFC3339([]byte(tc.in))
		if ok != tc.ok {
			t.Errorf("%q: ok %v, want %v", tc.in, ok, tc.ok)
		}
		if !ok {
			continue
		}
		want, err := time.Parse(time.RFC3339Nano, tc.in)
		if err != nil || !reflect.DeepEqual(got, want.UTC()) {
			t.Errorf("%q: %v, time.Parse %v (%v)", tc.in, got, want, err)
		}
	}
}

// FuzzFastDataAgrees holds ParseLiveAttempt, ParseEvalResult and a Parser (its string table
// shared across inputs) to the reference: the same value or the same error for every input.
func FuzzFastDataAgrees(f *testing.F) {
	f.Add([]byte(validLive), false)
	f.Add([]byte(validEval), true)
	f.Add([]byte(strings.Replace(validLive, `"outcome"`, `"assessment_seq":1.0e0,"unscored_reason":"\ud83d\ude00","x":[{"y":null}],"outcome"`, 1)), false)
	f.Add([]byte(strings.Replace(validLive, `"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29T12:30:00.123456789+01:30"`, 1)), false)
	f.Add([]byte(strings.Replace(validLive, `"model":"m"`, `"Model":"m","model":null`, 1)), false)
	f.Add([]byte(strings.Replace(validEval, `"score":0.25`, `"score":1e-1,"Score":null,"runs":5`, 1)), true)
	f.Add([]byte(strings.Replace(validEval, `"version_seq":12`, `"version_seq":9007199254740993`, 1)), true)
	p := NewParser(DefaultLimits)
	f.Fuzz(func(t *testing.T, data []byte, eval bool) {
		// The clock moves with the input, so that times near the skew limit come up.
		at := now.Add(time.Duration(len(data)%7-3) * time.Hour)
		for _, parser := range []*Parser{nil, p} {
			got, want, gotErr, wantErr := parseBoth(parser, data, eval, at)
			sameOutcome(t, data, got, want, gotErr, wantErr)
		}
	})
}
