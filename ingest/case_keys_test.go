package ingest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// An eval result that is no correction check is now written keyed by its case
// (workspace|suite|case_id, escaped: up to 3 × 1 536 + 2 bytes for identities of 512 bytes that
// are all escaped). The processor's decoder counts the key in the message's size, so the handler
// must never accept an event and write it so that the processor dead-letters it as too_large; it
// must take one that fits with its key; the record limit counts the key too. And the ingest keys
// as produce keys (docs/semantics.md#ingest), which since 39af07f writes such an eval result
// unkeyed when its key would not fit (cloudevent.Decoder.MessageKey). These tests build such
// events, with the longest identities the schema takes, in the binary, structured and batch
// modes, at the limit without the key, at the limit with it and one byte over.

// caseKeysIdent is an identity of MaxIdentityBytes bytes, every byte of which JoinEscaped escapes.
func caseKeysIdent(c string) string {
	return strings.Repeat(c, schemas.MaxIdentityBytes/len(c))
}

// caseKeysSize is the decoder's count of m (consumer's messageSize): key, value, headers, each with
// its varint length, and the header count.
func caseKeysSize(m *kafka.Message) int {
	n := sink.VarintLen(len(m.Key)) + len(m.Key) + sink.VarintLen(len(m.Value)) + len(m.Value) + sink.VarintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += sink.HeaderSize(h)
	}
	return n
}

// caseKeysLimit is what caseKeysAtTheLimit hands each mode's check: post posts the event padded with n
// spaces to a handler with that record limit; unkeyedAt and keyedAt are the most spaces with which
// its message fits the decoder's limit without and with its case key.
type caseKeysLimit struct {
	post               func(recordLimit int64, n int) (*httptestAnswer, *fakeWriter)
	unkeyedAt, keyedAt int
	limit              int
	dec                *cloudevent.Decoder
	key                string
	sizeAt             func(n int, keyed bool) int
}

// caseKeysAtTheLimit runs check for the binary, structured and batch modes on an eval result that is
// no correction check with the longest escaped identities.
func caseKeysAtTheLimit(t *testing.T, check func(t *testing.T, l caseKeysLimit)) {
	ws, suiteName, caseID := caseKeysIdent("é"), caseKeysIdent("|"), caseKeysIdent("%")
	const token = "token-adversary5-writer-000"
	store, err := auth.NewStore([]auth.TokenConfig{{Name: "w", SHA256: auth.Hash(token), Workspaces: map[string]string{ws: "write"}}})
	if err != nil {
		t.Fatal(err)
	}
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	limit := dec.MaxMessageBytes()
	wantKey := schemas.JoinEscaped(ws, suiteName, caseID)
	if len(wantKey) != 3*3*schemas.MaxIdentityBytes+2 {
		t.Fatalf("key of %d bytes: the identities are not all escaped", len(wantKey))
	}
	data := evalData(ws, false)
	data["suite"], data["case_id"] = suiteName, caseID
	// pad puts n spaces inside a JSON object.
	pad := func(obj []byte, n int) []byte {
		return append(append([]byte("{"), bytes.Repeat([]byte(" "), n)...), obj[1:]...)
	}
	modes := []struct {
		name string
		// req returns the request of the event padded with n spaces.
		req func(n int) request
	}{
		{"binary", func(n int) request {
			return request{token: token, ctype: appJSON, headers: binaryHeaders("b1", schemas.TypeEvalResult), body: pad(mustJSON(data), n)}
		}},
		{"structured", func(n int) request {
			return request{token: token, ctype: ceJSON, body: pad(mustJSON(event("s1", schemas.TypeEvalResult, data)), n)}
		}},
		{"batch", func(n int) request {
			return request{token: token, ctype: ceBatch, body: append(append([]byte("["), pad(mustJSON(event("m1", schemas.TypeEvalResult, data)), n)...), ']')}
		}},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			newH := func(w Writer, recordLimit int64) *Handler {
				h, err := New(Config{LiveTopic: liveTopic, EvalTopic: evalTopic, Tokens: store, MaxBodyBytes: 2 << 20, RecordLimit: recordLimit},
					dec, w, func() time.Time { return testNow }, zap.NewNop())
				if err != nil {
					t.Fatal(err)
				}
				return h
			}
			post1 := func(recordLimit int64, n int) (*httptestAnswer, *fakeWriter) {
				w := &fakeWriter{}
				rec := post(newH(w, recordLimit), mode.req(n))
				var ans Answer
				if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil {
					t.Fatalf("%d %s", rec.Code, rec.Body)
				}
				return &httptestAnswer{code: rec.Code, ans: ans, body: clip300(rec.Body.String())}, w
			}
			// The message the handler writes, small: its size without the value tells where the
			// limit falls.
			a, w := post1(0, 0)
			if a.code != http.StatusAccepted || len(w.msgs) != 1 {
				t.Fatalf("the small event: %d %s", a.code, a.body)
			}
			m := w.msgs[0]
			if string(m.Key) != wantKey || a.ans.Events[0].Key != wantKey || m.Topic != evalTopic {
				t.Fatalf("written to %q keyed %q (answer says %q), want %q keyed by the case %q", m.Topic, m.Key, a.ans.Events[0].Key, evalTopic, wantKey)
			}
			if k, ok := mustEvent(t, dec, &m).PartitionKey(); !ok || k != wantKey {
				t.Fatalf("the decoded event's partition key is %q", k)
			}
			base := len(m.Value)
			// sizeAt is the decoder's count of the written message with n spaces, keyed or not.
			sizeAt := func(n int, keyed bool) int {
				mm := m
				mm.Value = nil
				if !keyed {
					mm.Key = nil
				}
				return caseKeysSize(&mm) - sink.VarintLen(0) + sink.VarintLen(base+n) + base + n
			}
			// fits returns the most spaces with which the message fits the limit.
			fits := func(keyed bool) int {
				n := limit - sizeAt(0, keyed)
				for sizeAt(n, keyed) > limit {
					n--
				}
				return n
			}
			unkeyedAt, keyedAt := fits(false), fits(true)
			if unkeyedAt-keyedAt < len(wantKey) {
				t.Fatalf("the key takes %d bytes, the padding moved by %d", len(wantKey), unkeyedAt-keyedAt)
			}
			check(t, caseKeysLimit{post: post1, unkeyedAt: unkeyedAt, keyedAt: keyedAt, limit: limit, dec: dec, key: wantKey, sizeAt: sizeAt})
		})
	}
}

// TestLongestCaseKeyAtTheLimit: never accepted and then dead-lettered. An event that
// fits only without its key is refused as too_large or written so that the processor takes it;
// one that fits with its key is written keyed and taken; the record limit counts the key.
func TestLongestCaseKeyAtTheLimit(t *testing.T) {
	caseKeysAtTheLimit(t, func(t *testing.T, l caseKeysLimit) {
		post1, unkeyedAt, keyedAt, limit, dec, sizeAt := l.post, l.unkeyedAt, l.keyedAt, l.limit, l.dec, l.sizeAt
		for _, recordLimit := range []int64{0, 2 << 20} {
			// Fits only without its key: refused as too_large with nothing written, or written
			// so that the processor takes it.
			for _, n := range []int{unkeyedAt, keyedAt + 1} {
				a, w := post1(recordLimit, n)
				switch a.code {
				case http.StatusBadRequest:
					if len(a.ans.Events) != 1 || a.ans.Events[0].Reason != schemas.ReasonTooLarge || a.ans.Events[0].Key != "" || len(w.msgs) != 0 {
						t.Fatalf("record limit %d, %d bytes over the keyed limit: %d %s (%d written)", recordLimit, sizeAt(n, true)-limit, a.code, a.body, len(w.msgs))
					}
				case http.StatusAccepted:
					if len(w.msgs) != 1 || a.ans.Events[0].Key != string(w.msgs[0].Key) {
						t.Fatalf("record limit %d, %d bytes over the keyed limit: %d %s (%d written)", recordLimit, sizeAt(n, true)-limit, a.code, a.body, len(w.msgs))
					}
					mustEvent(t, dec, &w.msgs[0])
				default:
					t.Fatalf("record limit %d, %d bytes over the keyed limit: %d %s", recordLimit, sizeAt(n, true)-limit, a.code, a.body)
				}
			}
			// Fits with its key: written keyed, and the processor's decoder takes what was written.
			a, w := post1(recordLimit, keyedAt)
			if a.code != http.StatusAccepted || len(w.msgs) != 1 || string(w.msgs[0].Key) != l.key {
				t.Fatalf("record limit %d, at the keyed limit: %d %s", recordLimit, a.code, a.body)
			}
			if got := caseKeysSize(&w.msgs[0]); got != limit {
				t.Fatalf("the written message is %d bytes by the decoder's count, want exactly %d", got, limit)
			}
			if k, _ := mustEvent(t, dec, &w.msgs[0]).PartitionKey(); k != string(w.msgs[0].Key) {
				t.Fatalf("written keyed %q, the event's partition key is %q", w.msgs[0].Key, k)
			}
		}
		// The record limit counts the key: exactly the keyed record takes it, a byte less refuses.
		_, w := post1(0, keyedAt)
		rs := int64(sink.RecordSize(&w.msgs[0]))
		if a, w := post1(rs, keyedAt); a.code != http.StatusAccepted || len(w.msgs) != 1 {
			t.Fatalf("record limit at the keyed record's %d bytes: %d %s", rs, a.code, a.body)
		}
		if a, w := post1(rs-1, keyedAt); a.code != http.StatusBadRequest || a.ans.Events[0].Reason != schemas.ReasonTooLarge || len(w.msgs) != 0 {
			t.Fatalf("record limit a byte below the keyed record's %d bytes: %d %s", rs, a.code, a.body)
		}
	})
}

// TestIngestKeysAsProduceAtTheLimit: docs/semantics.md#ingest writes events "keyed as
// produce keys them", and #message-keys writes an eval result whose case key would take its
// message past max_message_bytes unkeyed (cloudevent.Decoder.MessageKey, which produce, loadgen and
// import use). A valid eval result that fits only without its key must then be written, unkeyed,
// as produce writes it, and not refused as too_large.
func TestIngestKeysAsProduceAtTheLimit(t *testing.T) {
	caseKeysAtTheLimit(t, func(t *testing.T, l caseKeysLimit) {
		for _, n := range []int{l.unkeyedAt, l.keyedAt + 1, l.keyedAt} {
			a, w := l.post(0, n)
			if a.code != http.StatusAccepted || len(w.msgs) != 1 {
				t.Fatalf("%d bytes over the keyed limit, %d under the unkeyed one: %d %s", l.sizeAt(n, true)-l.limit, l.limit-l.sizeAt(n, false), a.code, a.body)
			}
			m := w.msgs[0]
			ev := mustEvent(t, l.dec, &m)
			unkeyed := m
			unkeyed.Key = nil
			if want := l.dec.MessageKey(ev, &unkeyed); string(m.Key) != string(want) {
				t.Fatalf("ingest keyed the message by %d bytes, produce keys it by %d", len(m.Key), len(want))
			}
		}
	})
}

// httptestAnswer is one answer of the handler.
type httptestAnswer struct {
	code int
	ans  Answer
	body string
}

// clip300 shortens an answer for a failure message (the keys are kilobytes long).
func clip300(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

// mustEvent decodes m as the processor does.
func mustEvent(t *testing.T, dec *cloudevent.Decoder, m *kafka.Message) cloudevent.Event {
	t.Helper()
	ev, err := dec.Decode(m, testNow)
	if err != nil {
		t.Fatalf("the processor would dead-letter the written message: %v", err)
	}
	return ev
}
