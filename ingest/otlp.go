package ingest

import (
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/proto"
)

// OTLP logs (docs/feeding.md#opentelemetry): an OpenTelemetry SDK or Collector posts log records
// to /v1/logs over OTLP/HTTP, protobuf or JSON, and each record becomes the structured CloudEvent
// its repeatrate.* attributes describe. From there a request is judged and written exactly as a
// batch of /v1/events: the same auth, quotas, limits and all-or-nothing answer.

// AttributePrefix starts the name of every log attribute the mapping reads.
const AttributePrefix = "repeatrate."

// scopeParts are the scope's parts, each an attribute repeatrate.<part>.
var scopeParts = []string{"workspace", "model", "run", "checkpoint", "artifact"}

// ServeOTLP answers one OTLP/HTTP export of logs (POST /v1/logs).
func (h *Handler) ServeOTLP(w http.ResponseWriter, req *http.Request) {
	code := h.serve(w, req, h.readOTLP)
	h.answers.WithLabelValues(strconv.Itoa(code)).Inc()
}

// readOTLP turns an ExportLogsServiceRequest into the structured CloudEvents its records map to,
// one pending event per log record, in order.
func (h *Handler) readOTLP(w http.ResponseWriter, req *http.Request) ([]pending, int, string) {
	req.Body = http.MaxBytesReader(w, req.Body, h.cfg.MaxBodyBytes)
	ctype, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	if ctype != "application/x-protobuf" && ctype != "application/json" {
		return nil, http.StatusUnsupportedMediaType, "send OTLP logs as application/x-protobuf or application/json (OTLP/HTTP)"
	}
	body, status, msg := h.otlpBody(req)
	if status != 0 {
		return nil, status, msg
	}
	var data logspb.LogsData // the wire format of ExportLogsServiceRequest
	if ctype == "application/x-protobuf" {
		if err := proto.Unmarshal(body, &data); err != nil {
			return nil, http.StatusBadRequest, "the body is not an OTLP ExportLogsServiceRequest in protobuf: " + err.Error()
		}
	} else if err := unmarshalOTLPJSON(body, &data); err != nil {
		return nil, http.StatusBadRequest, "the body is not an OTLP ExportLogsServiceRequest in JSON: " + err.Error()
	}
	n := 0
	for _, rl := range data.GetResourceLogs() {
		for _, sl := range rl.GetScopeLogs() {
			n += len(sl.GetLogRecords())
		}
	}
	switch {
	case n == 0:
		return nil, http.StatusBadRequest, "the export holds no log record"
	case n > h.cfg.MaxEvents:
		return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("the export holds %d log records, at most %d are taken", n, h.cfg.MaxEvents)
	}
	events := make([]pending, 0, n)
	for _, rl := range data.GetResourceLogs() {
		res := rl.GetResource().GetAttributes()
		for _, sl := range rl.GetScopeLogs() {
			for _, rec := range sl.GetLogRecords() {
				events = append(events, pending{msg: structured(cloudEventOf(res, rec))})
			}
		}
	}
	return events, 0, ""
}

// otlpBody reads the request's body, inflating it when its Content-Encoding is gzip (OTLP
// exporters and the Collector compress by default); inflated, it is held to the same limit.
func (h *Handler) otlpBody(req *http.Request) ([]byte, int, string) {
	tooLarge := func(err error) (int, string) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) || errors.Is(err, errInflatedTooLarge) {
			return http.StatusRequestEntityTooLarge, fmt.Sprintf("body is longer than %d bytes", h.cfg.MaxBodyBytes)
		}
		return http.StatusBadRequest, "the body could not be read: " + err.Error()
	}
	var r io.Reader = req.Body
	switch enc := strings.ToLower(strings.TrimSpace(req.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			s, m := tooLarge(err)
			return nil, s, m
		}
		defer zr.Close()
		r = &limitedReader{r: zr, left: h.cfg.MaxBodyBytes}
	default:
		return nil, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Encoding %q is not taken: send gzip or none", enc)
	}
	body, err := io.ReadAll(r)
	if err != nil {
		s, m := tooLarge(err)
		return nil, s, m
	}
	return body, 0, ""
}

var errInflatedTooLarge = errors.New("inflated body too large")

// limitedReader fails once more than left bytes are read.
type limitedReader struct {
	r    io.Reader
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		return n, errInflatedTooLarge
	}
	return n, err
}

// cloudEventOf is the structured CloudEvent a log record maps to: every attribute
// repeatrate.<field> of the record (or, when the record lacks it, of its resource) is the data's
// <field>, the scope's parts gathered under scope; a record with repeatrate.result is an eval
// result, any other a live attempt; occurred_at and assessed_at default to the record's time (its
// observed time when it has none); an eval result's prediction defaults to a string body. The
// CloudEvent's id is repeatrate.event_id, else a hash of the data, so that an export sent again
// carries the same ids; its source is otlp/ and the resource's service.name. What the mapping
// leaves missing or wrong, the decoder refuses with the reason a dead letter would carry.
func cloudEventOf(resource []*commonpb.KeyValue, rec *logspb.LogRecord) []byte {
	fields := map[string]any{}
	var eventID, service string
	take := func(kvs []*commonpb.KeyValue) {
		for _, kv := range kvs {
			name, ok := strings.CutPrefix(kv.GetKey(), AttributePrefix)
			switch {
			case kv.GetKey() == "service.name":
				service = kv.GetValue().GetStringValue()
			case !ok:
			case name == "event_id":
				eventID = kv.GetValue().GetStringValue()
			default:
				fields[name] = anyValue(kv.GetValue())
			}
		}
	}
	take(resource)
	take(rec.GetAttributes()) // the record's own attributes win
	scope := map[string]any{}
	for _, p := range scopeParts {
		if v, ok := fields[p]; ok {
			scope[p] = v
			delete(fields, p)
		}
	}
	fields["scope"] = scope
	at := rec.GetTimeUnixNano()
	if at == 0 {
		at = rec.GetObservedTimeUnixNano()
	}
	if at != 0 {
		stamp := time.Unix(0, int64(at)).UTC().Format(time.RFC3339Nano)
		if _, ok := fields["occurred_at"]; !ok {
			fields["occurred_at"] = stamp
		}
		if _, ok := fields["assessed_at"]; !ok {
			fields["assessed_at"] = stamp
		}
	}
	typ := "repeatrate.live.attempt.v1"
	if _, ok := fields["result"]; ok {
		typ = "repeatrate.eval.result.v1"
		if _, ok := fields["prediction"]; !ok {
			if b, ok := rec.GetBody().GetValue().(*commonpb.AnyValue_StringValue); ok {
				fields["prediction"] = b.StringValue
			}
		}
	}
	data, _ := json.Marshal(fields) // maps of JSON values only
	if eventID == "" {
		sum := sha256.Sum256(append([]byte(typ+"\x00"), data...))
		eventID = "otlp-" + hex.EncodeToString(sum[:16])
	}
	source := "otlp"
	if service != "" {
		source += "/" + service
	}
	ev, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": eventID, "source": source, "type": typ,
		"datacontenttype": "application/json", "data": json.RawMessage(data)})
	return ev
}

// anyValue is an attribute's value as JSON carries it: a string, integer, number or boolean as
// such; anything else (bytes, arrays, maps) as OTLP's JSON writes it, which the decoder refuses
// where a scalar is wanted.
func anyValue(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case nil:
		return nil
	}
	return fmt.Sprint(v)
}

// The OTLP/HTTP JSON encoding (docs: OTLP specification, JSON Protobuf Encoding): proto3 JSON with
// lowerCamelCase names, 64-bit integers as strings or numbers, and trace and span ids as hex
// (not protojson's base64, which is why it is not used). Only what the mapping reads is decoded;
// unknown fields are ignored, as the specification asks of receivers.
type jsonExport struct {
	ResourceLogs []struct {
		Resource struct {
			Attributes []jsonKeyValue `json:"attributes"`
		} `json:"resource"`
		ScopeLogs []struct {
			LogRecords []struct {
				TimeUnixNano         jsonUint64     `json:"timeUnixNano"`
				ObservedTimeUnixNano jsonUint64     `json:"observedTimeUnixNano"`
				Body                 *jsonAnyValue  `json:"body"`
				Attributes           []jsonKeyValue `json:"attributes"`
			} `json:"logRecords"`
		} `json:"scopeLogs"`
	} `json:"resourceLogs"`
}

type jsonKeyValue struct {
	Key   string       `json:"key"`
	Value jsonAnyValue `json:"value"`
}

type jsonAnyValue struct {
	StringValue *string         `json:"stringValue"`
	IntValue    *jsonInt64      `json:"intValue"`
	DoubleValue *float64        `json:"doubleValue"`
	BoolValue   *bool           `json:"boolValue"`
	Other       json.RawMessage `json:"arrayValue"` // and kvlistValue, bytesValue: kept as text
}

// jsonUint64 and jsonInt64 take a JSON string or number.
type jsonUint64 uint64
type jsonInt64 int64

func (u *jsonUint64) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 64)
	*u = jsonUint64(v)
	return err
}

func (i *jsonInt64) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseInt(strings.Trim(string(b), `"`), 10, 64)
	*i = jsonInt64(v)
	return err
}

func (v *jsonAnyValue) proto() *commonpb.AnyValue {
	switch {
	case v == nil:
		return nil
	case v.StringValue != nil:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: *v.StringValue}}
	case v.IntValue != nil:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(*v.IntValue)}}
	case v.DoubleValue != nil:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: *v.DoubleValue}}
	case v.BoolValue != nil:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: *v.BoolValue}}
	case v.Other != nil:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{}}}
	}
	return &commonpb.AnyValue{}
}

func kvs(in []jsonKeyValue) []*commonpb.KeyValue {
	out := make([]*commonpb.KeyValue, len(in))
	for i := range in {
		out[i] = &commonpb.KeyValue{Key: in[i].Key, Value: in[i].Value.proto()}
	}
	return out
}

// unmarshalOTLPJSON decodes an ExportLogsServiceRequest in OTLP's JSON encoding into data.
func unmarshalOTLPJSON(body []byte, data *logspb.LogsData) error {
	var ex jsonExport
	if err := json.Unmarshal(body, &ex); err != nil {
		return err
	}
	for _, rl := range ex.ResourceLogs {
		out := &logspb.ResourceLogs{Resource: &resourcepb.Resource{Attributes: kvs(rl.Resource.Attributes)}}
		for _, sl := range rl.ScopeLogs {
			s := &logspb.ScopeLogs{}
			for _, r := range sl.LogRecords {
				s.LogRecords = append(s.LogRecords, &logspb.LogRecord{TimeUnixNano: uint64(r.TimeUnixNano),
					ObservedTimeUnixNano: uint64(r.ObservedTimeUnixNano), Body: r.Body.proto(), Attributes: kvs(r.Attributes)})
			}
			out.ScopeLogs = append(out.ScopeLogs, s)
		}
		data.ResourceLogs = append(data.ResourceLogs, out)
	}
	return nil
}
