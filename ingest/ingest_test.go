package ingest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/readside"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

const (
	tokenAcme  = "token-acme-writer-0000" // writes acme
	tokenBeta  = "token-beta-writer-0000" // writes beta
	tokenRead  = "token-acme-reader-0000" // reads acme, writes nothing
	liveTopic  = "in.live"
	evalTopic  = "in.eval"
	testLimit  = 64 << 10
	ceBatch    = "application/cloudevents-batch+json"
	ceJSON     = "application/cloudevents+json"
	appJSON    = "application/json"
	futureSkew = 5 * time.Minute
)

var testNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func tokens(t *testing.T) *auth.Store {
	t.Helper()
	s, err := auth.NewStore([]auth.TokenConfig{
		{Name: "acme", SHA256: auth.Hash(tokenAcme), Workspaces: map[string]string{"acme": "write"}},
		{Name: "beta", SHA256: auth.Hash(tokenBeta), Workspaces: map[string]string{"beta": "read-write"}},
		{Name: "reader", SHA256: auth.Hash(tokenRead), Workspaces: map[string]string{"acme": "read"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeWriter records what it is given, or fails with err (fail decides per message when set).
type fakeWriter struct {
	mu     sync.Mutex
	msgs   []kafka.Message
	writes int
	err    error
	// fail says which messages of the write numbered call (from 1) are refused with failErr
	// (default NOT_ENOUGH_REPLICAS).
	fail    func(call, i int) bool
	failErr error
}

func (w *fakeWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	if w.fail != nil {
		werrs := make(kafka.WriteErrors, len(msgs))
		for i, m := range msgs {
			if w.fail(w.writes, i) {
				werrs[i] = cmp.Or(w.failErr, error(kafka.NotEnoughReplicas))
				continue
			}
			w.msgs = append(w.msgs, m)
		}
		return werrs
	}
	if w.err != nil {
		return w.err
	}
	w.msgs = append(w.msgs, msgs...)
	return nil
}

func newHandler(t *testing.T, w Writer, cfg Config) *Handler {
	t.Helper()
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.LiveTopic, cfg.EvalTopic, cfg.Tokens = liveTopic, evalTopic, tokens(t)
	h, err := New(cfg, dec, w, func() time.Time { return testNow }, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

var scopeOf = func(ws string) map[string]string {
	return map[string]string{"workspace": ws, "model": "m", "run": "r", "checkpoint": "c", "artifact": "prod"}
}

func liveData(ws, opp string) map[string]any {
	at := testNow.Add(-time.Minute).Format(time.RFC3339)
	return map[string]any{"scope": scopeOf(ws), "opportunity_id": opp, "correction_id": "fix-1",
		"occurred_at": at, "assessed_at": at, "outcome": "passed"}
}

func evalData(ws string, check bool) map[string]any {
	at := testNow.Add(-time.Minute).Format(time.RFC3339)
	d := map[string]any{"scope": scopeOf(ws), "suite": "s", "case_id": "c1", "version": "v1", "version_seq": 1,
		"run_index": 0, "runs": 1, "result": "fail", "occurred_at": at, "assessed_at": at}
	if check {
		d["correction_id"], d["opportunity_id"] = "fix-1", "case-c1"
	}
	return d
}

func event(id, typ string, data map[string]any) map[string]any {
	return map[string]any{"specversion": "1.0", "id": id, "source": "test/ingest", "type": typ,
		"datacontenttype": appJSON, "data": data}
}

func live(id, ws string) map[string]any {
	return event(id, schemas.TypeLiveAttempt, liveData(ws, "opp-"+id))
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// with returns a copy of ev with data member k set to v (or removed when v is nil).
func with(ev map[string]any, k string, v any) map[string]any {
	out := map[string]any{}
	for a, b := range ev {
		out[a] = b
	}
	data := map[string]any{}
	for a, b := range ev["data"].(map[string]any) {
		data[a] = b
	}
	if v == nil {
		delete(data, k)
	} else {
		data[k] = v
	}
	out["data"] = data
	return out
}

type request struct {
	token   string
	ctype   string
	headers map[string]string
	body    []byte
}

func post(h http.Handler, r request) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/events", bytes.NewReader(r.body))
	if r.ctype != "" {
		req.Header.Set("Content-Type", r.ctype)
	}
	for k, v := range r.headers {
		req.Header.Set(k, v)
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func binaryHeaders(id, typ string) map[string]string {
	return map[string]string{"ce-specversion": "1.0", "ce-id": id, "ce-source": "test/ingest", "ce-type": typ}
}

// openAPISchema returns a validator of /v1/events answers against sink's OpenAPI document.
func openAPISchema(t *testing.T) func(status int, body []byte) error {
	t.Helper()
	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(readside.OpenAPI()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("mem://openapi.json", raw); err != nil {
		t.Fatal(err)
	}
	return func(status int, body []byte) error {
		s, err := c.Compile("mem://openapi.json#/paths/~1v1~1events/post/responses/" + strconv.Itoa(status) + "/content/application~1json/schema")
		if err != nil {
			return fmt.Errorf("status %d is not documented: %w", status, err)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		if err != nil {
			return err
		}
		return s.Validate(v)
	}
}

// TestIngest: each case is one request; what it answers, each event's result, and what reaches
// the writer (nothing unless every event is accepted). Every answer validates against the OpenAPI
// document.
func TestIngest(t *testing.T) {
	liveKey := aggregator.Key{Scope: schemas.Scope{Workspace: "acme", Model: "m", Run: "r", Checkpoint: "c", Artifact: "prod"},
		CorrectionID: "fix-1", Source: aggregator.Live}.String()
	evalKey := aggregator.Key{Scope: schemas.Scope{Workspace: "acme", Model: "m", Run: "r", Checkpoint: "c", Artifact: "prod"},
		CorrectionID: "fix-1", Source: aggregator.Evaluation}.String()
	future := testNow.Add(futureSkew + time.Second).Format(time.RFC3339)
	validate := openAPISchema(t)
	type want struct {
		status   int
		results  []string         // each event's status
		reasons  []schemas.Reason // each event's reason ("" for none)
		topics   []string         // each written message's topic
		keys     []string         // and key
		errorish bool             // an {"error"} answer without events
	}
	for _, c := range []struct {
		name string
		req  request
		want want
	}{{
		// Structured mode: the body is the Kafka value, keyed by aggregate, on the live topic.
		name: "structured",
		req:  request{token: tokenAcme, ctype: ceJSON, body: mustJSON(live("s1", "acme"))},
		want: want{status: 202, results: []string{StatusAccepted}, topics: []string{liveTopic}, keys: []string{liveKey}},
	}, {
		// A charset parameter changes nothing.
		name: "structured with charset",
		req:  request{token: tokenAcme, ctype: ceJSON + "; charset=utf-8", body: mustJSON(live("s2", "acme"))},
		want: want{status: 202, results: []string{StatusAccepted}, topics: []string{liveTopic}, keys: []string{liveKey}},
	}, {
		// Binary mode: attributes in ce-* headers, the data as body.
		name: "binary",
		req: request{token: tokenAcme, ctype: appJSON, headers: binaryHeaders("b1", schemas.TypeLiveAttempt),
			body: mustJSON(liveData("acme", "opp-b1"))},
		want: want{status: 202, results: []string{StatusAccepted}, topics: []string{liveTopic}, keys: []string{liveKey}},
	}, {
		// A batch: a live attempt, a correction check and a suite-only result (keyed by its case,
		// as produce writes it), each to its topic.
		name: "batch",
		req: request{token: tokenAcme, ctype: ceBatch, body: mustJSON([]any{live("m1", "acme"),
			event("m2", schemas.TypeEvalResult, evalData("acme", true)), event("m3", schemas.TypeEvalResult, evalData("acme", false))})},
		want: want{status: 202, results: []string{StatusAccepted, StatusAccepted, StatusAccepted},
			topics: []string{liveTopic, evalTopic, evalTopic}, keys: []string{liveKey, evalKey, "acme|s|c1"}},
	}, {
		// One bad time refuses the batch: nothing is written, the valid ones say so.
		name: "batch with an invalid event",
		req: request{token: tokenAcme, ctype: ceBatch, body: mustJSON([]any{live("i1", "acme"),
			with(live("i2", "acme"), "occurred_at", "yesterday"), live("i3", "acme")})},
		want: want{status: 400, results: []string{StatusNotWritten, StatusInvalid, StatusNotWritten},
			reasons: []schemas.Reason{"", schemas.ReasonBadTime, ""}},
	}, {
		// The dead-letter reasons, one event each.
		name: "reasons",
		req: request{token: tokenAcme, ctype: ceBatch, body: []byte(`[` + strings.Join([]string{
			string(mustJSON(with(live("r1", "acme"), "occurred_at", future))),
			string(mustJSON(with(live("r2", "acme"), "outcome", "maybe"))),
			string(mustJSON(with(live("r3", "acme"), "correction_id", nil))),
			string(mustJSON(event("r4", "com.example.other", liveData("acme", "x")))),
			`{"specversion":"1.0","source":"x","type":"repeatrate.live.attempt.v1","data":{}}`,
			`{"specversion":"1.0","id":7,"source":"x","type":"repeatrate.live.attempt.v1","data":{}}`,
			string(mustJSON(with(live("r7", "acme"), "assessment_seq", -1))),
			`{"specversion":"1.0","id":"r8","source":"x","type":"repeatrate.live.attempt.v1","data":[1]}`,
			string(mustJSON(with(live("r9", "acme"), "opportunity_id", strings.Repeat("o", schemas.MaxIdentityBytes+1)))),
		}, ",") + `]`)},
		want: want{status: 400, results: []string{StatusInvalid, StatusInvalid, StatusInvalid, StatusInvalid, StatusInvalid,
			StatusInvalid, StatusInvalid, StatusInvalid, StatusInvalid},
			reasons: []schemas.Reason{schemas.ReasonFutureEvent, schemas.ReasonBadEnum, schemas.ReasonMissingField,
				schemas.ReasonUnknownType, schemas.ReasonBadEnvelope, schemas.ReasonUndecodable, schemas.ReasonBadValue,
				schemas.ReasonBadDataFormat, schemas.ReasonTooLarge}},
	}, {
		// A structured body that is not JSON.
		name: "undecodable structured",
		req:  request{token: tokenAcme, ctype: ceJSON, body: []byte(`{"specversion": "1.0", "id": nope}`)},
		want: want{status: 400, results: []string{StatusInvalid}, reasons: []schemas.Reason{schemas.ReasonUndecodable}},
	}, {
		// Binary mode of CloudEvents 0.3, which the SDK knows and the decoder refuses.
		name: "binary 0.3",
		req: request{token: tokenAcme, ctype: appJSON, headers: map[string]string{"ce-specversion": "0.3", "ce-id": "v", "ce-source": "x",
			"ce-type": schemas.TypeLiveAttempt}, body: mustJSON(liveData("acme", "v"))},
		want: want{status: 400, results: []string{StatusInvalid}, reasons: []schemas.Reason{schemas.ReasonBadEnvelope}},
	}, {
		// A version nobody knows: refused by the decoder too, not as an unknown media type.
		name: "binary 2.0",
		req: request{token: tokenAcme, ctype: appJSON, headers: map[string]string{"ce-specversion": "2.0", "ce-id": "v", "ce-source": "x",
			"ce-type": schemas.TypeLiveAttempt}, body: mustJSON(liveData("acme", "v"))},
		want: want{status: 400, results: []string{StatusInvalid}, reasons: []schemas.Reason{schemas.ReasonBadEnvelope}},
	}, {
		// Binary data that is not JSON.
		name: "binary text data",
		req:  request{token: tokenAcme, ctype: "text/plain", headers: binaryHeaders("t1", schemas.TypeLiveAttempt), body: []byte("hello")},
		want: want{status: 400, results: []string{StatusInvalid}, reasons: []schemas.Reason{schemas.ReasonBadDataFormat}},
	}, {
		// Another workspace's event: 403 for it.
		name: "other workspace",
		req:  request{token: tokenBeta, ctype: ceJSON, body: mustJSON(live("f1", "acme"))},
		want: want{status: 403, results: []string{StatusForbidden}},
	}, {
		// One forbidden event refuses the batch.
		name: "batch with another workspace",
		req:  request{token: tokenAcme, ctype: ceBatch, body: mustJSON([]any{live("f2", "acme"), live("f3", "beta")})},
		want: want{status: 403, results: []string{StatusNotWritten, StatusForbidden}},
	}, {
		// Invalid and forbidden together: 400, the caller's to fix first.
		name: "invalid and forbidden",
		req: request{token: tokenAcme, ctype: ceBatch, body: mustJSON([]any{live("f4", "beta"),
			with(live("f5", "acme"), "outcome", "maybe")})},
		want: want{status: 400, results: []string{StatusForbidden, StatusInvalid}, reasons: []schemas.Reason{"", schemas.ReasonBadEnum}},
	}, {
		// No token; a read token; a page's cookie is not a token here.
		name: "no token",
		req:  request{ctype: ceJSON, body: mustJSON(live("a1", "acme"))},
		want: want{status: 401, errorish: true},
	}, {
		name: "unknown token",
		req:  request{token: "nope", ctype: ceJSON, body: mustJSON(live("a2", "acme"))},
		want: want{status: 401, errorish: true},
	}, {
		name: "cookie only",
		req:  request{ctype: ceJSON, headers: map[string]string{"Cookie": "repeatrate_token=" + tokenAcme}, body: mustJSON(live("a3", "acme"))},
		want: want{status: 401, errorish: true},
	}, {
		name: "read token",
		req:  request{token: tokenRead, ctype: ceJSON, body: mustJSON(live("a4", "acme"))},
		want: want{status: 403, errorish: true},
	}, {
		// Not a CloudEvent request.
		name: "plain JSON",
		req:  request{token: tokenAcme, ctype: appJSON, body: mustJSON(live("u1", "acme"))},
		want: want{status: 415, errorish: true},
	}, {
		name: "batch not an array",
		req:  request{token: tokenAcme, ctype: ceBatch, body: mustJSON(live("u2", "acme"))},
		want: want{status: 400, errorish: true},
	}, {
		name: "empty batch",
		req:  request{token: tokenAcme, ctype: ceBatch, body: []byte(`[]`)},
		want: want{status: 400, errorish: true},
	}, {
		// Over the body limit, without a Content-Length to tell in advance.
		name: "body over the limit",
		req:  request{token: tokenAcme, ctype: ceBatch, body: bytes.Repeat([]byte(" "), testLimit+1)},
		want: want{status: 413, errorish: true},
	}} {
		t.Run(c.name, func(t *testing.T) {
			w := &fakeWriter{}
			h := newHandler(t, w, Config{MaxBodyBytes: testLimit})
			rec := post(h, c.req)
			if rec.Code != c.want.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.want.status, rec.Body)
			}
			if err := validate(rec.Code, rec.Body.Bytes()); err != nil {
				t.Errorf("answer does not match the OpenAPI document: %v\n%s", err, rec.Body)
			}
			if c.want.errorish {
				var e struct{ Error string }
				if json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error == "" || len(w.msgs) != 0 {
					t.Errorf("want an error answer and nothing written: %s, %d written", rec.Body, len(w.msgs))
				}
				return
			}
			var ans Answer
			if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil {
				t.Fatal(err)
			}
			if len(ans.Events) != len(c.want.results) {
				t.Fatalf("%d results, want %d: %s", len(ans.Events), len(c.want.results), rec.Body)
			}
			for i, r := range ans.Events {
				reason := schemas.Reason("")
				if c.want.reasons != nil {
					reason = c.want.reasons[i]
				}
				if r.Index != i || r.Status != c.want.results[i] || r.Reason != reason {
					t.Errorf("event %d: %+v, want %s %q", i, r, c.want.results[i], reason)
				}
				if r.Status == StatusInvalid && r.Detail == "" {
					t.Errorf("event %d: invalid without a detail", i)
				}
			}
			if len(w.msgs) != len(c.want.topics) {
				t.Fatalf("%d written, want %d", len(w.msgs), len(c.want.topics))
			}
			for i, m := range w.msgs {
				if m.Topic != c.want.topics[i] || string(m.Key) != c.want.keys[i] || ans.Events[i].Topic != m.Topic || ans.Events[i].Key != string(m.Key) {
					t.Errorf("message %d: topic %q key %q (answered %q %q), want %q %q", i, m.Topic, m.Key,
						ans.Events[i].Topic, ans.Events[i].Key, c.want.topics[i], c.want.keys[i])
				}
			}
		})
	}
}

// TestIngestWritesWhatTheProcessorDecodes: the messages written decode, with the processor's
// decoder, to the events posted — binary mode as a binary Kafka message with the data unchanged,
// structured mode with the body as value byte for byte.
func TestIngestWritesWhatTheProcessorDecodes(t *testing.T) {
	w := &fakeWriter{}
	h := newHandler(t, w, Config{})
	data := mustJSON(liveData("acme", "opp-x"))
	hdr := binaryHeaders("x1", schemas.TypeLiveAttempt)
	hdr["ce-subject"] = "conv-1"
	hdr["ce-traceparent"] = "00-abc"
	if rec := post(h, request{token: tokenAcme, ctype: appJSON, headers: hdr, body: data}); rec.Code != 202 {
		t.Fatalf("binary: %d %s", rec.Code, rec.Body)
	}
	body := []byte(" " + string(mustJSON(live("x2", "acme"))) + "\n")
	if rec := post(h, request{token: tokenAcme, ctype: ceJSON, body: body}); rec.Code != 202 {
		t.Fatalf("structured: %d %s", rec.Code, rec.Body)
	}
	if len(w.msgs) != 2 {
		t.Fatalf("%d written", len(w.msgs))
	}
	bin := w.msgs[0]
	headers := map[string]string{}
	for _, hd := range bin.Headers {
		headers[hd.Key] = string(hd.Value)
	}
	wantHeaders := map[string]string{"ce_specversion": "1.0", "ce_id": "x1", "ce_source": "test/ingest", "ce_type": schemas.TypeLiveAttempt,
		"ce_subject": "conv-1", "ce_traceparent": "00-abc", "content-type": appJSON}
	if fmt.Sprint(headers) != fmt.Sprint(wantHeaders) || !bytes.Equal(bin.Value, data) {
		t.Errorf("binary message: %v %s", headers, bin.Value)
	}
	if !bytes.Equal(w.msgs[1].Value, body) {
		t.Errorf("structured value %q, want the body %q", w.msgs[1].Value, body)
	}
	// Each record is stamped with the receipt time the event was judged against, which rebuild
	// judges it against again (the writer's own stamp is the wall clock, maybe stepped back since).
	for i, m := range w.msgs {
		if !m.Time.Equal(testNow) {
			t.Errorf("message %d stamped %v, want the receipt time %v", i, m.Time, testNow)
		}
	}
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	for i, id := range []string{"x1", "x2"} {
		ev, err := dec.Decode(&w.msgs[i], testNow)
		if err != nil || ev.ID != id || ev.Live == nil || ev.Live.Scope.Workspace != "acme" {
			t.Errorf("message %d decodes to %+v, %v", i, ev, err)
		}
	}
}

// TestIngestWriteFailure: a failed write answers 503 with Retry-After; each event says whether
// Kafka acknowledged it (kafka-go reports per message when a batch spans partitions).
func TestIngestWriteFailure(t *testing.T) {
	validate := openAPISchema(t)
	body := mustJSON([]any{live("w1", "acme"), live("w2", "acme"), live("w3", "acme")})
	for _, c := range []struct {
		name   string
		w      *fakeWriter
		single bool // the writer makes one attempt per write
		want   []string
	}{
		// The broker refused the whole write on every attempt: certainly not written.
		{"all refused", &fakeWriter{err: kafka.LeaderNotAvailable}, true, []string{StatusFailed, StatusFailed, StatusFailed}},
		// The same refusal from a writer that retries: an earlier attempt may have written.
		{"refused after retries", &fakeWriter{err: kafka.LeaderNotAvailable}, false, []string{StatusUnknown, StatusUnknown, StatusUnknown}},
		// No answer, or a timeout after the leader may have appended: unknown, not failed.
		{"all unknown", &fakeWriter{err: errors.New("broker down: i/o timeout")}, true, []string{StatusUnknown, StatusUnknown, StatusUnknown}},
		{"replication timed out", &fakeWriter{err: kafka.RequestTimedOut}, true, []string{StatusUnknown, StatusUnknown, StatusUnknown}},
		// One partition took its events, another refused them for good.
		{"partial", &fakeWriter{fail: func(_, i int) bool { return i == 1 }, failErr: kafka.MessageSizeTooLarge}, true,
			[]string{StatusAccepted, StatusFailed, StatusAccepted}},
		// One partition took its events, another refused them on every attempt.
		{"partial, refused on every attempt", &fakeWriter{fail: func(call, i int) bool { return call == 1 && i == 1 || call > 1 }}, true,
			[]string{StatusAccepted, StatusFailed, StatusAccepted}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHandler(t, c.w, Config{SingleAttempt: c.single, RetryRefusedFor: 300 * time.Millisecond})
			rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: body})
			if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("%d Retry-After %q: %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
			}
			if err := validate(rec.Code, rec.Body.Bytes()); err != nil {
				t.Error(err)
			}
			var ans Answer
			json.Unmarshal(rec.Body.Bytes(), &ans)
			for i, r := range ans.Events {
				if r.Status != c.want[i] {
					t.Errorf("event %d: %s, want %s", i, r.Status, c.want[i])
				}
			}
		})
	}
}

// A partition whose leader is moving, or still loading after its topic was created, refuses a
// write for a moment (NOT_LEADER_OR_FOLLOWER): the handler sends the refused events again, and
// only those, so the client gets 202 and Kafka holds each event once.
func TestTransientRefusalIsSentAgain(t *testing.T) {
	w := &fakeWriter{fail: func(call, i int) bool { return call == 1 && i == 1 || call == 2 }, failErr: kafka.NotLeaderForPartition}
	h := newHandler(t, w, Config{SingleAttempt: true, RetryRefusedFor: 5 * time.Second})
	rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: mustJSON([]any{live("t1", "acme"), live("t2", "acme"), live("t3", "acme")})})
	if rec.Code != http.StatusAccepted {
		t.Fatalf("%d %s, want 202 after the refusal passed", rec.Code, rec.Body)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.writes != 3 || len(w.msgs) != 3 {
		t.Fatalf("%d writes put %d messages in Kafka, want 3 writes (two refused) and 3 messages", w.writes, len(w.msgs))
	}
	for i, m := range w.msgs {
		var ev struct{ ID string }
		json.Unmarshal(m.Value, &ev)
		if want := []string{"t1", "t3", "t2"}[i]; ev.ID != want {
			t.Errorf("message %d is %s, want %s", i, ev.ID, want)
		}
	}
}

// TestIngestRecordLimit: a valid event too large for the input topic's records is refused as
// too_large rather than failing every retry at the writer.
func TestIngestRecordLimit(t *testing.T) {
	w := &fakeWriter{}
	h := newHandler(t, w, Config{RecordLimit: 600})
	small := live("l1", "acme")
	big := with(live("l2", "acme"), "unscored_reason", strings.Repeat("x", 600))
	rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: mustJSON([]any{small, big})})
	var ans Answer
	json.Unmarshal(rec.Body.Bytes(), &ans)
	if rec.Code != 400 || len(ans.Events) != 2 || ans.Events[1].Reason != schemas.ReasonTooLarge || ans.Events[0].Status != StatusNotWritten || len(w.msgs) != 0 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

// TestIngestBehindServer: through sink's server, the body limit is the ingest's (the read routes
// keep 4 KiB): at the limit the request is read, one byte over it is 413 before anything is read;
// and the per-token rate limit (a 413 is answered before it counts) answers 429 with Retry-After.
func TestIngestBehindServer(t *testing.T) {
	w := &fakeWriter{}
	h := newHandler(t, w, Config{MaxBodyBytes: testLimit})
	srv := readside.NewHTTP(readside.HTTPConfig{Tokens: tokens(t), Ingest: h, IngestMaxBodyBytes: h.MaxBodyBytes(), RateLimit: 1, RateBurst: 2},
		nil, prometheus.NewRegistry(), time.Now, zap.NewNop())
	ev := mustJSON([]any{live("p1", "acme")})
	atLimit := append(bytes.Repeat([]byte(" "), testLimit-len(ev)), ev...)
	if rec := post(srv.Handler(), request{token: tokenAcme, ctype: ceBatch, body: atLimit}); rec.Code != 202 {
		t.Fatalf("body at the limit: %d %s", rec.Code, rec.Body)
	}
	over := append([]byte(" "), atLimit...)
	if rec := post(srv.Handler(), request{token: tokenAcme, ctype: ceBatch, body: over}); rec.Code != 413 {
		t.Fatalf("one byte over: %d %s", rec.Code, rec.Body)
	}
	rec := post(srv.Handler(), request{token: tokenAcme, ctype: ceBatch, body: ev})
	if rec.Code != 202 {
		t.Fatalf("third: %d %s", rec.Code, rec.Body)
	}
	rec = post(srv.Handler(), request{token: tokenAcme, ctype: ceBatch, body: ev})
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("fourth within the second: %d Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	if len(w.msgs) != 2 {
		t.Errorf("%d written, want 2", len(w.msgs))
	}
}
