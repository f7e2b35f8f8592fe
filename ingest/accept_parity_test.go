package ingest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// TestIngestAcceptsOnlyWhatTheProcessorTakes: an event the handler accepts is one the processor's
// decoder takes as written — with the key the handler adds. A binary-mode event whose message is
// exactly the decoder's limit without its key was accepted (202) and then dead-lettered as
// too_large by the processor, which counts the key.
func TestIngestAcceptsOnlyWhatTheProcessorTakes(t *testing.T) {
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	for _, c := range []struct {
		name        string
		recordLimit int64
	}{
		{"no record limit", 0},
		{"input topic taking 2 MiB records", 2 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &fakeWriter{}
			h := newHandler(t, w, Config{MaxBodyBytes: 2 << 20, RecordLimit: c.recordLimit})
			data := mustJSON(liveData("acme", "opp-big"))
			hdr := binaryHeaders("big1", schemas.TypeLiveAttempt)
			// The message the handler builds: ce_* headers and content-type, data as value.
			m := kafka.Message{Headers: []kafka.Header{{Key: "content-type", Value: []byte(appJSON)}}}
			for k, v := range hdr {
				m.Headers = append(m.Headers, kafka.Header{Key: "ce_" + k[3:], Value: []byte(v)})
			}
			size := func(valueLen int) int {
				n := sink.VarintLen(0) + sink.VarintLen(valueLen) + valueLen + sink.VarintLen(len(m.Headers))
				for _, hd := range m.Headers {
					n += sink.HeaderSize(hd)
				}
				return n
			}
			n := len(data)
			for size(n+1) <= dec.MaxMessageBytes() {
				n++
			}
			// Padded with white space inside the object: still the same valid data.
			padded := append([]byte("{"+string(bytes.Repeat([]byte(" "), n-len(data)))), data[1:]...)
			m.Value = padded
			if _, err := dec.Decode(&m, testNow); err != nil {
				t.Fatalf("the unkeyed message at the limit should decode: %v", err)
			}
			rec := post(h, request{token: tokenAcme, ctype: appJSON, headers: hdr, body: padded})
			var ans Answer
			json.Unmarshal(rec.Body.Bytes(), &ans)
			switch rec.Code {
			case 202:
				for i := range w.msgs {
					if _, err := dec.Decode(&w.msgs[i], testNow); err != nil {
						t.Fatalf("accepted (202), but the processor dead-letters the written message: %v", err)
					}
				}
			case 400:
				if len(ans.Events) != 1 || ans.Events[0].Reason != schemas.ReasonTooLarge || len(w.msgs) != 0 {
					t.Fatalf("400 but %s", rec.Body)
				}
			default:
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
		})
	}
}

// TestIngestBatchOfTinyMembers: a body of many tiny members is refused before each is judged —
// a 1 MiB batch of "1"s was answered with 52 MB of per-event results after ~1 s of CPU — while a
// body at the limit full of the smallest valid events is still taken whole.
func TestIngestBatchOfTinyMembers(t *testing.T) {
	w := &fakeWriter{}
	h := newHandler(t, w, Config{})
	for _, member := range []string{"1", "{}", "null"} {
		var b bytes.Buffer
		b.WriteString("[")
		for b.Len() < DefaultMaxBodyBytes-len(member)-2 {
			if b.Len() > 1 {
				b.WriteString(",")
			}
			b.WriteString(member)
		}
		b.WriteString("]")
		rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: b.Bytes()})
		if rec.Code != http.StatusRequestEntityTooLarge || rec.Body.Len() > 4*b.Len() || rec.Body.Len() > 1<<12 {
			t.Errorf("batch of %q: %d, %d bytes answered to %d", member, rec.Code, rec.Body.Len(), b.Len())
		}
	}
	// Small bodies of tiny members: refused whole, the answer within a small multiple of the
	// request (a result each made 16 KB of "{}" members an 810 KB answer).
	for _, member := range []string{"{}", "1", `{"id":"x"}`} {
		for _, n := range []int{2, 100, 8000} {
			body := []byte("[" + strings.TrimSuffix(strings.Repeat(member+",", n), ",") + "]")
			rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: body})
			if rec.Code != http.StatusBadRequest || rec.Body.Len() > 2*len(body)+maxUnfitResults*200 {
				t.Errorf("%d members %q in %d bytes: %d, answered with %d bytes", n, member, len(body), rec.Code, rec.Body.Len())
			}
		}
	}
	// The smallest valid events (one-byte identities), as many as the body holds.
	minimal := func(i int) []byte {
		return []byte(fmt.Sprintf(`{"specversion":"1.0","id":"%x","source":"s","type":"repeatrate.live.attempt.v1","data":{"scope":`+
			`{"workspace":"acme","model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o","correction_id":"f",`+
			`"occurred_at":"2026-11-29T11:00:00Z","assessed_at":"2026-11-29T11:00:00Z","outcome":"passed"}}`, i))
	}
	if n := len(minimal(0)); n < MinEventBytes {
		t.Fatalf("a valid event of %d bytes is below MinEventBytes", n)
	}
	var b bytes.Buffer
	b.WriteString("[")
	n := 0
	for ; b.Len()+len(minimal(n))+2 < DefaultMaxBodyBytes; n++ {
		if n > 0 {
			b.WriteString(",")
		}
		b.Write(minimal(n))
	}
	b.WriteString("]")
	rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: b.Bytes()})
	if rec.Code != http.StatusAccepted || len(w.msgs) != n {
		t.Fatalf("%d smallest valid events: %d, %d written: %.300s", n, rec.Code, len(w.msgs), rec.Body)
	}
}
