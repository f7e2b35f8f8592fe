package cloudevent

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// A CloudEvent id that is not UTF-8 text is refused (bad_cloudevent) on every path — structured
// (the fast path and the SDK's), binary — instead of being written on raw into dead letters,
// answers and logs, where JSON encoders change it. Its reason's detail is valid text. Before, all
// three decoded with the raw id.
func TestEventIDsAreText(t *testing.T) {
	d := newTestDecoder(t)
	const bad = "e\xff1"
	withID := strings.Replace(structured, `"id":"e1"`, `"id":"`+bad+`"`, 1)
	cases := map[string]kafka.Message{
		"structured":              {Value: []byte(withID)},
		"structured, SDK decoded": {Value: []byte(strings.Replace(withID, `"datacontenttype":"application/json",`, `"datacontenttype":"application/json","xext":"1",`, 1))},
		"binary": {Value: []byte(liveData), Headers: hdr("ce_specversion", "1.0", "ce_id", bad, "ce_source", "src",
			"ce_type", schemas.TypeLiveAttempt, "content-type", "application/json")},
	}
	for name, m := range cases {
		_, err := d.Decode(&m, now)
		var ie *schemas.InvalidError
		if !errors.As(err, &ie) || ie.Reason != schemas.ReasonBadEnvelope || !utf8.ValidString(ie.Detail) {
			t.Errorf("%s: %v, want bad_cloudevent with a UTF-8 detail", name, err)
		}
	}
	if _, err := d.DecodeStructured([]byte(withID), now); err == nil {
		t.Error("DecodeStructured took an id that is not UTF-8")
	}
	// A valid id with any Unicode still passes.
	ok := kafka.Message{Value: []byte(strings.Replace(structured, `"id":"e1"`, `"id":"é-1 ✓"`, 1))}
	if ev, err := d.Decode(&ok, now); err != nil || ev.ID != "é-1 ✓" {
		t.Errorf("a Unicode id: %q %v", ev.ID, err)
	}
}
