package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// msgRecorder keeps the messages written to it.
type msgRecorder struct{ msgs []kafka.Message }

func (r *msgRecorder) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	r.msgs = append(r.msgs, msgs...)
	return nil
}

// produceKeysMessageSize is the decoder's count of m (docs/semantics.md#limits): key, value and headers
// with their varint lengths, and the header count.
func produceKeysMessageSize(m *kafka.Message) int {
	n := sink.VarintLen(len(m.Key)) + len(m.Key) + sink.VarintLen(len(m.Value)) + len(m.Value) + sink.VarintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += sink.HeaderSize(h)
	}
	return n
}

// TestProduceKeyDoesNotDeadLetterAValidLine: docs/semantics.md#message-keys says a
// message's key decides nothing that is counted, and the README that replay counts what run
// counts for the same input. produce now keys an eval result that is no correction check by its
// case, a key of up to 4 610 bytes, and the processor's decoder counts the key toward
// max_message_bytes. A valid eval result (an extra data member makes it large, as an exporter's
// metadata does) whose message as produce wrote it before (unkeyed, with its content-type header)
// is exactly at the limit is counted by replay; the message produce writes must be one the
// processor's decoder takes, not one it dead-letters as too_large.
func TestProduceKeyDoesNotDeadLetterAValidLine(t *testing.T) {
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	ident := func(c string) string { return strings.Repeat(c, schemas.MaxIdentityBytes/len(c)) }
	at := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	line := func(extra int) []byte {
		data := map[string]any{
			"scope": map[string]string{"workspace": ident("é"), "model": "m", "run": "r", "checkpoint": "c", "artifact": "a"},
			"suite": ident("|"), "case_id": ident("%"), "version": "v1", "version_seq": 1, "run_index": 0, "runs": 1,
			"result": "pass", "occurred_at": at, "assessed_at": at,
			"metadata": strings.Repeat("x", extra),
		}
		b, err := json.Marshal(map[string]any{"specversion": "1.0", "id": "big", "source": "t", "type": schemas.TypeEvalResult,
			"datacontenttype": "application/json", "data": data})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// The message produce wrote before it keyed eval results: the line, its content-type header,
	// no key. Pad the line so that this message is exactly at the decoder's limit.
	unkeyed := func(l []byte) *kafka.Message {
		return &kafka.Message{Value: l, Headers: []kafka.Header{{Key: "content-type", Value: []byte(sink.ContentType)}}}
	}
	limit := dec.MaxMessageBytes()
	extra := limit - produceKeysMessageSize(unkeyed(line(0)))
	for produceKeysMessageSize(unkeyed(line(extra))) > limit {
		extra--
	}
	l := line(extra)
	if got := produceKeysMessageSize(unkeyed(l)); got != limit {
		t.Fatalf("the unkeyed message is %d bytes, want exactly %d", got, limit)
	}
	// Replay reads it (a structured line within the limit), and so did the processor unkeyed.
	if _, err := dec.DecodeStructured(l, time.Now()); err != nil {
		t.Fatalf("replay would refuse the line: %v", err)
	}
	if _, err := dec.Decode(unkeyed(l), time.Now()); err != nil {
		t.Fatalf("the processor would refuse the unkeyed message: %v", err)
	}
	var w msgRecorder
	if n, err := produce(context.Background(), strings.NewReader(string(l)+"\n"), &w); err != nil || n != 1 {
		t.Fatalf("produced %d: %v", n, err)
	}
	m := w.msgs[0]
	if _, err := dec.Decode(&m, time.Now()); err != nil {
		t.Fatalf("produce wrote the valid line keyed by %d bytes, and the processor dead-letters it: %v", len(m.Key), err)
	}
}
