package consumer

import (
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
)

// go test -run '^$' -bench Decode -benchmem ./consumer
func BenchmarkDecode(b *testing.B) {
	d := newTestDecoder(b)
	for _, bc := range []struct {
		name string
		msg  kafka.Message
	}{
		{"structured", kafka.Message{Value: []byte(structured), Headers: hdr("content-type", "application/cloudevents+json")}},
		{"binary", kafka.Message{Value: []byte(liveData), Headers: binaryHeaders(schemas.TypeLiveAttempt)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.msg.Value)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := d.Decode(&bc.msg, now); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
