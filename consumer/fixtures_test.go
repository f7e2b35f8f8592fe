package consumer

import (
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

// newTestDecoder is a decoder with the documented defaults.
func newTestDecoder(t testing.TB) *cloudevent.Decoder {
	d, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// now is the receipt time of the tests' events.
var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// liveData is a live attempt's data, and structured the structured CloudEvent that carries it.
const liveData = `{"scope":{"workspace":"w","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o","correction_id":"fix","occurred_at":"2026-11-29T11:00:00Z","assessed_at":"2026-11-29T11:00:00Z","outcome":"confirmed_repeat"}`

const structured = `{"specversion":"1.0","id":"e1","source":"src","type":"repeatrate.live.attempt.v1","datacontenttype":"application/json","data":` + liveData + `}`

// hdr makes Kafka headers of key, value pairs.
func hdr(kv ...string) []kafka.Header {
	var hs []kafka.Header
	for i := 0; i < len(kv); i += 2 {
		hs = append(hs, kafka.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return hs
}

// binaryHeaders are the headers of a binary-mode event of type typ.
func binaryHeaders(typ string) []kafka.Header {
	return hdr("ce_specversion", "1.0", "ce_id", "e2", "ce_source", "src", "ce_type", typ, "content-type", "application/json")
}
