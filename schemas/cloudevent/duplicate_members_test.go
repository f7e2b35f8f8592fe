package cloudevent

import (
	"errors"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// An event naming a member twice in one object is refused, in its attributes (bad_cloudevent) or
// in its data (bad_data): JSON readers disagree on which of the two counts (Go's decoders keep
// the last, many others the first), so the ingest could authorise it as one workspace and another
// consumer of the input topic read it as another. Names of the schema are compared as the decoder
// matches them (Unicode simple folding); attributes by their exact names. Before, every one of
// these decoded, the last member winning.
func TestMembersNamedTwiceAreRefused(t *testing.T) {
	d := newTestDecoder(t)
	for _, c := range []struct {
		name, from, to string
		want           schemas.Reason
	}{
		{"workspace twice", `"workspace":"w"`, `"workspace":"beta","workspace":"w"`, schemas.ReasonBadDataFormat},
		{"workspace in two cases", `"workspace":"w"`, `"workspace":"beta","Workspace":"w"`, schemas.ReasonBadDataFormat},
		{"workspace folded", `"workspace":"w"`, `"workspace":"w","workſpace":"beta"`, schemas.ReasonBadDataFormat},
		{"scope folded", `"scope":{`, `"ſcope":{"workspace":"beta","model":"m","run":"r","checkpoint":"c","artifact":"a"},"scope":{`, schemas.ReasonBadDataFormat},
		{"opportunity twice", `"opportunity_id":"o"`, `"opportunity_id":"x","opportunity_id":"o"`, schemas.ReasonBadDataFormat},
		{"id twice", `"id":"e1"`, `"id":"zz","id":"e1"`, schemas.ReasonBadEnvelope},
		{"data twice", `"data":`, `"data":{},"data":`, schemas.ReasonBadEnvelope},
		{"source twice", `"source":"src"`, `"source":"x","source":"src"`, schemas.ReasonBadEnvelope},
	} {
		m := kafka.Message{Value: []byte(strings.Replace(structured, c.from, c.to, 1))}
		_, err := d.Decode(&m, now)
		var ie *schemas.InvalidError
		if !errors.As(err, &ie) || ie.Reason != c.want {
			t.Errorf("%s: %v, want %s", c.name, err, c.want)
		}
	}
	// In binary mode the data is the body.
	m := kafka.Message{Value: []byte(strings.Replace(liveData, `"workspace":"w"`, `"workspace":"beta","workspace":"w"`, 1)),
		Headers: hdr("ce_specversion", "1.0", "ce_id", "e1", "ce_source", "src", "ce_type", schemas.TypeLiveAttempt, "content-type", "application/json")}
	if _, err := d.Decode(&m, now); !errors.Is(err, schemas.ErrInvalid) {
		t.Errorf("binary mode, workspace twice: %v", err)
	}
	// Names the schema does not read are left alone, on the slow path as on the fast one.
	for _, extra := range []string{`"x":1,"X":2`, `"é":0,"x":1,"X":2`} {
		m := kafka.Message{Value: []byte(strings.Replace(structured, `"outcome":"confirmed_repeat"`, `"outcome":"confirmed_repeat",`+extra, 1))}
		if _, err := d.Decode(&m, now); err != nil {
			t.Errorf("unknown members %s: %v", extra, err)
		}
	}
	// The same name in different objects is no duplicate.
	ok := kafka.Message{Value: []byte(strings.Replace(structured, `"outcome":"confirmed_repeat"`, `"outcome":"confirmed_repeat","x":{"id":"a","run":"b"}`, 1))}
	if _, err := d.Decode(&ok, now); err != nil {
		t.Errorf("names repeated across objects: %v", err)
	}
}
