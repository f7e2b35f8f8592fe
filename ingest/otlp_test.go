package ingest

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

func str(k, v string) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}}
}

func integer(k string, v int64) *commonpb.KeyValue {
	return &commonpb.KeyValue{Key: k, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}}
}

// otlpExport is an export of records under one resource carrying workspace ws's scope.
func otlpExport(ws string, recs ...*logspb.LogRecord) *logspb.LogsData {
	return &logspb.LogsData{ResourceLogs: []*logspb.ResourceLogs{{
		Resource: &resourcepb.Resource{Attributes: []*commonpb.KeyValue{str("service.name", "bot"), str("repeatrate.workspace", ws),
			str("repeatrate.model", "m"), str("repeatrate.run", "r"), str("repeatrate.checkpoint", "c"), str("repeatrate.artifact", "prod")}},
		ScopeLogs: []*logspb.ScopeLogs{{LogRecords: recs}},
	}}}
}

func attemptRecord(opp, outcome string, at time.Time) *logspb.LogRecord {
	return &logspb.LogRecord{TimeUnixNano: uint64(at.UnixNano()), Attributes: []*commonpb.KeyValue{
		str("repeatrate.correction_id", "fix"), str("repeatrate.opportunity_id", opp), str("repeatrate.outcome", outcome)}}
}

func postOTLP(h *Handler, token, ctype string, body []byte, headers map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/logs", bytes.NewReader(body))
	req.Header.Set("Content-Type", ctype)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeOTLP(rec, req)
	return rec
}

// TestOTLPLogsBecomeEvents: an OTLP/HTTP export in protobuf or JSON (gzip or not) becomes the
// events its records' repeatrate.* attributes describe — the scope from the resource, times from
// the record, an eval result's prediction from its body — written exactly as /v1/events writes
// them, with ids that do not change when the export is sent again; a record that maps to an invalid
// event refuses the whole export with the reason a dead letter would carry, and nothing is written.
func TestOTLPLogsBecomeEvents(t *testing.T) {
	at := testNow.Add(-time.Minute)
	eval := &logspb.LogRecord{TimeUnixNano: uint64(at.UnixNano()),
		Body: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: "thirty days"}},
		Attributes: []*commonpb.KeyValue{str("repeatrate.suite", "qa"), str("repeatrate.case_id", "c1"), str("repeatrate.version", "v1"),
			integer("repeatrate.version_seq", 1), integer("repeatrate.run_index", 0), integer("repeatrate.runs", 1), str("repeatrate.result", "fail")}}
	export := otlpExport("acme", attemptRecord("o1", "confirmed_repeat", at), attemptRecord("o2", "passed", at), eval)
	pb, err := proto.Marshal(export)
	if err != nil {
		t.Fatal(err)
	}
	// The same export in OTLP's JSON encoding: integers as strings, a hex trace id, unknown fields.
	js := fmt.Sprintf(`{"resourceLogs":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"bot"}},
	  {"key":"repeatrate.workspace","value":{"stringValue":"acme"}},{"key":"repeatrate.model","value":{"stringValue":"m"}},
	  {"key":"repeatrate.run","value":{"stringValue":"r"}},{"key":"repeatrate.checkpoint","value":{"stringValue":"c"}},
	  {"key":"repeatrate.artifact","value":{"stringValue":"prod"}}]},"scopeLogs":[{"scope":{"name":"x"},"logRecords":[
	  {"timeUnixNano":"%[1]d","traceId":"5b8efff798038103d269b633813fc60c","severityText":"INFO","attributes":[
	    {"key":"repeatrate.correction_id","value":{"stringValue":"fix"}},{"key":"repeatrate.opportunity_id","value":{"stringValue":"o1"}},
	    {"key":"repeatrate.outcome","value":{"stringValue":"confirmed_repeat"}}]},
	  {"timeUnixNano":%[1]d,"attributes":[{"key":"repeatrate.correction_id","value":{"stringValue":"fix"}},
	    {"key":"repeatrate.opportunity_id","value":{"stringValue":"o2"}},{"key":"repeatrate.outcome","value":{"stringValue":"passed"}}]},
	  {"timeUnixNano":"%[1]d","body":{"stringValue":"thirty days"},"attributes":[{"key":"repeatrate.suite","value":{"stringValue":"qa"}},
	    {"key":"repeatrate.case_id","value":{"stringValue":"c1"}},{"key":"repeatrate.version","value":{"stringValue":"v1"}},
	    {"key":"repeatrate.version_seq","value":{"intValue":"1"}},{"key":"repeatrate.run_index","value":{"intValue":0}},
	    {"key":"repeatrate.runs","value":{"intValue":"1"}},{"key":"repeatrate.result","value":{"stringValue":"fail"}}]}]}]}]}`, at.UnixNano())
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write(pb)
	zw.Close()
	dec, _ := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	var ids []string
	for _, c := range []struct {
		name, ctype string
		body        []byte
		headers     map[string]string
	}{
		{"protobuf", "application/x-protobuf", pb, nil},
		{"json", "application/json", []byte(js), nil},
		{"protobuf gzip", "application/x-protobuf", zipped.Bytes(), map[string]string{"Content-Encoding": "gzip"}},
	} {
		w := &fakeWriter{}
		h := newHandler(t, w, Config{})
		rec := postOTLP(h, tokenAcme, c.ctype, c.body, c.headers)
		// OTLP's success: 200 and an empty ExportLogsServiceResponse, in the request's encoding.
		wantBody := map[string]string{"application/x-protobuf": "", "application/json": "{}"}[c.ctype]
		if rec.Code != http.StatusOK || rec.Body.String() != wantBody || rec.Header().Get("Content-Type") != c.ctype || len(w.msgs) != 3 {
			t.Fatalf("%s: %d %q (%s), %d written", c.name, rec.Code, rec.Body, rec.Header().Get("Content-Type"), len(w.msgs))
		}
		var got []string
		for i := range w.msgs {
			ev, err := dec.Decode(&w.msgs[i], testNow)
			if err != nil {
				t.Fatalf("%s: message %d: %v", c.name, i, err)
			}
			got = append(got, ev.ID)
			switch i {
			case 0, 1:
				if ev.Live == nil || ev.Live.Scope != (schemas.Scope{Workspace: "acme", Model: "m", Run: "r", Checkpoint: "c", Artifact: "prod"}) ||
					ev.Live.CorrectionID != "fix" || !ev.Live.OccurredAt.Equal(at) || ev.Source != "otlp/bot" || w.msgs[i].Topic != liveTopic {
					t.Errorf("%s: record %d became %+v (%s)", c.name, i, ev.Live, w.msgs[i].Value)
				}
			case 2:
				if ev.Eval == nil || ev.Eval.Suite != "qa" || ev.Eval.Prediction == nil || *ev.Eval.Prediction != "thirty days" || w.msgs[i].Topic != evalTopic {
					t.Errorf("%s: the eval record became %+v (%s)", c.name, ev.Eval, w.msgs[i].Value)
				}
			}
		}
		if ids != nil && fmt.Sprint(ids) != fmt.Sprint(got) {
			t.Errorf("%s: event ids %v, the protobuf export's were %v: an export sent again must carry the same ids", c.name, got, ids)
		}
		ids = got
	}

	// A record without its outcome: the export is refused whole, with the decoder's reason.
	bad := otlpExport("acme", attemptRecord("o1", "passed", at), &logspb.LogRecord{TimeUnixNano: uint64(at.UnixNano()),
		Attributes: []*commonpb.KeyValue{str("repeatrate.correction_id", "fix"), str("repeatrate.opportunity_id", "o3")}})
	pb, _ = proto.Marshal(bad)
	w := &fakeWriter{}
	h := newHandler(t, w, Config{})
	rec := postOTLP(h, tokenAcme, "application/x-protobuf", pb, nil)
	code, msg := rpcStatus(t, rec.Body.Bytes())
	if rec.Code != http.StatusBadRequest || len(w.msgs) != 0 || code != 3 || !strings.Contains(msg, "record 1 invalid (missing_field") {
		t.Errorf("an export with an invalid record: %d, %d written: status %d %q", rec.Code, len(w.msgs), code, msg)
	}
	// Another workspace's token: 403, nothing written; no token: 401 — as google.rpc.Status.
	pb, _ = proto.Marshal(export)
	if rec := postOTLP(h, tokenBeta, "application/x-protobuf", pb, nil); rec.Code != http.StatusForbidden || len(w.msgs) != 0 {
		t.Errorf("another workspace's token: %d %s", rec.Code, rec.Body)
	} else if code, msg := rpcStatus(t, rec.Body.Bytes()); code != 7 || !strings.Contains(msg, "record 0 forbidden") {
		t.Errorf("another workspace's token: status %d %q", code, msg)
	}
	if rec := postOTLP(h, "", "application/json", pb, nil); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), `"code":16`) {
		t.Errorf("no token: %d %s", rec.Code, rec.Body)
	}
}

// rpcStatus reads a protobuf google.rpc.Status: its code and message.
func rpcStatus(t *testing.T, b []byte) (code int, msg string) {
	t.Helper()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("not a google.rpc.Status: %q", b)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			code, b = int(v), b[n:]
		case num == 2 && typ == protowire.BytesType:
			v, n := protowire.ConsumeString(b)
			msg, b = v, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			b = b[n:]
		}
	}
	return code, msg
}

// A record is refused, with its index and a reason a person can act on, when its attributes
// cannot make an event — a value that is no string, integer, finite number or boolean (arrays,
// key-value lists, bytes, NaN), a reserved name, both an outcome and a result, a time past what a
// timestamp holds — and JSON text that is not UTF-8 or holds a lone surrogate escape is refused
// whole: read as U+FFFD, two identities would become one. A record refused never writes the export.
func TestOTLPRecordsThatCannotBeEvents(t *testing.T) {
	at := testNow.Add(-time.Minute)
	good := attemptRecord("o0", "passed", at)
	with := func(kv ...*commonpb.KeyValue) *logspb.LogRecord {
		r := attemptRecord("o1", "passed", at)
		r.Attributes = append(r.Attributes, kv...)
		return r
	}
	array := &commonpb.KeyValue{Key: "repeatrate.model", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{
		ArrayValue: &commonpb.ArrayValue{Values: []*commonpb.AnyValue{{Value: &commonpb.AnyValue_StringValue{StringValue: "x"}}}}}}}
	kvlist := &commonpb.KeyValue{Key: "repeatrate.run", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{}}}}
	nan := &commonpb.KeyValue{Key: "repeatrate.latency_ratio", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: math.NaN()}}}
	far := attemptRecord("o1", "passed", at)
	far.TimeUnixNano = math.MaxUint64
	for _, c := range []struct {
		name string
		rec  *logspb.LogRecord
		says string
	}{
		{"array", with(array), "record 1 invalid (bad_value: attribute repeatrate.model is an array"},
		{"kvlist", with(kvlist), "record 1 invalid (bad_value: attribute repeatrate.run is a key-value list"},
		{"NaN", with(nan), "record 1 invalid (bad_value: attribute repeatrate.latency_ratio is not a finite number"},
		{"reserved name", with(str("repeatrate.scope", "x")), "record 1 invalid (bad_value: attribute repeatrate.scope names no field"},
		{"outcome and result", with(str("repeatrate.result", "pass")), "both repeatrate.outcome"},
		{"time past 2262", far, "record 1 invalid (bad_time"},
	} {
		w := &fakeWriter{}
		h := newHandler(t, w, Config{})
		pb, _ := proto.Marshal(otlpExport("acme", good, c.rec))
		rec := postOTLP(h, tokenAcme, "application/x-protobuf", pb, nil)
		code, msg := rpcStatus(t, rec.Body.Bytes())
		if rec.Code != http.StatusBadRequest || code != 3 || !strings.Contains(msg, c.says) || len(w.msgs) != 0 {
			t.Errorf("%s: %d, status %d %q, %d written; want 400 saying %q", c.name, rec.Code, code, msg, len(w.msgs), c.says)
		}
	}
	w := &fakeWriter{}
	h := newHandler(t, w, Config{})
	for _, body := range []string{
		`{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"attributes":[{"key":"repeatrate.opportunity_id","value":{"stringValue":"x\ud800"}}]}]}]}]}`,
		`{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"attributes":[{"key":"repeatrate.opportunity_id","value":{"stringValue":"x\udc00\ud800"}}]}]}]}]}`,
		"{\"resourceLogs\":[{\"scopeLogs\":[{\"logRecords\":[{\"attributes\":[{\"key\":\"repeatrate.opportunity_id\",\"value\":{\"stringValue\":\"x\xff\"}}]}]}]}]}",
		`{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"attributes":[{"key":"repeatrate.model","value":{"stringValue":"a","intValue":"1"}}]}]}]}]}`,
	} {
		rec := postOTLP(h, tokenAcme, "application/json", []byte(body), nil)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `"code":3`) || len(w.msgs) != 0 {
			t.Errorf("%q: %d %s", body, rec.Code, rec.Body)
		}
	}
	// A paired surrogate escape and an escaped backslash before a u are text; a number may be a string.
	ok := fmt.Sprintf(`{"resourceLogs":[{"resource":{"attributes":[{"key":"repeatrate.workspace","value":{"stringValue":"acme"}},
	  {"key":"repeatrate.model","value":{"stringValue":"m"}},{"key":"repeatrate.run","value":{"stringValue":"r"}},
	  {"key":"repeatrate.checkpoint","value":{"stringValue":"c"}},{"key":"repeatrate.artifact","value":{"stringValue":"prod"}}]},
	  "scopeLogs":[{"logRecords":[{"timeUnixNano":"%d","attributes":[{"key":"repeatrate.correction_id","value":{"stringValue":"fix"}},
	  {"key":"repeatrate.opportunity_id","value":{"stringValue":"smile \ud83d\ude00 \\ud800"}},{"key":"repeatrate.outcome","value":{"stringValue":"passed"}},
	  {"key":"repeatrate.note","value":{"doubleValue":"0.5"}}]}]}]}]}`, at.UnixNano())
	if rec := postOTLP(h, tokenAcme, "application/json", []byte(ok), nil); rec.Code != http.StatusOK || len(w.msgs) != 1 {
		t.Fatalf("a paired surrogate and an escaped backslash: %d %s", rec.Code, rec.Body)
	}
	if !strings.Contains(string(w.msgs[0].Value), `smile 😀 \\ud800`) {
		t.Errorf("the opportunity id became %s", w.msgs[0].Value)
	}
	// A service name is escaped into the source, so any name can send.
	w = &fakeWriter{}
	h = newHandler(t, w, Config{})
	ex := otlpExport("acme", good)
	ex.ResourceLogs[0].Resource.Attributes[0] = str("service.name", "a%zz b")
	pb, _ := proto.Marshal(ex)
	if rec := postOTLP(h, tokenAcme, "application/x-protobuf", pb, nil); rec.Code != http.StatusOK || !strings.Contains(string(w.msgs[0].Value), `"source":"otlp/a%25zz%20b"`) {
		t.Errorf("service name a%%zz b: %d %s", rec.Code, rec.Body)
	}
}

// TestOTLPLogsLimits: what an export may be — its content type, encoding, size (also once
// inflated) and number of records — with a clear refusal past each, and nothing written.
func TestOTLPLogsLimits(t *testing.T) {
	at := testNow.Add(-time.Minute)
	w := &fakeWriter{}
	h := newHandler(t, w, Config{MaxBodyBytes: 64 << 10, MaxEvents: 10})
	var recs []*logspb.LogRecord
	for i := range 11 {
		recs = append(recs, attemptRecord(fmt.Sprint("o", i), "passed", at))
	}
	eleven, _ := proto.Marshal(otlpExport("acme", recs...))
	ten, _ := proto.Marshal(otlpExport("acme", recs[:10]...))
	// A resource attribute of 16 KiB that each of 10 records carries: 160 KiB of events from a
	// 17 KiB body, past twice the 64 KiB limit.
	big := otlpExport("acme", recs[:10]...)
	big.ResourceLogs[0].Resource.Attributes = append(big.ResourceLogs[0].Resource.Attributes, str("repeatrate.note", strings.Repeat("x", 16<<10)))
	fanout, _ := proto.Marshal(big)
	var bomb bytes.Buffer
	zw := gzip.NewWriter(&bomb)
	zw.Write(bytes.Repeat([]byte{0}, 1<<20)) // 1 MiB of zeros inflates past the 64 KiB limit
	zw.Close()
	for _, c := range []struct {
		name, ctype string
		body        []byte
		headers     map[string]string
		code        int
		says        string
	}{
		{"ten records", "application/x-protobuf", ten, nil, http.StatusOK, ""},
		{"resource fan-out", "application/x-protobuf", fanout, nil, http.StatusRequestEntityTooLarge, "bytes of events"},
		{"eleven records", "application/x-protobuf", eleven, nil, http.StatusRequestEntityTooLarge, "at most 10"},
		{"empty export", "application/x-protobuf", nil, nil, http.StatusOK, ""},
		{"not protobuf", "application/x-protobuf", []byte("{not protobuf"), nil, http.StatusBadRequest, "protobuf"},
		{"not JSON", "application/json", []byte("[1,2"), nil, http.StatusBadRequest, "JSON"},
		{"other content type", "text/plain", ten, nil, http.StatusUnsupportedMediaType, "application/x-protobuf"},
		{"gzip bomb", "application/x-protobuf", bomb.Bytes(), map[string]string{"Content-Encoding": "gzip"}, http.StatusRequestEntityTooLarge, "longer than"},
		{"other encoding", "application/x-protobuf", ten, map[string]string{"Content-Encoding": "br"}, http.StatusUnsupportedMediaType, "gzip"},
		{"body over the limit", "application/x-protobuf", bytes.Repeat([]byte{0}, 65<<10), nil, http.StatusRequestEntityTooLarge, "longer than"},
	} {
		before := len(w.msgs)
		rec := postOTLP(h, tokenAcme, c.ctype, c.body, c.headers)
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.says) {
			t.Errorf("%s: %d %s, want %d saying %q", c.name, rec.Code, rec.Body, c.code, c.says)
		}
		if c.code != http.StatusOK && len(w.msgs) != before {
			t.Errorf("%s: refused, but %d written", c.name, len(w.msgs)-before)
		}
	}
}

// TestOTLPLogsFromTheOpenTelemetrySDK: the OpenTelemetry Python SDK's own OTLP/HTTP exporter
// (opentelemetry-exporter-otlp-proto-http, protobuf) feeds the endpoint with no client code of
// ours: a service's log records with the scope on its resource become live attempts and an eval
// result, every one written, with the SDK reporting a successful export.
func TestOTLPLogsFromTheOpenTelemetrySDK(t *testing.T) {
	py := testenv.PythonVenv(t)
	w := &fakeWriter{}
	dec, err := cloudevent.NewDecoder(cloudevent.DefaultDecoderConfig)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Config{LiveTopic: liveTopic, EvalTopic: evalTopic, Tokens: tokens(t)}, dec, w, time.Now, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(h.ServeOTLP))
	defer srv.Close()
	const n = 40
	out, err := exec.Command(py, filepath.Join("..", "test", "otlp", "export_logs.py"), srv.URL+"/v1/logs", tokenAcme, "acme", fmt.Sprint(n)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "flushed True") {
		t.Fatalf("the SDK's export: %v\n%s", err, out)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.msgs) != n+1 {
		t.Fatalf("%d events written, the SDK sent %d records:\n%s", len(w.msgs), n+1, out)
	}
	repeats, evals := 0, 0
	for i := range w.msgs {
		ev, err := dec.Decode(&w.msgs[i], time.Now())
		if err != nil {
			t.Fatalf("record %d: %v (%s)", i, err, w.msgs[i].Value)
		}
		switch {
		case ev.Live != nil:
			if ev.Live.Scope.Workspace != "acme" || ev.Live.Scope.Artifact != "chat" || ev.Live.CorrectionID != "fix-otel" || ev.Source != "otlp/support-bot" {
				t.Errorf("attempt %d: %+v from %s", i, ev.Live, ev.Source)
			}
			if ev.Live.Outcome == schemas.OutcomeConfirmedRepeat {
				repeats++
			}
		case ev.Eval != nil:
			evals++
			if ev.Eval.Prediction == nil || *ev.Eval.Prediction != "The refund window is thirty days." || ev.Eval.RunIndex != 0 {
				t.Errorf("eval result: %+v", ev.Eval)
			}
		}
	}
	if repeats != n/4 || evals != 1 {
		t.Errorf("%d confirmed repeats and %d eval results, want %d and 1", repeats, evals, n/4)
	}
}
