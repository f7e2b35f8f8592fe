package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	fastjson "github.com/goccy/go-json"
)

// CloudEvent types consumed and produced by repeatrate.
const (
	TypeLiveAttempt = "repeatrate.live.attempt.v1"
	TypeEvalResult  = "repeatrate.eval.result.v1"
	TypeSnapshot    = "repeatrate.snapshot.v1"
)

// Outcome values of a live attempt.
const (
	OutcomeConfirmedRepeat = "confirmed_repeat"
	OutcomePassed          = "passed"
	OutcomeUnscored        = "unscored"
)

// Result values of an eval result.
const (
	ResultPass  = "pass"
	ResultFail  = "fail"
	ResultError = "error"
)

// MaxAssessmentSeq bounds assessment_seq so that it is exact in every store (Lua numbers are
// doubles).
const MaxAssessmentSeq = 1<<53 - 1

// Scope names exactly what was measured. All five parts are required and compared byte for byte.
type Scope struct {
	Workspace  string `json:"workspace"`
	Model      string `json:"model"`
	Run        string `json:"run"`
	Checkpoint string `json:"checkpoint"`
	Artifact   string `json:"artifact"`
}

// Limits bounds what the parsers accept.
type Limits struct {
	// MaxPredictionBytes caps the prediction text of an eval result (default 64 KiB).
	MaxPredictionBytes int
	// MaxFutureSkew is how far occurred_at and assessed_at may lie ahead of the receiving clock
	// (default 5 minutes).
	MaxFutureSkew time.Duration
}

// DefaultLimits are the documented defaults (docs/semantics.md#limits).
var DefaultLimits = Limits{MaxPredictionBytes: 64 << 10, MaxFutureSkew: 5 * time.Minute}

// LiveAttempt is the data of a repeatrate.live.attempt.v1 event: a user-visible attempt linked to a
// corrected behaviour.
type LiveAttempt struct {
	Scope          Scope     `json:"scope"`
	OpportunityID  string    `json:"opportunity_id"`
	CorrectionID   string    `json:"correction_id"`
	OccurredAt     time.Time `json:"occurred_at"`
	AssessedAt     time.Time `json:"assessed_at"`
	AssessmentSeq  int64     `json:"assessment_seq,omitempty"`
	Outcome        string    `json:"outcome"`
	UnscoredReason string    `json:"unscored_reason,omitempty"`
}

// EvalResult is the data of a repeatrate.eval.result.v1 event: one graded run of one eval case.
// CorrectionID and OpportunityID are set together when the case is a declared correction check.
type EvalResult struct {
	Scope         Scope     `json:"scope"`
	Suite         string    `json:"suite"`
	CaseID        string    `json:"case_id"`
	Version       string    `json:"version"`
	VersionSeq    int64     `json:"version_seq"`
	RunIndex      int64     `json:"run_index"`
	Runs          int64     `json:"runs"`
	Result        string    `json:"result"`
	Score         *float64  `json:"score,omitempty"`
	Prediction    *string   `json:"prediction,omitempty"`
	CorrectionID  string    `json:"correction_id,omitempty"`
	OpportunityID string    `json:"opportunity_id,omitempty"`
	OccurredAt    time.Time `json:"occurred_at"`
	AssessedAt    time.Time `json:"assessed_at"`
	AssessmentSeq int64     `json:"assessment_seq,omitempty"`
}

// IsCorrectionCheck reports whether the result also counts towards a correction repeat rate.
func (r *EvalResult) IsCorrectionCheck() bool { return r.CorrectionID != "" }

// wire forms: times arrive as strings so a bad one gets a precise reason, not a generic JSON error.
type liveWire struct {
	Scope          *Scope          `json:"scope"`
	OpportunityID  string          `json:"opportunity_id"`
	CorrectionID   string          `json:"correction_id"`
	OccurredAt     string          `json:"occurred_at"`
	AssessedAt     string          `json:"assessed_at"`
	AssessmentSeq  json.RawMessage `json:"assessment_seq"`
	Outcome        string          `json:"outcome"`
	UnscoredReason string          `json:"unscored_reason"`
}

type evalWire struct {
	Scope         *Scope          `json:"scope"`
	Suite         string          `json:"suite"`
	CaseID        string          `json:"case_id"`
	Version       string          `json:"version"`
	VersionSeq    json.RawMessage `json:"version_seq"`
	RunIndex      json.RawMessage `json:"run_index"`
	Runs          json.RawMessage `json:"runs"`
	Result        string          `json:"result"`
	Score         *float64        `json:"score"`
	Prediction    *string         `json:"prediction"`
	CorrectionID  string          `json:"correction_id"`
	OpportunityID string          `json:"opportunity_id"`
	OccurredAt    string          `json:"occurred_at"`
	AssessedAt    string          `json:"assessed_at"`
	AssessmentSeq json.RawMessage `json:"assessment_seq"`
}

// ParseLiveAttempt decodes and validates live-attempt data received at now. Errors wrap ErrInvalid.
func ParseLiveAttempt(data []byte, now time.Time, lim Limits) (LiveAttempt, error) {
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
	if a.OccurredAt, a.AssessedAt, a.AssessmentSeq, err = checkTimes(w.OccurredAt, w.AssessedAt, w.AssessmentSeq, now, lim); err != nil {
		return LiveAttempt{}, err
	}
	return a, nil
}

// ParseEvalResult decodes and validates eval-result data received at now. Errors wrap ErrInvalid.
func ParseEvalResult(data []byte, now time.Time, lim Limits) (EvalResult, error) {
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
	if r.VersionSeq, err = integer("version_seq", w.VersionSeq, true, 0, MaxAssessmentSeq); err != nil {
		return EvalResult{}, err
	}
	if r.RunIndex, err = integer("run_index", w.RunIndex, true, 0, 1<<31-1); err != nil {
		return EvalResult{}, err
	}
	if r.Runs, err = integer("runs", w.Runs, true, 1, 1<<31-1); err != nil {
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
	if (r.CorrectionID == "") != (r.OpportunityID == "") {
		return EvalResult{}, Invalid(ReasonMissingField, "correction_id and opportunity_id go together: a correction check needs both")
	}
	if r.OccurredAt, r.AssessedAt, r.AssessmentSeq, err = checkTimes(w.OccurredAt, w.AssessedAt, w.AssessmentSeq, now, lim); err != nil {
		return EvalResult{}, err
	}
	return r, nil
}

func unmarshalObject(data []byte, v any, eval bool) error {
	data = bytes.TrimSpace(data)
	if len(data) == 0 || data[0] != '{' {
		return Invalid(ReasonBadDataFormat, "data is not a JSON object")
	}
	// Decoders turn invalid UTF-8 and lone surrogate escapes into U+FFFD, so two distinct byte
	// strings would name one identity: identity fields are checked on their raw JSON first. The
	// one-pass test keeps the usual, clean input off that path.
	if !utf8.Valid(data) || hasSurrogateEscape(data) {
		if err := checkRawIdentities(data, eval); err != nil {
			return err
		}
	}
	// goccy/go-json: the same semantics as encoding/json at a fraction of the cost (the decode is
	// most of the processor's CPU); the fuzz test of the decoder holds it to the same outcomes.
	if err := fastjson.Unmarshal(data, v); err != nil {
		var te *fastjson.UnmarshalTypeError
		if errors.As(err, &te) {
			return Invalid(ReasonBadValue, "field %s has the wrong JSON type %s", te.Field, te.Value)
		}
		return Invalid(ReasonBadDataFormat, "data is not valid JSON: %s", clip(err.Error()))
	}
	return nil
}

// rawIdentities holds the identity fields of either input type as raw JSON.
type rawIdentities struct {
	Scope *struct {
		Workspace  json.RawMessage `json:"workspace"`
		Model      json.RawMessage `json:"model"`
		Run        json.RawMessage `json:"run"`
		Checkpoint json.RawMessage `json:"checkpoint"`
		Artifact   json.RawMessage `json:"artifact"`
	} `json:"scope"`
	OpportunityID json.RawMessage `json:"opportunity_id"`
	CorrectionID  json.RawMessage `json:"correction_id"`
	Suite         json.RawMessage `json:"suite"`
	CaseID        json.RawMessage `json:"case_id"`
	Version       json.RawMessage `json:"version"`
}

// checkRawIdentities rejects identity fields whose JSON string is not valid UTF-8 or holds an
// unpaired surrogate escape. Anything else wrong with data is left to the typed decode.
func checkRawIdentities(data []byte, eval bool) error {
	var r rawIdentities
	if fastjson.Unmarshal(data, &r) != nil {
		return nil
	}
	fields := []string{"opportunity_id", "correction_id"}
	raws := []json.RawMessage{r.OpportunityID, r.CorrectionID}
	if eval {
		fields = append(fields, "suite", "case_id", "version")
		raws = append(raws, r.Suite, r.CaseID, r.Version)
	}
	if s := r.Scope; s != nil {
		fields = append(fields, "scope.workspace", "scope.model", "scope.run", "scope.checkpoint", "scope.artifact")
		raws = append(raws, s.Workspace, s.Model, s.Run, s.Checkpoint, s.Artifact)
	}
	for i, raw := range raws {
		if len(raw) > 0 && raw[0] == '"' && !validJSONText(raw) {
			return Invalid(ReasonBadValue, "%s is not valid UTF-8 text (invalid bytes or an unpaired surrogate escape)", fields[i])
		}
	}
	return nil
}

// hasSurrogateEscape reports whether b holds something that looks like a \uD800–\uDFFF escape.
func hasSurrogateEscape(b []byte) bool {
	for i := 0; ; i++ {
		j := bytes.Index(b[i:], []byte(`\u`))
		if j < 0 {
			return false
		}
		i += j
		if i+3 < len(b) && (b[i+2] == 'd' || b[i+2] == 'D') && isSurrogateHex(b[i+3]) {
			return true
		}
	}
}

func isSurrogateHex(c byte) bool {
	return c >= '8' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// validJSONText reports whether the JSON string token s is valid UTF-8 and every surrogate escape
// in it is half of a high-low pair.
func validJSONText(s []byte) bool {
	if !utf8.Valid(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		if i+1 < len(s) && s[i+1] != 'u' {
			i++
			continue
		}
		v, ok := hex4(s, i+2)
		switch {
		case !ok:
			return false // not valid JSON: the typed decode reports it
		case v >= 0xDC00 && v <= 0xDFFF:
			return false // a low half without its high half
		case v >= 0xD800 && v <= 0xDBFF:
			if w, ok := hex4(s, i+8); i+7 >= len(s) || s[i+6] != '\\' || s[i+7] != 'u' || !ok || w < 0xDC00 || w > 0xDFFF {
				return false // a high half without its low half
			}
			i += 11
		default:
			i += 5
		}
	}
	return true
}

// hex4 reads four hex digits at s[i:].
func hex4(s []byte, i int) (rune, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	var v rune
	for _, c := range s[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

func checkScope(s *Scope) (Scope, error) {
	if s == nil {
		return Scope{}, Invalid(ReasonMissingField, "scope is required")
	}
	pairs := []string{"scope.workspace", s.Workspace, "scope.model", s.Model, "scope.run", s.Run,
		"scope.checkpoint", s.Checkpoint, "scope.artifact", s.Artifact}
	if err := required(pairs...); err != nil {
		return Scope{}, err
	}
	return *s, bounded(pairs...)
}

// bounded takes name, value pairs and names the first one longer than MaxIdentityBytes.
func bounded(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if n := len(pairs[i+1]); n > MaxIdentityBytes {
			return Invalid(ReasonTooLarge, "%s is %d bytes, limit %d", pairs[i], n, MaxIdentityBytes)
		}
	}
	return nil
}

// required takes name, value pairs and names the first empty one.
func required(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			return Invalid(ReasonMissingField, "%s is required and must be a non-empty string", pairs[i])
		}
	}
	return nil
}

func checkTimes(occurred, assessed string, seqRaw json.RawMessage, now time.Time, lim Limits) (time.Time, time.Time, int64, error) {
	occ, err := parseTime("occurred_at", occurred)
	if err != nil {
		return time.Time{}, time.Time{}, 0, err
	}
	if occ.After(now.Add(lim.MaxFutureSkew)) {
		return time.Time{}, time.Time{}, 0, Invalid(ReasonFutureEvent, "occurred_at %s is more than %s after %s",
			occ.Format(time.RFC3339), lim.MaxFutureSkew, now.UTC().Format(time.RFC3339))
	}
	asd, err := parseTime("assessed_at", assessed)
	if err != nil {
		return time.Time{}, time.Time{}, 0, err
	}
	// A far-future assessment would win against every later re-assessment of its opportunity.
	if asd.After(now.Add(lim.MaxFutureSkew)) {
		return time.Time{}, time.Time{}, 0, Invalid(ReasonFutureEvent, "assessed_at %s is more than %s after %s",
			asd.Format(time.RFC3339), lim.MaxFutureSkew, now.UTC().Format(time.RFC3339))
	}
	seq, err := integer("assessment_seq", seqRaw, false, 0, MaxAssessmentSeq)
	if err != nil {
		return time.Time{}, time.Time{}, 0, err
	}
	return occ, asd, seq, nil
}

// minTime and maxTime bound accepted times so that microseconds since the epoch stay exact in a
// float64 and every window computation is well inside range.
var (
	minTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
)

func parseTime(name, s string) (time.Time, error) {
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

// integer parses an optional or required JSON integer within [lo, hi].
func integer(name string, raw json.RawMessage, needed bool, lo, hi int64) (int64, error) {
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

// clip keeps user-supplied values in error details short: details go into headers and logs.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}
