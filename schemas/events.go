package schemas

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf16"
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

// MaxReplyTokens is the greatest reply_tokens an eval result may carry.
const MaxReplyTokens = 1<<31 - 1

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
	Scope      Scope    `json:"scope"`
	Suite      string   `json:"suite"`
	CaseID     string   `json:"case_id"`
	Version    string   `json:"version"`
	VersionSeq int64    `json:"version_seq"`
	RunIndex   int64    `json:"run_index"`
	Runs       int64    `json:"runs"`
	Result     string   `json:"result"`
	Score      *float64 `json:"score,omitempty"`
	Prediction *string  `json:"prediction,omitempty"`
	// ReplyTokens is the reply's length in tokens as the harness counted it (OpenCompass's
	// res_length); with a prediction, the suite takes it as the reply's length instead of its own
	// count (docs/semantics.md#replies).
	ReplyTokens   *int64    `json:"reply_tokens,omitempty"`
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
	ReplyTokens   json.RawMessage `json:"reply_tokens"`
	CorrectionID  string          `json:"correction_id"`
	OpportunityID string          `json:"opportunity_id"`
	OccurredAt    string          `json:"occurred_at"`
	AssessedAt    string          `json:"assessed_at"`
	AssessmentSeq json.RawMessage `json:"assessment_seq"`
}

// ParseLiveAttempt decodes and validates live-attempt data received at now. Errors wrap ErrInvalid.
func ParseLiveAttempt(data []byte, now time.Time, lim Limits) (LiveAttempt, error) {
	if a, ok := fastLive(data, now, lim, nil); ok {
		return a, nil
	}
	return parseLiveAttempt(data, now, lim)
}

// parseLiveAttempt is ParseLiveAttempt through encoding/json semantics: every input that
// fastLive leaves, every error.
func parseLiveAttempt(data []byte, now time.Time, lim Limits) (LiveAttempt, error) {
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
	if r, ok := fastEval(data, now, lim, nil); ok {
		return r, nil
	}
	return parseEvalResult(data, now, lim)
}

// parseEvalResult is ParseEvalResult through encoding/json semantics: every input that fastEval
// leaves, every error.
func parseEvalResult(data []byte, now time.Time, lim Limits) (EvalResult, error) {
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
	if len(w.ReplyTokens) > 0 && string(w.ReplyTokens) != "null" {
		n, err := integer("reply_tokens", w.ReplyTokens, true, 0, MaxReplyTokens)
		if err != nil {
			return EvalResult{}, err
		}
		r.ReplyTokens = &n
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
	if name, dup := duplicateField(data, eval); dup {
		return Invalid(ReasonBadDataFormat, "member %q appears twice in one object: JSON readers disagree on which counts", clip(name))
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

// Parser parses event data exactly as ParseLiveAttempt and ParseEvalResult do, with the same
// results and the same errors, and shares the strings that repeat from event to event (scope
// parts, correction ids, suites, cases, versions) instead of allocating them again. It is safe for
// concurrent use.
type Parser struct {
	lim  Limits
	strs internTable
}

// NewParser returns a parser with the limits lim.
func NewParser(lim Limits) *Parser { return &Parser{lim: lim} }

// LiveAttempt is ParseLiveAttempt with p's limits.
func (p *Parser) LiveAttempt(data []byte, now time.Time) (LiveAttempt, error) {
	if a, ok := fastLive(data, now, p.lim, &p.strs); ok {
		return a, nil
	}
	return parseLiveAttempt(data, now, p.lim)
}

// EvalResult is ParseEvalResult with p's limits.
func (p *Parser) EvalResult(data []byte, now time.Time) (EvalResult, error) {
	if r, ok := fastEval(data, now, p.lim, &p.strs); ok {
		return r, nil
	}
	return parseEvalResult(data, now, p.lim)
}

// The fast paths below read the usual, valid event in one pass over its bytes, without
// reflection. They accept only what they are sure of: strict JSON (RFC 8259) of valid UTF-8 with
// every known member at most once and spelt exactly, no unpaired surrogate escape, times in the
// form of time's own RFC 3339 fast path, and every check of the data passed. Anything else, and
// every invalid event, is left to the decoder above (ok false), which words the error: so an
// input decodes to the same event, or the same error, either way (FuzzFastDataAgrees holds them to
// that). What is valid: docs/semantics.md#validation.

// The member names of each data type, for shadows.
var (
	liveNames  = []string{"scope", "opportunity_id", "correction_id", "occurred_at", "assessed_at", "assessment_seq", "outcome", "unscored_reason"}
	evalNames  = []string{"scope", "suite", "case_id", "version", "version_seq", "run_index", "runs", "result", "score", "prediction", "correction_id", "opportunity_id", "occurred_at", "assessed_at", "assessment_seq", "reply_tokens"}
	scopeNames = []string{"workspace", "model", "run", "checkpoint", "artifact"}
)

// maxSkipDepth bounds the nesting of unknown members the fast paths step over; deeper ones are
// left to the decoder.
const maxSkipDepth = 32

// LiveAttemptAt reads the live-attempt data that starts at b[i] (a JSON object, maybe after white
// space) the fast way, as LiveAttempt would read it, and returns the index after it. ok is false
// when the fast way cannot take it (an invalid event, or a form it leaves to the full decoder):
// the caller then finds the object's end itself and asks LiveAttempt.
func (p *Parser) LiveAttemptAt(b []byte, i int, now time.Time) (a LiveAttempt, end int, ok bool) {
	s := scanner{b: b, i: i}
	if a, ok = liveAt(&s, now, p.lim, &p.strs); !ok {
		return LiveAttempt{}, 0, false
	}
	return a, s.i, true
}

// EvalResultAt is LiveAttemptAt for eval-result data.
func (p *Parser) EvalResultAt(b []byte, i int, now time.Time) (r EvalResult, end int, ok bool) {
	s := scanner{b: b, i: i}
	if r, ok = evalAt(&s, now, p.lim, &p.strs); !ok {
		return EvalResult{}, 0, false
	}
	return r, s.i, true
}

func fastLive(data []byte, now time.Time, lim Limits, t *internTable) (LiveAttempt, bool) {
	s := scanner{b: bytes.TrimSpace(data)}
	if a, ok := liveAt(&s, now, lim, t); ok && s.end() {
		return a, true
	}
	return LiveAttempt{}, false
}

func fastEval(data []byte, now time.Time, lim Limits, t *internTable) (EvalResult, bool) {
	s := scanner{b: bytes.TrimSpace(data)}
	if r, ok := evalAt(&s, now, lim, t); ok && s.end() {
		return r, true
	}
	return EvalResult{}, false
}

// liveAt reads live-attempt data, an object, at s.
func liveAt(s *scanner, now time.Time, lim Limits, t *internTable) (LiveAttempt, bool) {
	var (
		a        LiveAttempt
		occ, asd []byte
		seen     uint
	)
	ok := s.object(func(name []byte) bool {
		var bit uint
		ok := false
		switch string(name) {
		case "scope":
			bit, ok = 1<<0, s.scope(&a.Scope, t)
		case "opportunity_id":
			bit = 1 << 1
			a.OpportunityID, ok = s.text(nil)
		case "correction_id":
			bit = 1 << 2
			a.CorrectionID, ok = s.text(t)
		case "occurred_at":
			bit = 1 << 3
			occ, ok = s.plain()
		case "assessed_at":
			bit = 1 << 4
			asd, ok = s.plain()
		case "assessment_seq":
			bit = 1 << 5
			a.AssessmentSeq, ok = s.integer(false, 0, MaxAssessmentSeq)
		case "outcome":
			bit = 1 << 6
			a.Outcome, ok = s.enum(OutcomeConfirmedRepeat, OutcomePassed, OutcomeUnscored)
		case "unscored_reason":
			bit = 1 << 7
			a.UnscoredReason, ok = s.text(t)
		default:
			return !shadows(name, liveNames) && s.skip(0)
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return ok
	})
	if !ok || seen&(1<<0|1<<6) != 1<<0|1<<6 || !validScope(&a.Scope) ||
		!identity(a.OpportunityID) || !identity(a.CorrectionID) {
		return LiveAttempt{}, false
	}
	if a.OccurredAt, a.AssessedAt, ok = fastTimes(occ, asd, now, lim); !ok {
		return LiveAttempt{}, false
	}
	return a, true
}

// evalAt reads eval-result data, an object, at s.
func evalAt(s *scanner, now time.Time, lim Limits, t *internTable) (EvalResult, bool) {
	var (
		r        EvalResult
		occ, asd []byte
		seen     uint
	)
	ok := s.object(func(name []byte) bool {
		var bit uint
		ok := false
		switch string(name) {
		case "scope":
			bit, ok = 1<<0, s.scope(&r.Scope, t)
		case "suite":
			bit = 1 << 1
			r.Suite, ok = s.text(t)
		case "case_id":
			bit = 1 << 2
			r.CaseID, ok = s.text(t)
		case "version":
			bit = 1 << 3
			r.Version, ok = s.text(t)
		case "version_seq":
			bit = 1 << 4
			r.VersionSeq, ok = s.integer(true, 0, MaxAssessmentSeq)
		case "run_index":
			bit = 1 << 5
			r.RunIndex, ok = s.integer(true, 0, 1<<31-1)
		case "runs":
			bit = 1 << 6
			r.Runs, ok = s.integer(true, 1, 1<<31-1)
		case "result":
			bit = 1 << 7
			r.Result, ok = s.enum(ResultPass, ResultFail, ResultError)
		case "score":
			bit = 1 << 8
			r.Score, ok = s.score()
		case "prediction":
			bit = 1 << 9
			r.Prediction, ok = s.prediction(lim.MaxPredictionBytes)
		case "correction_id":
			bit = 1 << 10
			r.CorrectionID, ok = s.text(t)
		case "opportunity_id":
			bit = 1 << 11
			r.OpportunityID, ok = s.text(nil)
		case "occurred_at":
			bit = 1 << 12
			occ, ok = s.plain()
		case "assessed_at":
			bit = 1 << 13
			asd, ok = s.plain()
		case "assessment_seq":
			bit = 1 << 14
			r.AssessmentSeq, ok = s.integer(false, 0, MaxAssessmentSeq)
		case "reply_tokens":
			bit = 1 << 15
			if ok = s.literal("null"); !ok {
				var n int64
				n, ok = s.integer(true, 0, MaxReplyTokens)
				r.ReplyTokens = &n
			}
		default:
			return !shadows(name, evalNames) && s.skip(0)
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return ok
	})
	const needed = 1<<0 | 1<<4 | 1<<5 | 1<<6 | 1<<7
	if !ok || seen&needed != needed || !validScope(&r.Scope) ||
		r.Suite == "" || r.CaseID == "" || r.Version == "" || !bounded1(r.Suite) || !bounded1(r.CaseID) || !bounded1(r.Version) ||
		!bounded1(r.CorrectionID) || !bounded1(r.OpportunityID) || (r.CorrectionID == "") != (r.OpportunityID == "") ||
		r.Runs > MaxRuns || r.RunIndex >= r.Runs || (r.Score != nil && !(*r.Score >= 0 && *r.Score <= 1)) {
		return EvalResult{}, false
	}
	if r.OccurredAt, r.AssessedAt, ok = fastTimes(occ, asd, now, lim); !ok {
		return EvalResult{}, false
	}
	return r, true
}

// identity reports whether s is a present identity field within MaxIdentityBytes.
func identity(s string) bool { return s != "" && len(s) <= MaxIdentityBytes }

// bounded1 reports whether s is within MaxIdentityBytes.
func bounded1(s string) bool { return len(s) <= MaxIdentityBytes }

func validScope(s *Scope) bool {
	return identity(s.Workspace) && identity(s.Model) && identity(s.Run) && identity(s.Checkpoint) && identity(s.Artifact)
}

// fastTimes is checkTimes for times in the usual form (ParseRFC3339), which are all accepted.
func fastTimes(occurred, assessed []byte, now time.Time, lim Limits) (occ, asd time.Time, ok bool) {
	limit := now.Add(lim.MaxFutureSkew)
	if occ, ok = fastTime(occurred); !ok || occ.After(limit) {
		return time.Time{}, time.Time{}, false
	}
	if asd, ok = fastTime(assessed); !ok || asd.After(limit) {
		return time.Time{}, time.Time{}, false
	}
	return occ, asd, true
}

// fastTime is parseTime for a time in the usual form within 1970..2200.
func fastTime(b []byte) (time.Time, bool) {
	t, ok := ParseRFC3339(b)
	if !ok || t.Before(minTime) || !t.Before(maxTime) {
		return time.Time{}, false
	}
	return t, true
}

// ParseRFC3339 parses b, in UTC, when b has the usual form of an RFC 3339 time that time's own
// fast path reads (2006-01-02T15:04:05, an optional fraction of at least one digit, then Z or
// ±hh:mm), with the same result as time.Parse(time.RFC3339Nano, b) and without allocating. ok is
// false for anything else, which time.Parse may still accept: the caller asks it then.
func ParseRFC3339(b []byte) (t time.Time, ok bool) {
	if len(b) < len("2006-01-02T15:04:05Z") || b[4] != '-' || b[7] != '-' || b[10] != 'T' || b[13] != ':' || b[16] != ':' {
		return time.Time{}, false
	}
	year, ok1 := digits(b[0:4], 0, 9999)
	month, ok2 := digits(b[5:7], 1, 12)
	hour, ok3 := digits(b[11:13], 0, 23)
	minute, ok4 := digits(b[14:16], 0, 59)
	sec, ok5 := digits(b[17:19], 0, 59)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return time.Time{}, false
	}
	day, ok := digits(b[8:10], 1, daysIn(time.Month(month), year))
	if !ok {
		return time.Time{}, false
	}
	b = b[19:]
	nsec := 0
	if len(b) >= 2 && b[0] == '.' && isDigit(b[1]) {
		n := 2
		for n < len(b) && isDigit(b[n]) {
			n++
		}
		// Digits past the ninth are dropped, as time does.
		k := min(n, 10)
		for _, c := range b[1:k] {
			nsec = nsec*10 + int(c-'0')
		}
		for i := k; i < 10; i++ {
			nsec *= 10
		}
		b = b[n:]
	}
	t = time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	if len(b) == 1 && b[0] == 'Z' {
		return t, true
	}
	if len(b) != len("-07:00") || (b[0] != '-' && b[0] != '+') || b[3] != ':' {
		return time.Time{}, false
	}
	hh, ok1 := digits(b[1:3], 0, 23)
	mm, ok2 := digits(b[4:6], 0, 59)
	if !ok1 || !ok2 {
		return time.Time{}, false
	}
	offset := (hh*60 + mm) * 60
	if b[0] == '-' {
		offset = -offset
	}
	return t.Add(-time.Duration(offset) * time.Second), true
}

// digits reads b, decimal digits only, as a number within [lo, hi].
func digits(b []byte, lo, hi int) (int, bool) {
	x := 0
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		x = x*10 + int(c-'0')
	}
	return x, x >= lo && x <= hi
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// daysIn is the number of days of month m in year y.
func daysIn(m time.Month, y int) int {
	switch m {
	case time.February:
		if y%4 == 0 && (y%100 != 0 || y%400 == 0) {
			return 29
		}
		return 28
	case time.April, time.June, time.September, time.November:
		return 30
	}
	return 31
}

// shadows reports whether name, which is none of names exactly, might still be taken for one of
// them by encoding/json's matching of member names (case-insensitive, with Unicode folding): any
// name that is not plain ASCII, or is one of names but for case, '_' and '-'.
func shadows(name []byte, names []string) bool {
	for _, c := range name {
		if c >= utf8.RuneSelf {
			return true
		}
	}
	for _, n := range names {
		if looseEqual(name, n) {
			return true
		}
	}
	return false
}

// looseEqual compares a and b, ASCII, ignoring case, '_' and '-'.
func looseEqual(a []byte, b string) bool {
	i, j := 0, 0
	for {
		for i < len(a) && (a[i] == '_' || a[i] == '-') {
			i++
		}
		for j < len(b) && (b[j] == '_' || b[j] == '-') {
			j++
		}
		if i == len(a) || j == len(b) {
			return i == len(a) && j == len(b)
		}
		if lower(a[i]) != lower(b[j]) {
			return false
		}
		i++
		j++
	}
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// scanner reads JSON strictly for the fast paths: every method reports false for anything but
// valid JSON of valid UTF-8 of the expected kind, and the caller then leaves the input to the
// full decoder.
type scanner struct {
	b []byte
	i int
}

// peek skips white space and returns the next byte, 0 at the end.
func (s *scanner) peek() byte {
	for s.i < len(s.b) {
		switch c := s.b[s.i]; c {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return c
		}
	}
	return 0
}

// end reports whether only white space is left.
func (s *scanner) end() bool { return s.peek() == 0 && s.i == len(s.b) }

// object reads an object, calling member with each member name (plain: no escape) and the
// scanner at the member's value, which member reads.
func (s *scanner) object(member func(name []byte) bool) bool {
	if s.peek() != '{' {
		return false
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return true
	}
	for {
		s.peek()
		name, esc, ok := s.str()
		if !ok || esc || s.peek() != ':' {
			return false
		}
		s.i++
		s.peek()
		if !member(name) {
			return false
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return true
		default:
			return false
		}
	}
}

// str reads a string: its bytes between the quotes, and whether they hold an escape.
func (s *scanner) str() (raw []byte, esc, ok bool) {
	b, i := s.b, s.i
	if i >= len(b) || b[i] != '"' {
		return nil, false, false
	}
	i++
	start := i
	for i < len(b) {
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return b[start:i], esc, true
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return nil, false, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if _, ok := hex4(b, i+2); !ok {
					return nil, false, false
				}
				i += 6
			default:
				return nil, false, false
			}
		case c < 0x20:
			return nil, false, false
		case c < utf8.RuneSelf:
			i++
		default:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return nil, false, false
			}
			i += n
		}
	}
	return nil, false, false
}

// plainByte marks the bytes a string holds as they are: printable ASCII but '"' and '\\'.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// literal reads lit (true, false or null) if it is next.
func (s *scanner) literal(lit string) bool {
	if !bytes.HasPrefix(s.b[s.i:], []byte(lit)) {
		return false
	}
	s.i += len(lit)
	return true
}

// text reads a string or null ("") value, its escapes decoded, shared through t.
func (s *scanner) text(t *internTable) (string, bool) {
	if s.literal("null") {
		return "", true
	}
	raw, esc, ok := s.str()
	if !ok {
		return "", false
	}
	if !esc {
		return t.str(raw), true
	}
	var buf [256]byte
	dec, ok := unescape(buf[:0], raw)
	if !ok {
		return "", false
	}
	return t.str(dec), true
}

// plain reads a string without escapes (a time) and returns its bytes.
func (s *scanner) plain() ([]byte, bool) {
	raw, esc, ok := s.str()
	return raw, ok && !esc
}

// enum reads a string that is exactly one of vals and returns that value.
func (s *scanner) enum(vals ...string) (string, bool) {
	raw, _, ok := s.str()
	if ok {
		for _, v := range vals {
			if string(raw) == v {
				return v, true
			}
		}
	}
	return "", false
}

// prediction reads a string or null (nil) of at most max bytes once decoded.
func (s *scanner) prediction(max int) (*string, bool) {
	if s.literal("null") {
		return nil, true
	}
	raw, esc, ok := s.str()
	if !ok {
		return nil, false
	}
	var p string
	if !esc {
		p = string(raw)
	} else {
		dec, ok := unescape(make([]byte, 0, len(raw)), raw)
		if !ok {
			return nil, false
		}
		p = string(dec)
	}
	if len(p) > max {
		return nil, false
	}
	return &p, true
}

// number reads a number and returns its text.
func (s *scanner) number() ([]byte, bool) {
	b, i := s.b, s.i
	start := i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	default:
		return nil, false
	}
	if i < len(b) && b[i] == '.' {
		i++
		d := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && isDigit(b[i]) {
			i++
		}
		if i == d {
			return nil, false
		}
	}
	s.i = i
	return b[start:i], true
}

// integer reads what integer accepts without error: a number that is an integer within [lo, hi]
// as a float64, or null (0) when not needed.
func (s *scanner) integer(needed bool, lo, hi int64) (int64, bool) {
	if s.literal("null") {
		return 0, !needed
	}
	tok, ok := s.number()
	if !ok {
		return 0, false
	}
	if len(tok) <= 15 && tok[0] != '-' && !bytes.ContainsAny(tok, ".eE") {
		// At most 15 digits: exact as a float64 too.
		var v int64
		for _, c := range tok {
			v = v*10 + int64(c-'0')
		}
		return v, v >= lo && v <= hi
	}
	// As integer does it: through a float64.
	f, err := strconv.ParseFloat(string(tok), 64)
	if err != nil || f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		return 0, false
	}
	return int64(f), true
}

// score reads a number or null (nil).
func (s *scanner) score() (*float64, bool) {
	if s.literal("null") {
		return nil, true
	}
	tok, ok := s.number()
	if !ok || tok[0] == '-' {
		// A negative score is invalid, but for -0, whose sign is not worth the doubt.
		return nil, false
	}
	f, ok := exactFloat(tok)
	if !ok {
		var err error
		if f, err = strconv.ParseFloat(string(tok), 64); err != nil {
			return nil, false
		}
	}
	return &f, true
}

// exactFloat converts a non-negative number without exponent of at most 15 digits, which a
// float64 holds exactly and divides by a power of ten exactly rounded (as strconv does).
func exactFloat(tok []byte) (float64, bool) {
	var m uint64
	n, frac := 0, -1
	for i, c := range tok {
		switch {
		case c == '.':
			frac = i
		case isDigit(c):
			m = m*10 + uint64(c-'0')
			n++
		default:
			return 0, false
		}
	}
	if n > 15 {
		return 0, false
	}
	if frac < 0 {
		return float64(m), true
	}
	return float64(m) / pow10[len(tok)-frac-1], true
}

var pow10 = [...]float64{1, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}

// skip reads any value, nested at most maxSkipDepth deep.
func (s *scanner) skip(depth int) bool {
	switch s.peek() {
	case '"':
		_, _, ok := s.str()
		return ok
	case '{':
		if depth >= maxSkipDepth {
			return false
		}
		return s.object(func([]byte) bool { return s.skip(depth + 1) })
	case '[':
		if depth >= maxSkipDepth {
			return false
		}
		s.i++
		if s.peek() == ']' {
			s.i++
			return true
		}
		for {
			if !s.skip(depth + 1) {
				return false
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return true
			default:
				return false
			}
		}
	case 't':
		return s.literal("true")
	case 'f':
		return s.literal("false")
	case 'n':
		return s.literal("null")
	}
	_, ok := s.number()
	return ok
}

// scope reads a scope object.
func (s *scanner) scope(sc *Scope, t *internTable) bool {
	var seen uint
	return s.object(func(name []byte) bool {
		var p *string
		var bit uint
		switch string(name) {
		case "workspace":
			p, bit = &sc.Workspace, 1<<0
		case "model":
			p, bit = &sc.Model, 1<<1
		case "run":
			p, bit = &sc.Run, 1<<2
		case "checkpoint":
			p, bit = &sc.Checkpoint, 1<<3
		case "artifact":
			p, bit = &sc.Artifact, 1<<4
		default:
			return !shadows(name, scopeNames) && s.skip(0)
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		var ok bool
		*p, ok = s.text(t)
		return ok
	})
}

// unescape appends the text of the JSON string contents raw (checked by str) to dst; ok is false
// for an unpaired surrogate escape, which decoders replace.
func unescape(dst, raw []byte) ([]byte, bool) {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch e := raw[i+1]; e {
		case 'u':
			r, _ := hex4(raw, i+2)
			i += 6
			if utf16.IsSurrogate(r) {
				if r >= 0xDC00 || i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
					return nil, false
				}
				lo, ok := hex4(raw, i+2)
				if r = utf16.DecodeRune(r, lo); !ok || r == utf8.RuneError {
					return nil, false
				}
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
			continue
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		default:
			c = e
		}
		dst = append(dst, c)
		i += 2
	}
	return dst, true
}

// internSlots is the size of a Parser's string table: room for the scopes, corrections and
// versions of a few producers' batches. A miss costs only the allocation a hit saves.
const internSlots = 1024

// internTable shares strings by their bytes: one per slot, chosen by a hash, each slot an
// immutable string replaced whole, so readers need no lock. A nil table shares nothing.
type internTable struct {
	slots [internSlots]atomic.Pointer[string]
}

// str returns b as a string, the table's copy when it holds one.
func (t *internTable) str(b []byte) string {
	if t == nil || len(b) == 0 || len(b) > MaxIdentityBytes {
		return string(b)
	}
	slot := &t.slots[hashBytes(b)%internSlots]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}

// hashBytes is a cheap hash of b's length and first and last bytes: strings that share them only
// share a slot.
func hashBytes(b []byte) uint64 {
	x := uint64(len(b))
	if len(b) >= 8 {
		x ^= binary.LittleEndian.Uint64(b) * 0x9e3779b97f4a7c15
		x ^= bits.RotateLeft64(binary.LittleEndian.Uint64(b[len(b)-8:])*0xc2b2ae3d27d4eb4f, 31)
	} else {
		for _, c := range b {
			x = x<<8 | uint64(c)
		}
		x *= 0x9e3779b97f4a7c15
	}
	return x ^ x>>29
}
