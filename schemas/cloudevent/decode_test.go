package cloudevent

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const liveData = `{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o","correction_id":"fix","occurred_at":"2026-11-29T11:00:00Z","assessed_at":"2026-11-29T11:00:00Z","outcome":"confirmed_repeat"}`

const structured = `{"specversion":"1.0","id":"e1","source":"src","type":"repeatrate.live.attempt.v1","datacontenttype":"application/json","data":` + liveData + `}`

func hdr(kv ...string) []kafka.Header {
	var hs []kafka.Header
	for i := 0; i < len(kv); i += 2 {
		hs = append(hs, kafka.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

func binaryHeaders(typ string) []kafka.Header {
	return hdr("ce_specversion", "1.0", "ce_id", "e2", "ce_source", "src", "ce_type", typ, "content-type", "application/json")
}

func newTestDecoder(t testing.TB) *Decoder {
	d, err := NewDecoder(DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestDecodeModes(t *testing.T) {
	d := newTestDecoder(t)
	tests := []struct {
		name string
		msg  kafka.Message
		id   string
	}{
		// Structured mode with its content type.
		{"structured", kafka.Message{Value: []byte(structured), Headers: hdr("content-type", "application/cloudevents+json; charset=utf-8")}, "e1"},
		// Structured without any header, as plain tools write it.
		{"structured bare", kafka.Message{Value: []byte(structured)}, "e1"},
		// Binary mode: attributes in ce_ headers, data in the value.
		{"binary", kafka.Message{Value: []byte(liveData), Headers: binaryHeaders(schemas.TypeLiveAttempt)}, "e2"},
		// Binary with an extension and a time attribute.
		{"binary extension", kafka.Message{Value: []byte(liveData), Headers: append(binaryHeaders(schemas.TypeLiveAttempt),
			hdr("ce_time", "2026-11-29T11:00:00Z", "ce_tenant", "t1")...)}, "e2"},
		// Media types are case-insensitive and take parameters: the fast path takes these...
		{"structured Application/JSON", kafka.Message{Value: []byte(withCT(structured, "Application/JSON"))}, "e1"},
		{"structured +json", kafka.Message{Value: []byte(withCT(structured, "application/vnd.acme.event+JSON"))}, "e1"},
		// ...and the SDK path (here for an extension attribute) too.
		{"structured extension APPLICATION/JSON; charset", kafka.Message{Value: []byte(withCT(strings.Replace(structured, `"id":"e1"`, `"id":"e1","tenant":"t1"`, 1),
			"APPLICATION/JSON; charset=UTF-8"))}, "e1"},
		{"structured header case", kafka.Message{Value: []byte(structured), Headers: hdr("Content-Type", "Application/CloudEvents+JSON; charset=UTF-8")}, "e1"},
		{"binary Application/JSON; charset", kafka.Message{Value: []byte(liveData), Headers: append(binaryHeaders(schemas.TypeLiveAttempt)[:4],
			hdr("Content-Type", "Application/JSON; charset=utf-8")...)}, "e2"},
		// Structured data carried as base64.
		{"data_base64", kafka.Message{Value: []byte(`{"specversion":"1.0","id":"e3","source":"s","type":"repeatrate.live.attempt.v1","data_base64":"` + b64(liveData) + `"}`)}, "e3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := d.Decode(&tc.msg, now)
			if err != nil {
				t.Fatal(err)
			}
			if ev.ID != tc.id || ev.Live == nil || ev.Live.Outcome != schemas.OutcomeConfirmedRepeat || ev.Live.Scope.Artifact != "a" {
				t.Fatalf("event = %+v %+v", ev, ev.Live)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	d := newTestDecoder(t)
	big := kafka.Message{Value: []byte(strings.Repeat(" ", 1<<20) + structured)}
	tests := []struct {
		name   string
		msg    kafka.Message
		reason schemas.Reason
	}{
		{"bytes", kafka.Message{Value: []byte{0xff, 0x00, 0x13}}, schemas.ReasonUndecodable},
		{"empty", kafka.Message{}, schemas.ReasonUndecodable},
		{"broken json", kafka.Message{Value: []byte(structured[:50])}, schemas.ReasonUndecodable},
		{"no id", kafka.Message{Value: []byte(strings.Replace(structured, `"id":"e1",`, "", 1))}, schemas.ReasonBadEnvelope},
		{"wrong specversion", kafka.Message{Value: []byte(liveData), Headers: append(hdr("ce_specversion", "0.3"), binaryHeaders("x")[1:]...)}, schemas.ReasonBadEnvelope},
		{"binary without source", kafka.Message{Value: []byte(liveData), Headers: hdr("ce_specversion", "1.0", "ce_id", "x", "ce_type", schemas.TypeLiveAttempt)}, schemas.ReasonBadEnvelope},
		{"binary bad time", kafka.Message{Value: []byte(liveData), Headers: append(binaryHeaders(schemas.TypeLiveAttempt), hdr("ce_time", "noon")...)}, schemas.ReasonBadEnvelope},
		{"unknown type", kafka.Message{Value: []byte(liveData), Headers: binaryHeaders("com.example.other")}, schemas.ReasonUnknownType},
		{"xml data", kafka.Message{Value: []byte("<a/>"), Headers: append(binaryHeaders(schemas.TypeLiveAttempt)[:4], hdr("content-type", "application/xml")...)}, schemas.ReasonBadDataFormat},
		{"bad data", kafka.Message{Value: []byte(`{"x":1}`), Headers: binaryHeaders(schemas.TypeLiveAttempt)}, schemas.ReasonMissingField},
		{"too large", big, schemas.ReasonTooLarge},
		// Half a million empty headers and a few bytes of value: over 1 MiB as a Kafka record
		// holds it (two length bytes per header), though its content is only the value.
		{"many empty headers", kafka.Message{Value: []byte("garbage"), Headers: make([]kafka.Header, 525_000)}, schemas.ReasonTooLarge},
		// Identity text that a decoder would repair into U+FFFD, in both modes: structured invalid
		// bytes take the SDK path, a lone surrogate escape the fast path.
		{"structured invalid UTF-8", kafka.Message{Value: []byte(strings.Replace(structured, `"workspace":"w"`, "\"workspace\":\"w\xff\"", 1))}, schemas.ReasonBadValue},
		{"structured lone surrogate", kafka.Message{Value: []byte(strings.Replace(structured, `"workspace":"w"`, `"workspace":"w\udc80"`, 1))}, schemas.ReasonBadValue},
		{"binary invalid UTF-8", kafka.Message{Value: []byte(strings.Replace(liveData, `"opportunity_id":"o"`, "\"opportunity_id\":\"o\xc3\"", 1)), Headers: binaryHeaders(schemas.TypeLiveAttempt)}, schemas.ReasonBadValue},
		{"binary lone surrogate", kafka.Message{Value: []byte(strings.Replace(liveData, `"correction_id":"fix"`, `"correction_id":"fix\ud800"`, 1)), Headers: binaryHeaders(schemas.TypeLiveAttempt)}, schemas.ReasonBadValue},
		// A far-future assessment, in both modes.
		{"structured future assessment", kafka.Message{Value: []byte(strings.Replace(structured, `"assessed_at":"2026-11-29T11:00:00Z"`, `"assessed_at":"2030-01-01T00:00:00Z"`, 1))}, schemas.ReasonFutureEvent},
		{"binary future assessment", kafka.Message{Value: []byte(strings.Replace(liveData, `"assessed_at":"2026-11-29T11:00:00Z"`, `"assessed_at":"2026-11-29T12:05:01Z"`, 1)), Headers: binaryHeaders(schemas.TypeLiveAttempt)}, schemas.ReasonFutureEvent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.Decode(&tc.msg, now)
			if !errors.Is(err, schemas.ErrInvalid) || schemas.ReasonOf(err) != tc.reason {
				t.Fatalf("err = %v, want reason %s", err, tc.reason)
			}
		})
	}
}

// withCT returns the structured event v with datacontenttype ct.
func withCT(v, ct string) string {
	return strings.Replace(v, `"datacontenttype":"application/json"`, `"datacontenttype":"`+ct+`"`, 1)
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(structured), false)
	f.Add([]byte(liveData), true)
	f.Add([]byte(`{"specversion":"1.0","id":"e3","source":"s","type":"repeatrate.eval.result.v1","data":{}}`), false)
	f.Add([]byte(`{"data_base64":"!!"}`), false)
	f.Add([]byte(withCT(structured, "Application/JSON; charset=utf-8")), false)
	f.Add([]byte(strings.Replace(structured, `"workspace":"w"`, "\"workspace\":\"w\xff\"", 1)), false)
	f.Add([]byte(strings.Replace(liveData, `"model":"m"`, `"model":"m\ud83d\ude00"`, 1)), true)
	d := newTestDecoder(f)
	f.Fuzz(func(t *testing.T, value []byte, binary bool) {
		m := kafka.Message{Value: value}
		if binary {
			m.Headers = binaryHeaders(schemas.TypeLiveAttempt)
		}
		ev, err := d.Decode(&m, now)
		if err != nil {
			if !errors.Is(err, schemas.ErrInvalid) || schemas.ReasonOf(err) == "" {
				t.Fatalf("error without a dead-letter reason: %v", err)
			}
			return
		}
		if (ev.Live == nil) == (ev.Eval == nil) {
			t.Fatalf("decoded event carries %v live, %v eval", ev.Live != nil, ev.Eval != nil)
		}
		if ev.Live != nil && (ev.Live.Scope.Workspace == "" || ev.Live.OpportunityID == "" || ev.Live.OccurredAt.After(now.Add(5*time.Minute)) ||
			ev.Live.AssessedAt.After(now.Add(5*time.Minute))) {
			t.Fatalf("accepted an invalid live attempt: %+v", ev.Live)
		}
		if ev.Live != nil {
			s := ev.Live.Scope
			for _, v := range []string{s.Workspace, s.Model, s.Run, s.Checkpoint, s.Artifact, ev.Live.CorrectionID, ev.Live.OpportunityID} {
				if len(v) > schemas.MaxIdentityBytes || !utf8.ValidString(v) {
					t.Fatalf("accepted an identity field of %d bytes, valid UTF-8 %v", len(v), utf8.ValidString(v))
				}
			}
		}
	})
}

func FuzzFastPathAgreesWithSDK(f *testing.F) {
	f.Add([]byte(structured))
	f.Add([]byte(`{"specversion":"1.0","id":"a","source":"b","type":"t","time":"2026-11-29T11:00:00Z","subject":"s","data":{"x":1}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"a","source":"%zz","type":"t","data":{}}`))
	f.Add([]byte(`{"specversion":"1.0","id":"a","source":"b","type":"t","data":{},"data":{"y":2}}`))
	f.Add([]byte(withCT(structured, "Application/JSON")))
	f.Add([]byte(withCT(structured, "text/plain")))
	f.Fuzz(func(t *testing.T, value []byte) {
		fast, ok := fastStructured(value)
		if !ok {
			return
		}
		slow, err := sdkStructured(value)
		if err != nil {
			t.Fatalf("fast path accepted what the SDK rejects (%v): %q", err, value)
		}
		sdk := attributesOf(slow)
		if fast.id != sdk.id || fast.source != sdk.source || fast.typ != sdk.typ || fast.subject != sdk.subject ||
			fast.contentType != sdk.contentType || !fast.time.Equal(sdk.time) || !bytes.Equal(fast.data, sdk.data) {
			t.Fatalf("fast path and SDK disagree on %q:\nfast %+v\nsdk  %+v", value, fast, sdk)
		}
	})
}

// TestMessageSize: the input limit counts what a Kafka v2 record holds of key, value and headers,
// length prefixes included, so that an empty header is not free. Each case is also checked against
// kafka-go's own encoding of the record.
func TestMessageSize(t *testing.T) {
	tests := []struct {
		name string
		msg  kafka.Message
		want int
	}{
		// Null key and value, no header: three one-byte varints (key and value lengths, count).
		{"empty", kafka.Message{}, 3},
		{"key and value", kafka.Message{Key: []byte("k"), Value: []byte("vv")}, 1 + 1 + 1 + 2 + 1},
		// An empty header costs its two length bytes.
		{"one empty header", kafka.Message{Headers: make([]kafka.Header, 1)}, 3 + 2},
		{"one header", kafka.Message{Headers: hdr("a", "bc")}, 3 + 1 + 1 + 1 + 2},
		// 63 bytes take a one-byte zig-zag length, 64 bytes two.
		{"63-byte value", kafka.Message{Value: make([]byte, 63)}, 1 + 1 + 63 + 1},
		{"64-byte value", kafka.Message{Value: make([]byte, 64)}, 1 + 2 + 64 + 1},
		// 200 empty headers: 400 bytes and a two-byte count.
		{"200 empty headers", kafka.Message{Headers: make([]kafka.Header, 200)}, 1 + 1 + 2 + 400},
		{"binary event", kafka.Message{Key: []byte("key"), Value: []byte(liveData), Headers: binaryHeaders(schemas.TypeLiveAttempt)}, -1},
	}
	encoded := func(m *kafka.Message) int {
		var b bytes.Buffer
		rs := protocol.RecordSet{Version: 2, Records: protocol.NewRecordReader(protocol.Record{
			Time: now, Key: bytesOrNil(m.Key), Value: bytesOrNil(m.Value), Headers: m.Headers})}
		if _, err := rs.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		return b.Len()
	}
	// A record is its length (a varint), attributes, timestamp and offset deltas (one byte each
	// here), then what MessageSize counts; the batch around it is the same for every record.
	base := encoded(&kafka.Message{}) - sink.VarintLen(3+3) - (3 + 3)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := MessageSize(&tc.msg)
			if tc.want >= 0 && got != tc.want {
				t.Fatalf("MessageSize = %d, want %d", got, tc.want)
			}
			if n := encoded(&tc.msg) - base - sink.VarintLen(3+got) - 3; n != got {
				t.Fatalf("MessageSize = %d, kafka-go encodes %d bytes", got, n)
			}
		})
	}
}

func bytesOrNil(b []byte) protocol.Bytes {
	if b == nil {
		return nil
	}
	return protocol.NewBytes(b)
}

func TestUndecodableDetail(t *testing.T) {
	d := newTestDecoder(t)
	// Words of the JSON readers' internals that must not reach a dead letter's detail.
	internals := []string{"skipThreeBytes", "ReadString", "ReadObject", "readObjectStart", "error found in",
		"bigger context", "#10", "|..."}
	for _, c := range []struct {
		name, value string
		want        string // the start of the detail
	}{
		// The reported case: a literal that is not null, in a member the fast path leaves to the SDK.
		{"bad literal", `{"specversion":"1.0","ext":nope}`,
			`invalid JSON at byte 29: invalid character 'o' in literal null (expecting 'u')`},
		// A literal that is not null, in a known attribute.
		{"bad null", `{"specversion":nuXX}`, `invalid JSON at byte 18: invalid character 'X' in literal null`},
		// Cut off inside the object.
		{"truncated", `{"specversion":"1.0","id":"a",`,
			`invalid JSON: the value ends at byte 30 inside an unfinished object, array or string`},
		// A missing comma.
		{"missing comma", `{"specversion":"1.0" "id":"a"}`,
			"invalid JSON at byte 22: invalid character '\"' after object key:value pair, near `{\"specversion\":\"1.0\" \"`"},
		// A trailing comma in data.
		{"trailing comma", `{"specversion":"1.0","id":"a","source":"s","type":"t","data":{"x":1,}}`,
			`invalid JSON at byte 69: invalid character '}' looking for beginning of object key string`},
		// A raw control character in a string.
		{"control character", "{\"specversion\":\"1.0\",\"id\":\"a\x01\"}",
			`invalid JSON at byte 29: invalid character '\x01' in string literal, near ` + "`" + `cversion":"1.0","id":"a\x01` + "`"},
		// A bad exponent.
		{"bad number", `{"a":1e}`, `invalid JSON at byte 8: invalid character '}' in exponent of numeric literal`},
		// Something after the object.
		{"trailing text", `{"a":"b"} x`, `invalid JSON at byte 11: invalid character 'x' after top-level value`},
		// Offsets count in the value as received, leading white space included.
		{"leading space", " \n\t{\"id\":tru}", `invalid JSON at byte 13: invalid character '}' in literal true`},
		// Valid JSON, an attribute of the wrong type: named, with where its value starts.
		{"number id", `{"specversion":"1.0","id":5,"source":"s","type":"t","data":{}}`,
			`attribute id is a number at byte 27, not a string`},
		{"object source", `{"specversion":"1.0","id":"a","source":{},"type":"t","data":{}}`,
			`attribute source is an object at byte 40, not a string`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := d.Decode(&kafka.Message{Value: []byte(c.value)}, time.Now())
			var ie *schemas.InvalidError
			if !errors.As(err, &ie) || ie.Reason != schemas.ReasonUndecodable {
				t.Fatalf("error %v, want %s", err, schemas.ReasonUndecodable)
			}
			if !strings.HasPrefix(ie.Detail, c.want) {
				t.Errorf("detail %q\nwant it to start %q", ie.Detail, c.want)
			}
			for _, w := range internals {
				if strings.Contains(ie.Detail, w) {
					t.Errorf("detail %q names the decoder's internals (%q)", ie.Detail, w)
				}
			}
		})
	}
}

// The dead-letter detail of an envelope with several bad attributes is the same on every
// delivery: the SDK's complaint lists them in map order, different from run to run.
func TestBadEnvelopeDetailIsStable(t *testing.T) {
	d := newTestDecoder(t)
	msg := kafka.Message{Value: []byte(`{"specversion":"1.0","source":"s","data":{}}`)}
	var first string
	for i := range 50 {
		_, err := d.Decode(&msg, now)
		var ie *schemas.InvalidError
		if !errors.As(err, &ie) || ie.Reason != schemas.ReasonBadEnvelope {
			t.Fatalf("want a bad envelope, got %v", err)
		}
		if i == 0 {
			first = ie.Detail
			if strings.Count(first, "\n") < 2 {
				t.Fatalf("detail %q names fewer than two attributes: the test tests nothing", first)
			}
		} else if ie.Detail != first {
			t.Fatalf("detail changed between deliveries:\n%q\n%q", first, ie.Detail)
		}
	}
}
