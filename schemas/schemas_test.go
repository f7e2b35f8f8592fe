package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// schemaDoc is the part of a JSON Schema the comparison needs.
type schemaDoc struct {
	Properties map[string]json.RawMessage `json:"properties"`
	Required   []string                   `json:"required"`
	Defs       map[string]schemaDoc       `json:"$defs"`
}

func loadSchema(t *testing.T, name string) schemaDoc {
	t.Helper()
	b, err := Files.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	var d schemaDoc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return d
}

// jsonFields lists a struct's JSON names and which of them are required (no omitempty).
func jsonFields(typ reflect.Type) (all, required []string) {
	for i := 0; i < typ.NumField(); i++ {
		tag := typ.Field(i).Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		all = append(all, name)
		if !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
	}
	slices.Sort(all)
	slices.Sort(required)
	return all, required
}

func keys(m map[string]json.RawMessage) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func TestSchemasMatchGoTypes(t *testing.T) {
	tests := []struct {
		file string
		typ  reflect.Type
		// optional lists fields that the Go type always writes but producers may omit.
		optional []string
	}{
		{"live_attempt.v1.schema.json", reflect.TypeOf(LiveAttempt{}), nil},
		{"eval_result.v1.schema.json", reflect.TypeOf(EvalResult{}), nil},
		{"snapshot.v1.schema.json", reflect.TypeOf(Snapshot{}), nil},
		{"suite_discrimination.v1.schema.json", reflect.TypeOf(SuiteDiscrimination{}), nil},
		{"suite_stability.v1.schema.json", reflect.TypeOf(SuiteStability{}), nil},
		{"case_revived.v1.schema.json", reflect.TypeOf(CaseRevived{}), nil},
		{"sample_abnormal.v1.schema.json", reflect.TypeOf(AbnormalSample{}), nil},
		{"alert_firing.v1.schema.json", reflect.TypeOf(Alert{}), nil},
		{"alert_resolved.v1.schema.json", reflect.TypeOf(Alert{}), nil},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			d := loadSchema(t, tc.file)
			all, req := jsonFields(tc.typ)
			if got := keys(d.Properties); !slices.Equal(got, all) {
				t.Errorf("schema properties %v, Go fields %v", got, all)
			}
			got := slices.Clone(d.Required)
			slices.Sort(got)
			if !slices.Equal(got, req) {
				t.Errorf("schema required %v, Go required %v", got, req)
			}
		})
	}
	// Nested objects: scope in the inputs, window in the snapshot.
	scopeAll, _ := jsonFields(reflect.TypeOf(Scope{}))
	for _, f := range []string{"live_attempt.v1.schema.json", "eval_result.v1.schema.json"} {
		if got := keys(loadSchema(t, f).Defs["scope"].Properties); !slices.Equal(got, scopeAll) {
			t.Errorf("%s scope %v, Go %v", f, got, scopeAll)
		}
	}
	for _, f := range []string{"alert_firing.v1.schema.json", "alert_resolved.v1.schema.json"} {
		defs := loadSchema(t, f).Defs
		for def, typ := range map[string]reflect.Type{"evidence": reflect.TypeOf(AlertEvidence{}),
			"window": reflect.TypeOf(AlertWindow{}), "test": reflect.TypeOf(AlertTest{})} {
			if all, _ := jsonFields(typ); !slices.Equal(keys(defs[def].Properties), all) {
				t.Errorf("%s %s %v, Go %v", f, def, keys(defs[def].Properties), all)
			}
		}
	}
	winAll, _ := jsonFields(reflect.TypeOf(Window{}))
	if got := keys(loadSchema(t, "snapshot.v1.schema.json").Defs["window"].Properties); !slices.Equal(got, winAll) {
		t.Errorf("window %v, Go %v", got, winAll)
	}
}

func TestGoldenRoundTrip(t *testing.T) {
	parse := map[string]func([]byte) (any, error){
		"live_attempt.json": func(b []byte) (any, error) { return ParseLiveAttempt(b, now, DefaultLimits) },
		"eval_result.json":  func(b []byte) (any, error) { return ParseEvalResult(b, now, DefaultLimits) },
		"snapshot.json": func(b []byte) (any, error) {
			var s Snapshot
			err := json.Unmarshal(b, &s)
			return s, err
		},
	}
	for file, p := range parse {
		t.Run(file, func(t *testing.T) {
			in, err := os.ReadFile("testdata/" + file)
			if err != nil {
				t.Fatal(err)
			}
			v, err := p(in)
			if err != nil {
				t.Fatal(err)
			}
			out, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			var a, b any
			json.Unmarshal(in, &a)
			json.Unmarshal(out, &b)
			if !reflect.DeepEqual(a, b) {
				var pretty bytes.Buffer
				json.Indent(&pretty, out, "", "  ")
				t.Fatalf("round trip changed the event:\n%s", pretty.String())
			}
		})
	}
}

const validLive = `{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},
"opportunity_id":"o","correction_id":"c","occurred_at":"2026-11-29T11:00:00Z","assessed_at":"2026-11-29T11:00:00Z","outcome":"passed"}`

func TestParseLiveAttemptRejects(t *testing.T) {
	edit := func(from, to string) string { return strings.Replace(validLive, from, to, 1) }
	tests := []struct {
		name   string
		data   string
		reason Reason
	}{
		{"not an object", `[1,2]`, ReasonBadDataFormat},
		{"truncated json", validLive[:40], ReasonBadDataFormat},
		{"no scope", edit(`"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},`, ""), ReasonMissingField},
		{"empty scope part", edit(`"run":"r"`, `"run":""`), ReasonMissingField},
		{"missing scope part", edit(`"artifact":"a"`, `"x":"a"`), ReasonMissingField},
		{"empty opportunity", edit(`"opportunity_id":"o"`, `"opportunity_id":""`), ReasonMissingField},
		{"no correction", edit(`"correction_id":"c",`, ""), ReasonMissingField},
		{"bad outcome", edit(`"passed"`, `"fixed"`), ReasonBadEnum},
		{"no outcome", edit(`,"outcome":"passed"`, ""), ReasonMissingField},
		{"bad time", edit(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"29/11/2026"`), ReasonBadTime},
		{"no assessed_at", edit(`"assessed_at":"2026-11-29T11:00:00Z",`, ""), ReasonMissingField},
		{"future", edit(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29T12:05:01Z"`), ReasonFutureEvent},
		{"negative seq", edit(`"outcome"`, `"assessment_seq":-1,"outcome"`), ReasonBadValue},
		{"fractional seq", edit(`"outcome"`, `"assessment_seq":1.5,"outcome"`), ReasonBadValue},
		{"seq string", edit(`"outcome"`, `"assessment_seq":"1","outcome"`), ReasonBadValue},
		{"scope wrong type", edit(`"opportunity_id":"o"`, `"opportunity_id":5`), ReasonBadValue},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseLiveAttempt([]byte(tc.data), now, DefaultLimits)
			if !errors.Is(err, ErrInvalid) || ReasonOf(err) != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
		})
	}
	// Exactly at the skew limit is accepted.
	if _, err := ParseLiveAttempt([]byte(edit(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29T12:05:00Z"`)), now, DefaultLimits); err != nil {
		t.Fatalf("5 minutes ahead: %v", err)
	}
}

func TestParseEvalResultRejects(t *testing.T) {
	valid, err := os.ReadFile("testdata/eval_result.json")
	if err != nil {
		t.Fatal(err)
	}
	edit := func(from, to string) string { return strings.Replace(string(valid), from, to, 1) }
	tests := []struct {
		name   string
		data   string
		reason Reason
	}{
		{"bad result", edit(`"result": "fail"`, `"result": "skipped"`), ReasonBadEnum},
		{"run beyond runs", edit(`"run_index": 3`, `"run_index": 5`), ReasonBadValue},
		{"no runs", edit(`"runs": 5,`, ""), ReasonMissingField},
		{"score above 1", edit(`"score": 0.25`, `"score": 1.5`), ReasonBadValue},
		{"correction without opportunity", edit(`"opportunity_id": "refund-17/v12/3",`, ""), ReasonMissingField},
		{"empty suite", edit(`"suite": "regressions"`, `"suite": ""`), ReasonMissingField},
		{"prediction too large", edit(`"You can return it within 90 days."`, `"`+strings.Repeat("x", 64<<10+1)+`"`), ReasonTooLarge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseEvalResult([]byte(tc.data), now, DefaultLimits)
			if !errors.Is(err, ErrInvalid) || ReasonOf(err) != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
		})
	}
}

func FuzzJoinSplitEscaped(f *testing.F) {
	f.Add("a|b", "%7C", "{x}")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		got, err := SplitEscaped(JoinEscaped(a, b, c))
		if err != nil || !slices.Equal(got, []string{a, b, c}) {
			t.Fatalf("%q %q %q → %q %v", a, b, c, got, err)
		}
	})
}

// setField returns data with the JSON string value of field (a top-level name, or scope.<part>)
// replaced by the raw JSON token tok.
func setField(t *testing.T, data []byte, field, tok string) []byte {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if part, ok := strings.CutPrefix(field, "scope."); ok {
		var s map[string]json.RawMessage
		if err := json.Unmarshal(m["scope"], &s); err != nil {
			t.Fatal(err)
		}
		s[part] = json.RawMessage(tok)
		b, _ := json.Marshal(s)
		m["scope"] = b
	} else {
		m[field] = json.RawMessage(tok)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// identityFields are the fields each input type bounds by MaxIdentityBytes.
var identityFields = map[string][]string{
	"live": {"scope.workspace", "scope.model", "scope.run", "scope.checkpoint", "scope.artifact", "correction_id", "opportunity_id"},
	"eval": {"scope.workspace", "scope.model", "scope.run", "scope.checkpoint", "scope.artifact", "correction_id", "opportunity_id",
		"suite", "case_id", "version"},
}

func parseAny(kind string, data []byte) error {
	if kind == "live" {
		_, err := ParseLiveAttempt(data, now, DefaultLimits)
		return err
	}
	_, err := ParseEvalResult(data, now, DefaultLimits)
	return err
}

func inputs(t *testing.T) map[string][]byte {
	eval, err := os.ReadFile("testdata/eval_result.json")
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{"live": []byte(validLive), "eval": eval}
}

// TestIdentityLimits: every identity field is accepted at MaxIdentityBytes bytes and dead-lettered
// as too_large one byte over, counting bytes of UTF-8, not characters.
func TestIdentityLimits(t *testing.T) {
	for kind, data := range inputs(t) {
		for _, f := range identityFields[kind] {
			t.Run(kind+"/"+f, func(t *testing.T) {
				tests := []struct {
					value  string
					reason Reason // "" means accepted
				}{
					{strings.Repeat("x", MaxIdentityBytes), ""},
					{strings.Repeat("x", MaxIdentityBytes+1), ReasonTooLarge},
					// 2-byte characters: 256 of them are 512 bytes, one more ASCII byte is over.
					{strings.Repeat("é", MaxIdentityBytes/2), ""},
					{strings.Repeat("é", MaxIdentityBytes/2) + "x", ReasonTooLarge},
				}
				for _, tc := range tests {
					tok, _ := json.Marshal(tc.value)
					err := parseAny(kind, setField(t, data, f, string(tok)))
					if ReasonOf(err) != tc.reason || (tc.reason == "") != (err == nil) {
						t.Fatalf("%d bytes: err = %v, want reason %q", len(tc.value), err, tc.reason)
					}
				}
			})
		}
	}
}

// TestIdentityUTF8: an identity field that decoders would repair into U+FFFD (invalid bytes, an
// unpaired surrogate escape) is dead-lettered as bad_value, so two distinct byte strings never
// share an aggregate; valid text, escaped or not, is accepted unchanged.
func TestIdentityUTF8(t *testing.T) {
	tests := []struct {
		name   string
		tok    string
		want   string // the decoded value when accepted
		reason Reason
	}{
		// A byte that is not UTF-8 at all.
		{"invalid byte", "\"w\xff\"", "", ReasonBadValue},
		// A truncated multi-byte sequence.
		{"truncated sequence", "\"w\xc3\"", "", ReasonBadValue},
		// Lone surrogate halves, high and low, in either case of hex.
		{"lone high", `"w\ud800"`, "", ReasonBadValue},
		{"lone low", `"w\uDC00x"`, "", ReasonBadValue},
		{"high then non-low", `"\ud83d\u0041"`, "", ReasonBadValue},
		// Valid: a surrogate pair, a literal U+FFFD, an escaped backslash before "ud800".
		{"pair", `"\ud83d\ude00"`, "😀", ""},
		{"replacement char", `"w\ufffd"`, "w\ufffd", ""},
		{"escaped backslash", `"\\ud800"`, `\ud800`, ""},
	}
	for kind, data := range inputs(t) {
		for _, f := range identityFields[kind] {
			for _, tc := range tests {
				t.Run(kind+"/"+f+"/"+tc.name, func(t *testing.T) {
					in := setField(t, data, f, "\"PLACEHOLDER\"")
					in = bytes.Replace(in, []byte(`"PLACEHOLDER"`), []byte(tc.tok), 1)
					err := parseAny(kind, in)
					if ReasonOf(err) != tc.reason || (tc.reason == "") != (err == nil) {
						t.Fatalf("err = %v, want reason %q", err, tc.reason)
					}
				})
			}
		}
	}
	// Invalid text elsewhere (a prediction) is not an identity and is left to the decoder.
	eval := inputs(t)["eval"]
	in := bytes.Replace(eval, []byte(`"You can return it within 90 days."`), []byte("\"bad \xff reply \\ud800\""), 1)
	if _, err := ParseEvalResult(in, now, DefaultLimits); err != nil {
		t.Fatalf("invalid UTF-8 in a prediction: %v", err)
	}
}

// TestRunsLimit: runs up to MaxRuns is accepted, above it dead-lettered as bad_value with the limit
// in the detail.
func TestRunsLimit(t *testing.T) {
	eval := inputs(t)["eval"]
	set := func(runs int) []byte { return setField(t, eval, "runs", strconv.Itoa(runs)) }
	if _, err := ParseEvalResult(set(MaxRuns), now, DefaultLimits); err != nil {
		t.Fatalf("runs = MaxRuns: %v", err)
	}
	for _, runs := range []int{MaxRuns + 1, 20000000, 1<<31 - 1} {
		_, err := ParseEvalResult(set(runs), now, DefaultLimits)
		var ie *InvalidError
		if !errors.As(err, &ie) || ie.Reason != ReasonBadValue || !strings.Contains(ie.Detail, strconv.Itoa(MaxRuns)) {
			t.Fatalf("runs = %d: err = %v, want bad_value naming %d", runs, err, MaxRuns)
		}
	}
	// run_index stays below runs, so below MaxRuns.
	in := setField(t, set(MaxRuns), "run_index", strconv.Itoa(MaxRuns))
	if _, err := ParseEvalResult(in, now, DefaultLimits); ReasonOf(err) != ReasonBadValue {
		t.Fatalf("run_index = MaxRuns: err = %v", err)
	}
}

// TestAssessedInFuture: assessed_at obeys the same skew rule as occurred_at, for both types.
func TestAssessedInFuture(t *testing.T) {
	for kind, data := range inputs(t) {
		tests := []struct {
			assessed string
			reason   Reason
		}{
			{"2026-11-29T12:05:00Z", ""},                       // exactly at the skew limit
			{"2026-11-29T12:05:00.000001Z", ReasonFutureEvent}, // just past it
			{"2199-12-31T00:00:00Z", ReasonFutureEvent},        // far future, pinning the opportunity
		}
		for _, tc := range tests {
			t.Run(kind+"/"+tc.assessed, func(t *testing.T) {
				err := parseAny(kind, setField(t, data, "assessed_at", `"`+tc.assessed+`"`))
				if ReasonOf(err) != tc.reason || (tc.reason == "") != (err == nil) {
					t.Fatalf("err = %v, want reason %q", err, tc.reason)
				}
			})
		}
	}
}
