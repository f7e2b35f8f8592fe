package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"slices"
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
