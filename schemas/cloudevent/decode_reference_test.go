package cloudevent

import (
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// Adversarial structured events: Decode and DecodeStructured agree with the reference decoder
// on each (same event, or same reason and detail).
func TestDecodeAdversarialAgrees(t *testing.T) {
	env := func(from, to string) string { return strings.Replace(structured, from, to, 1) }
	evalEnv := func(from, to string) string { return strings.Replace(structuredEval, from, to, 1) }
	nest := func(n int) string { return strings.Repeat(`{"a":[`, n) + "1" + strings.Repeat(`]}`, n) }
	pred := func(s string) string { return evalEnv(`"prediction":"You can\nreturn it."`, `"prediction":"`+s+`"`) }
	big := schemas.DefaultLimits.MaxPredictionBytes
	ident := func(s string) string { return env(`"opportunity_id":"o"`, `"opportunity_id":"`+s+`"`) }
	tests := []struct{ name, value string }{
		{"BOM", "\ufeff" + structured},
		{"BOM in data", env(`"data":`, `"data":`+"\ufeff")},
		{"nested unknown member 100", env(`"outcome"`, `"x":`+nest(100)+`,"outcome"`)},
		{"nested unknown member 10000", env(`"outcome"`, `"x":`+nest(10000)+`,"outcome"`)},
		{"nested envelope extension", env(`"id":"e1"`, `"id":"e1","x":`+nest(3000))},
		{"huge seq", env(`"outcome"`, `"assessment_seq":123456789012345678901234567890,"outcome"`)},
		{"seq 2^63", env(`"outcome"`, `"assessment_seq":9223372036854775808,"outcome"`)},
		{"seq -2^63", env(`"outcome"`, `"assessment_seq":-9223372036854775808,"outcome"`)},
		{"seq 1e2", env(`"outcome"`, `"assessment_seq":1e2,"outcome"`)},
		{"seq 1e400", env(`"outcome"`, `"assessment_seq":1e400,"outcome"`)},
		{"seq -0", env(`"outcome"`, `"assessment_seq":-0,"outcome"`)},
		{"seq 01", env(`"outcome"`, `"assessment_seq":01,"outcome"`)},
		{"seq NaN", env(`"outcome"`, `"assessment_seq":NaN,"outcome"`)},
		{"seq Infinity", env(`"outcome"`, `"assessment_seq":Infinity,"outcome"`)},
		{"seq string", env(`"outcome"`, `"assessment_seq":"1","outcome"`)},
		{"score NaN", evalEnv(`"score":0.25`, `"score":NaN`)},
		{"score 1e309", evalEnv(`"score":0.25`, `"score":1e309`)},
		{"score -0", evalEnv(`"score":0.25`, `"score":-0`)},
		{"score 4.9e-324", evalEnv(`"score":0.25`, `"score":4.9e-324`)},
		{"score huge digits", evalEnv(`"score":0.25`, `"score":0.`+strings.Repeat("1", 5000))},
		{"runs 1e1", evalEnv(`"runs":5`, `"runs":1e1`)},
		{"runs 5.0", evalEnv(`"runs":5`, `"runs":5.0`)},
		{"runs huge", evalEnv(`"runs":5`, `"runs":99999999999999999999999`)},
		{"version_seq -1", evalEnv(`"version_seq":12`, `"version_seq":-1`)},
		{"id NUL escaped", env(`"id":"e1"`, `"id":"e\u0000"`)},
		{"opportunity NUL escaped", ident(`o\u0000`)},
		{"opportunity NUL raw", ident("o\x00")},
		{"opportunity invalid UTF-8", ident("o\xff\xfe")},
		{"opportunity truncated UTF-8", ident("o\xc3")},
		{"opportunity surrogate escaped UTF-8", ident(`\udc00`)},
		{"opportunity 512 escaped", ident(strings.Repeat(`\u00e9`, 256))},
		{"opportunity 513 via escapes", ident(strings.Repeat(`\u00e9`, 256) + "x")},
		{"opportunity 512 raw é", ident(strings.Repeat("é", 256))},
		{"opportunity 171 invalid -> 513", ident(strings.Repeat("\xff", 171))},
		{"opportunity 200 invalid", ident(strings.Repeat("\xff", 200))},
		{"opportunity 512 invalid", ident(strings.Repeat("\xff", 512))},
		{"prediction at limit", pred(strings.Repeat("a", big))},
		{"prediction limit+1", pred(strings.Repeat("a", big+1))},
		{"prediction escapes at limit", pred(strings.Repeat(`\n`, big))},
		{"prediction escapes over limit", pred(strings.Repeat(`\n`, big+1))},
		{"prediction invalid UTF-8 near limit", pred(strings.Repeat("\xff", big/3+1))},
		{"prediction invalid UTF-8 at limit", pred(strings.Repeat("\xff", big))},
		{"prediction unicode escapes", pred(strings.Repeat(`\u20ac`, big/3+1))},
		{"prediction null", evalEnv(`"prediction":"You can\nreturn it."`, `"prediction":null`)},
		{"duplicate Data key", env(`"data":`, `"Data":{},"data":`)},
		{"duplicate DATA after", structured[:len(structured)-1] + `,"DATA":{}}`},
		{"duplicate TYPE", env(`"id":"e1"`, `"id":"e1","TYPE":"x"`)},
		{"duplicate scope case", env(`"scope":`, `"Scope":{},"scope":`)},
		{"duplicate scope after", env(`"opportunity_id"`, `"SCOPE":{"workspace":"x"},"opportunity_id"`)},
		{"duplicate workspace case", env(`"workspace":"w"`, `"workspace":"w","WorkSpace":"v"`)},
		{"unicode-folded name", env(`"outcome"`, "\"outcom\u212a\":\"passed\",\"outcome\"")},
		{"kelvin in scope", env(`"model":"m"`, "\"model\":\"m\",\"mode\u212c\":\"x\"")},
		{"long-s name", env(`"outcome":"confirmed_repeat"`, "\"outcome\":\"confirmed_repeat\",\"\u017fcope\":{}")},
		{"trailing garbage", structured + "garbage"},
		{"trailing NUL", structured + "\x00"},
		{"trailing object", structured + "{}"},
		{"trailing white space", structured + " \n\t\r"},
		{"garbage after data", env(`"data":`+liveData, `"data":`+liveData+`x`)},
		{"comment", env(`"data":`, `/*c*/"data":`)},
		{"single quotes", strings.ReplaceAll(structured, `"id":"e1"`, `'id':'e1'`)},
		{"literal true data", env(`"data":`+liveData, `"data":true`)},
		{"data array", env(`"data":`+liveData, `"data":[`+liveData+`]`)},
		{"time leap second", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29T11:00:60Z"`)},
		{"time lowercase", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29t11:00:00z"`)},
		{"time 24:00", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-28T24:00:00Z"`)},
		{"time offset 24", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29T11:00:00+24:00"`)},
		{"time nano 10 digits", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29T11:00:00.1234567891Z"`)},
		{"time year 0", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"0000-01-01T00:00:00Z"`)},
		{"time escaped", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29T11:00:00\u005a"`)},
		{"time space", env(`"occurred_at":"2026-11-29T11:00:00Z"`, `"occurred_at":"2026-11-29 11:00:00Z"`)},
		{"outcome escaped", env(`"outcome":"confirmed_repeat"`, `"outcome":"passe\u0064"`)},
		{"outcome upper", env(`"outcome":"confirmed_repeat"`, `"outcome":"PASSED"`)},
		{"scope null", env(`"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"}`, `"scope":null`)},
		{"scope workspace null", env(`"workspace":"w"`, `"workspace":null`)},
		{"workspace number", env(`"workspace":"w"`, `"workspace":5`)},
		{"specversion 1.00", env(`"specversion":"1.0"`, `"specversion":"1.00"`)},
		{"specversion number", env(`"specversion":"1.0"`, `"specversion":1.0`)},
		{"type with space", env(`"type":"repeatrate.live.attempt.v1"`, `"type":" repeatrate.live.attempt.v1"`)},
		{"type escaped", env(`"type":"repeatrate.live.attempt.v1"`, `"type":"repeatrate.live.attempt.v\u0031"`)},
		{"data empty object", env(`"data":`+liveData, `"data":{}`)},
	}
	d := newTestDecoder(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			value := []byte(tc.value)
			for range 2 {
				for _, h := range [][]kafka.Header{nil, hdr("content-type", "application/cloudevents+json")} {
					m := kafka.Message{Value: value, Headers: h}
					got, gotErr := d.Decode(&m, now)
					want, wantErr := d.refDecode(&m, now)
					sameDecode(t, tc.name, got, want, gotErr, wantErr)
				}
				got, gotErr := d.DecodeStructured(value, now)
				want, wantErr := d.refDecodeStructured(value, now)
				sameDecode(t, tc.name, got, want, gotErr, wantErr)
			}
		})
	}
}
