package ingest

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/repeatrate/repeatrate/schemas"
)

// OTLP logs (docs/feeding.md#opentelemetry): an OpenTelemetry SDK or Collector posts log records
// to /v1/logs over OTLP/HTTP, protobuf or JSON, and each record becomes the structured CloudEvent
// its repeatrate.* attributes describe. From there a request is judged and written exactly as a
// batch of /v1/events: the same auth, quotas, limits and all-or-nothing answer.

// AttributePrefix starts the name of every log attribute the mapping reads.
const AttributePrefix = "repeatrate."

// scopeParts are the scope's parts, each an attribute repeatrate.<part>.
var scopeParts = []string{"workspace", "model", "run", "checkpoint", "artifact"}

// ServeOTLP answers one OTLP/HTTP export of logs (POST /v1/logs) as OTLP clients expect: 200
// with an empty ExportLogsServiceResponse when every record was written, else the status code
// /v1/events would answer with a google.rpc.Status whose message says why and names the first
// refused records — protobuf or JSON, as the request was.
func (h *Handler) ServeOTLP(w http.ResponseWriter, req *http.Request) {
	ctype, _, _ := mime.ParseMediaType(req.Header.Get("Content-Type"))
	rec := &capture{header: w.Header()}
	code := h.serve(rec, req, h.readOTLP)
	h.answers.WithLabelValues(strconv.Itoa(code)).Inc()
	writeOTLP(w, ctype == "application/json", code, rec.body.Bytes())
}

// capture holds an answer of serve, to be rewritten as OTLP's.
type capture struct {
	header http.Header
	body   bytes.Buffer
}

func (c *capture) Header() http.Header         { return c.header }
func (c *capture) Write(b []byte) (int, error) { return c.body.Write(b) }
func (c *capture) WriteHeader(int)             {}

// maxListedRecords is how many refused records an OTLP answer's message names.
const maxListedRecords = 10

// writeOTLP writes the OTLP answer of serve's answer (an Answer or {"error": …}) with code.
func writeOTLP(w http.ResponseWriter, asJSON bool, code int, answer []byte) {
	w.Header().Del("Content-Length")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if asJSON {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/x-protobuf")
	}
	if code >= 200 && code < 300 {
		// Every record written: an empty ExportLogsServiceResponse (no partial success).
		w.WriteHeader(http.StatusOK)
		if asJSON {
			io.WriteString(w, "{}")
		}
		return
	}
	var ans Answer
	json.Unmarshal(answer, &ans)
	msg := ans.Error
	var listed []string
	refused := 0
	for _, r := range ans.Events {
		if r.Status == StatusAccepted || r.Status == StatusNotWritten {
			continue
		}
		refused++
		if len(listed) < maxListedRecords {
			why := strings.TrimPrefix(string(r.Reason)+": "+r.Detail, ": ")
			listed = append(listed, fmt.Sprintf("record %d %s (%s)", r.Index, r.Status, strings.TrimSuffix(why, ": ")))
		}
	}
	if len(listed) > 0 {
		msg += ": " + strings.Join(listed, "; ")
		if refused > len(listed) {
			msg += fmt.Sprintf("; and %d more", refused-len(listed))
		}
	}
	if msg == "" {
		var e struct {
			Error string `json:"error"`
		}
		json.Unmarshal(answer, &e)
		msg = e.Error
	}
	st := rpcCode(code)
	w.WriteHeader(code)
	if asJSON {
		json.NewEncoder(w).Encode(struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}{st, msg})
		return
	}
	// google.rpc.Status: code = 1 (int32), message = 2 (string).
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(st))
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendString(b, strings.ToValidUTF8(msg, "\uFFFD"))
	w.Write(b)
}

// rpcCode is the google.rpc.Code of an HTTP status, as OTLP/HTTP pairs them.
func rpcCode(status int) int {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return 3 // INVALID_ARGUMENT
	case http.StatusUnauthorized:
		return 16 // UNAUTHENTICATED
	case http.StatusForbidden:
		return 7 // PERMISSION_DENIED
	case http.StatusNotFound:
		return 5 // NOT_FOUND
	case http.StatusTooManyRequests:
		return 8 // RESOURCE_EXHAUSTED
	case http.StatusServiceUnavailable:
		return 14 // UNAVAILABLE
	}
	return 2 // UNKNOWN
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
		// Valid and empty, as OTLP receivers take it (a Collector may send one after filtering):
		// every record of it, none, is written.
		return nil, http.StatusOK, "the export holds no log record"
	case n > h.cfg.MaxEvents:
		return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf("the export holds %d log records, at most %d are taken", n, h.cfg.MaxEvents)
	}
	// The events a record makes carry its resource's attributes too, so an export's events may be
	// far larger than its body: they are held to twice the body limit, what the ingest budgets a
	// request's writes at, and built no further past it.
	budget := 2 * h.cfg.MaxBodyBytes
	events := make([]pending, 0, n)
	for _, rl := range data.GetResourceLogs() {
		res := rl.GetResource().GetAttributes()
		for _, sl := range rl.GetScopeLogs() {
			for _, rec := range sl.GetLogRecords() {
				ev, refused := cloudEventOf(res, rec)
				if budget -= int64(len(ev)); budget < 0 {
					return nil, http.StatusRequestEntityTooLarge, fmt.Sprintf(
						"the export's records make more than %d bytes of events (each carries its resource's repeatrate.* attributes): send fewer records a request", 2*h.cfg.MaxBodyBytes)
				}
				events = append(events, pending{msg: structured(ev), refused: refused})
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
// CloudEvent's id is the record's repeatrate.event_id, else a hash of the data, so that an export
// sent again carries the same ids; its source is otlp/ and the resource's service.name. What the
// mapping leaves missing or wrong, the decoder refuses with the reason a dead letter would carry;
// what cannot become an event at all (a value that is no string, integer, finite number or
// boolean; a name the mapping reserves) is refused here, as bad_value.
func cloudEventOf(resource []*commonpb.KeyValue, rec *logspb.LogRecord) ([]byte, *schemas.InvalidError) {
	fields := map[string]any{}
	var eventID, service string
	var refused *schemas.InvalidError
	refuse := func(reason schemas.Reason, format string, args ...any) {
		if refused == nil {
			refused = schemas.Invalid(reason, format, args...)
		}
	}
	take := func(kvs []*commonpb.KeyValue, onRecord bool) {
		for _, kv := range kvs {
			name, ok := strings.CutPrefix(kv.GetKey(), AttributePrefix)
			switch {
			case kv.GetKey() == "service.name":
				service = kv.GetValue().GetStringValue()
			case !ok:
			case name == "event_id":
				v, isString := kv.GetValue().GetValue().(*commonpb.AnyValue_StringValue)
				switch {
				case !onRecord:
					// On a resource it would give every record the same id: not an id.
				case !isString:
					refuse(schemas.ReasonBadValue, "attribute repeatrate.event_id must be a string")
				default:
					eventID = v.StringValue
				}
			case name == "" || name == "scope" || name == "data":
				refuse(schemas.ReasonBadValue, "attribute %s names no field of an event", kv.GetKey())
			default:
				v, err := scalar(kv.GetValue())
				if err != nil {
					refuse(schemas.ReasonBadValue, "attribute %s is %v", kv.GetKey(), err)
					continue
				}
				fields[name] = v
			}
		}
	}
	take(resource, false)
	take(rec.GetAttributes(), true) // the record's own attributes win
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
	if at > math.MaxInt64 {
		refuse(schemas.ReasonBadTime, "the record's time %d ns is past the year 2262", at)
	} else if at != 0 {
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
		if _, both := fields["outcome"]; both {
			refuse(schemas.ReasonBadValue, "the record has both repeatrate.outcome (a live attempt) and repeatrate.result (an eval result)")
		}
		typ = "repeatrate.eval.result.v1"
		if _, ok := fields["prediction"]; !ok {
			if b, ok := rec.GetBody().GetValue().(*commonpb.AnyValue_StringValue); ok && utf8.ValidString(b.StringValue) {
				fields["prediction"] = b.StringValue
			}
		}
	}
	data, err := json.Marshal(fields) // scalars only
	if err != nil {
		refuse(schemas.ReasonBadValue, "%v", err)
		data = []byte("{}")
	}
	if eventID == "" {
		sum := sha256.Sum256(append([]byte(typ+"\x00"), data...))
		eventID = "otlp-" + hex.EncodeToString(sum[:16])
	}
	source := "otlp"
	if service != "" {
		source += "/" + url.PathEscape(service)
	}
	ev, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": eventID, "source": source, "type": typ,
		"datacontenttype": "application/json", "data": json.RawMessage(data)})
	return ev, refused
}

// scalar is an attribute's value as JSON carries it — a string, integer, finite number or
// boolean — or what else it is.
func scalar(v *commonpb.AnyValue) (any, error) {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		if !utf8.ValidString(x.StringValue) {
			return nil, errors.New("not valid UTF-8 text")
		}
		return x.StringValue, nil
	case *commonpb.AnyValue_IntValue:
		return x.IntValue, nil
	case *commonpb.AnyValue_DoubleValue:
		if math.IsNaN(x.DoubleValue) || math.IsInf(x.DoubleValue, 0) {
			return nil, errors.New("not a finite number")
		}
		return x.DoubleValue, nil
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue, nil
	case *commonpb.AnyValue_ArrayValue:
		return nil, errors.New("an array; a string, integer, number or boolean is wanted")
	case *commonpb.AnyValue_KvlistValue:
		return nil, errors.New("a key-value list; a string, integer, number or boolean is wanted")
	case *commonpb.AnyValue_BytesValue:
		return nil, errors.New("bytes; a string, integer, number or boolean is wanted")
	}
	return nil, errors.New("empty; a string, integer, number or boolean is wanted")
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
	DoubleValue *jsonDouble     `json:"doubleValue"`
	BoolValue   *bool           `json:"boolValue"`
	ArrayValue  json.RawMessage `json:"arrayValue"`
	KvlistValue json.RawMessage `json:"kvlistValue"`
	BytesValue  json.RawMessage `json:"bytesValue"`
}

// jsonUint64, jsonInt64 and jsonDouble take a JSON number or a string of one (proto3 JSON writes
// 64-bit integers, and NaN and infinities, as strings); null is zero.
type (
	jsonUint64 uint64
	jsonInt64  int64
	jsonDouble float64
)

func (u *jsonUint64) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	v, err := strconv.ParseUint(strings.Trim(string(b), `"`), 10, 64)
	*u = jsonUint64(v)
	return err
}

func (i *jsonInt64) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseInt(strings.Trim(string(b), `"`), 10, 64)
	*i = jsonInt64(v)
	return err
}

func (d *jsonDouble) UnmarshalJSON(b []byte) error {
	v, err := strconv.ParseFloat(strings.Trim(string(b), `"`), 64)
	*d = jsonDouble(v)
	return err
}

// proto is the AnyValue v encodes; more than one value in it is an error, as in proto3 JSON.
func (v *jsonAnyValue) proto() (*commonpb.AnyValue, error) {
	if v == nil {
		return nil, nil
	}
	var out []*commonpb.AnyValue
	if v.StringValue != nil {
		out = append(out, &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: *v.StringValue}})
	}
	if v.IntValue != nil {
		out = append(out, &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: int64(*v.IntValue)}})
	}
	if v.DoubleValue != nil {
		out = append(out, &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: float64(*v.DoubleValue)}})
	}
	if v.BoolValue != nil {
		out = append(out, &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: *v.BoolValue}})
	}
	// Kept as what they are, not their contents: a field of an event is never one.
	if v.ArrayValue != nil {
		out = append(out, &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{}}})
	}
	if v.KvlistValue != nil {
		out = append(out, &commonpb.AnyValue{Value: &commonpb.AnyValue_KvlistValue{KvlistValue: &commonpb.KeyValueList{}}})
	}
	if v.BytesValue != nil {
		out = append(out, &commonpb.AnyValue{Value: &commonpb.AnyValue_BytesValue{}})
	}
	switch len(out) {
	case 0:
		return &commonpb.AnyValue{}, nil
	case 1:
		return out[0], nil
	}
	return nil, errors.New("an AnyValue holds more than one value")
}

func kvs(in []jsonKeyValue) ([]*commonpb.KeyValue, error) {
	out := make([]*commonpb.KeyValue, len(in))
	for i := range in {
		v, err := in[i].Value.proto()
		if err != nil {
			return nil, fmt.Errorf("attribute %q: %w", in[i].Key, err)
		}
		out[i] = &commonpb.KeyValue{Key: in[i].Key, Value: v}
	}
	return out, nil
}

// unmarshalOTLPJSON decodes an ExportLogsServiceRequest in OTLP's JSON encoding into data. Text
// that is not UTF-8, raw or as a lone surrogate escape (\ud800), is refused: encoding/json would
// read either as U+FFFD, and two different identities as one.
func unmarshalOTLPJSON(body []byte, data *logspb.LogsData) error {
	if !utf8.Valid(body) {
		return errors.New("the body is not valid UTF-8")
	}
	if err := surrogatesPaired(body); err != nil {
		return err
	}
	var ex jsonExport
	if err := json.Unmarshal(body, &ex); err != nil {
		return err
	}
	for _, rl := range ex.ResourceLogs {
		attrs, err := kvs(rl.Resource.Attributes)
		if err != nil {
			return err
		}
		out := &logspb.ResourceLogs{Resource: &resourcepb.Resource{Attributes: attrs}}
		for _, sl := range rl.ScopeLogs {
			s := &logspb.ScopeLogs{}
			for _, r := range sl.LogRecords {
				attrs, err := kvs(r.Attributes)
				if err != nil {
					return err
				}
				body, err := r.Body.proto()
				if err != nil {
					return fmt.Errorf("body: %w", err)
				}
				s.LogRecords = append(s.LogRecords, &logspb.LogRecord{TimeUnixNano: uint64(r.TimeUnixNano),
					ObservedTimeUnixNano: uint64(r.ObservedTimeUnixNano), Body: body, Attributes: attrs})
			}
			out.ScopeLogs = append(out.ScopeLogs, s)
		}
		data.ResourceLogs = append(data.ResourceLogs, out)
	}
	return nil
}

// surrogatesPaired reports an error when a JSON text's \u escapes hold a UTF-16 surrogate that is
// not half of a pair.
func surrogatesPaired(b []byte) error {
	pendingHigh := false
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 >= len(b) {
			if pendingHigh {
				return errors.New("a lone UTF-16 surrogate escape: not text")
			}
			continue
		}
		if b[i+1] != 'u' || i+5 >= len(b) {
			if pendingHigh {
				return errors.New("a lone UTF-16 surrogate escape: not text")
			}
			i++ // an escaped character, \\ included
			continue
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		if err != nil {
			return errors.New("a malformed \\u escape")
		}
		switch {
		case v >= 0xD800 && v < 0xDC00:
			if pendingHigh {
				return errors.New("a lone UTF-16 surrogate escape: not text")
			}
			pendingHigh = true
		case v >= 0xDC00 && v < 0xE000:
			if !pendingHigh {
				return errors.New("a lone UTF-16 surrogate escape: not text")
			}
			pendingHigh = false
		default:
			if pendingHigh {
				return errors.New("a lone UTF-16 surrogate escape: not text")
			}
		}
		i += 5
	}
	if pendingHigh {
		return errors.New("a lone UTF-16 surrogate escape: not text")
	}
	return nil
}
