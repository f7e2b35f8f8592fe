package cloudevent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	fastjson "github.com/goccy/go-json"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

// Event is one decoded, validated input event. Exactly one of Live and Eval is set.
type Event struct {
	ID     string
	Source string
	Type   string
	Live   *schemas.LiveAttempt
	Eval   *schemas.EvalResult
}

// DecoderConfig bounds what the decoder accepts.
type DecoderConfig struct {
	// MaxMessageBytes caps key, value and headers together, with their length prefixes
	// (MessageSize; default 1 MiB).
	MaxMessageBytes int
	// Limits holds the per-field limits of package schemas.
	Limits schemas.Limits
}

// DefaultDecoderConfig holds the documented defaults (docs/semantics.md#limits).
var DefaultDecoderConfig = DecoderConfig{MaxMessageBytes: 1 << 20, Limits: schemas.DefaultLimits}

// Validate checks the configuration.
func (c DecoderConfig) Validate() error {
	if c.MaxMessageBytes <= 0 || c.Limits.MaxPredictionBytes <= 0 || c.Limits.MaxFutureSkew < 0 {
		return fmt.Errorf("decoder limits must be positive: %+v", c)
	}
	return nil
}

// Decoder turns Kafka messages into validated events. It is safe for concurrent use.
type Decoder struct {
	cfg    DecoderConfig
	parser *schemas.Parser
	// sources holds source attributes accepted by the fast path: producers repeat them.
	sources sourceTable
}

// NewDecoder returns a decoder with the given limits.
func NewDecoder(cfg DecoderConfig) (*Decoder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Decoder{cfg: cfg, parser: schemas.NewParser(cfg.Limits)}, nil
}

const (
	headerContentType = "content-type"
	headerPrefix      = "ce_"
	structuredType    = "application/cloudevents"
)

// Decode unwraps and validates the CloudEvent in m, received at now. A message with a
// content-type of application/cloudevents* is read in structured mode, one with ce_specversion in
// binary mode; any other message is tried as a structured event, the form `produce` and most tools
// write. Every error wraps schemas.ErrInvalid and carries a schemas.Reason.
func (d *Decoder) Decode(m *kafka.Message, now time.Time) (Event, error) {
	return textAttributes(d.decode(m, now))
}

func (d *Decoder) decode(m *kafka.Message, now time.Time) (Event, error) {
	if size := MessageSize(m); size > d.cfg.MaxMessageBytes {
		return Event{}, schemas.Invalid(schemas.ReasonTooLarge, "message is %d bytes, limit %d", size, d.cfg.MaxMessageBytes)
	}
	var a attributes
	if ct := headerValue(m, headerContentType); !structuredMode(ct) && len(headerValue(m, headerPrefix+"specversion")) > 0 {
		e, err := binaryEvent(m, string(ct))
		if err != nil {
			return Event{}, err
		}
		a = attributesOf(e)
	} else {
		if ev, ok := d.fastEvent(m.Value, now); ok {
			return ev, nil
		}
		var err error
		if a, err = structuredEvent(m.Value); err != nil {
			return Event{}, err
		}
	}
	return d.data(a, now)
}

// DecodeStructured decodes one structured-mode CloudEvent (a JSON object), as replay and produce
// read them from NDJSON.
func (d *Decoder) DecodeStructured(value []byte, now time.Time) (Event, error) {
	return textAttributes(d.decodeStructured(value, now))
}

func (d *Decoder) decodeStructured(value []byte, now time.Time) (Event, error) {
	if len(value) > d.cfg.MaxMessageBytes {
		return Event{}, schemas.Invalid(schemas.ReasonTooLarge, "event is %d bytes, limit %d", len(value), d.cfg.MaxMessageBytes)
	}
	if ev, ok := d.fastEvent(value, now); ok {
		return ev, nil
	}
	a, err := structuredEvent(value)
	if err != nil {
		return Event{}, err
	}
	return d.data(a, now)
}

// textAttributes refuses an event whose id is not UTF-8 text (bad_cloudevent): CloudEvents
// attributes are strings, and a raw byte sequence would be written on, into dead letters, answers
// and logs, where every JSON encoder then changes it. The source is a URI reference, already
// escaped by its parser; the data's strings are checked by the schemas.
func textAttributes(ev Event, err error) (Event, error) {
	if err == nil && !utf8.ValidString(ev.ID) {
		return Event{}, schemas.Invalid(schemas.ReasonBadEnvelope, "id %q is not valid UTF-8 text", clipHeader(ev.ID))
	}
	return ev, err
}

// attributes are what repeatrate reads of a valid CloudEvent. The fast structured path fills them
// straight from JSON; every other path converts the SDK's event (attributesOf).
type attributes struct {
	id, source, typ, subject, contentType string
	time                                  time.Time // zero when absent
	data                                  []byte
}

func attributesOf(e event.Event) attributes {
	return attributes{id: e.ID(), source: e.Source(), typ: e.Type(), subject: e.Subject(),
		contentType: e.DataContentType(), time: e.Time(), data: e.Data()}
}

// data validates the data of a CloudEvent by its type.
func (d *Decoder) data(e attributes, now time.Time) (Event, error) {
	if ct := e.contentType; ct != "" && !isJSON(ct) {
		return Event{}, schemas.Invalid(schemas.ReasonBadDataFormat, "datacontenttype %q is not JSON", clipHeader(ct))
	}
	out := Event{ID: e.id, Source: e.source, Type: e.typ}
	switch e.typ {
	case schemas.TypeLiveAttempt:
		a, err := d.parser.LiveAttempt(e.data, now)
		if err != nil {
			return Event{}, err
		}
		out.Live = &a
	case schemas.TypeEvalResult:
		r, err := d.parser.EvalResult(e.data, now)
		if err != nil {
			return Event{}, err
		}
		out.Eval = &r
	default:
		return Event{}, schemas.Invalid(schemas.ReasonUnknownType, "type %q is not consumed by repeatrate", clipHeader(e.typ))
	}
	return out, nil
}

// envelope is the common shape of a structured CloudEvent: the attributes repeatrate's producers
// send, and data.
type envelope struct {
	SpecVersion     string              `json:"specversion"`
	ID              string              `json:"id"`
	Source          string              `json:"source"`
	Type            string              `json:"type"`
	Subject         *string             `json:"subject"`
	Time            *string             `json:"time"`
	DataContentType *string             `json:"datacontenttype"`
	Data            fastjson.RawMessage `json:"data"`
}

// envelopeKeys are the members the fast path reads; exactKeys checks a value has no others.
var envelopeKeys = [...]string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "data"}

// exactKeys reports whether every top-level member name of the JSON object b is one of
// envelopeKeys, spelled exactly (CloudEvents attribute names are case-sensitive, JSON decoders are
// not) and at most once. It does not validate the JSON: the decoder after it does.
func exactKeys(b []byte) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	seen := 0
	for i++; ; {
		i = skipSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return false
		}
		j := i + 1
		for j < len(b) && b[j] != '"' {
			if b[j] == '\\' {
				return false
			}
			j++
		}
		if j >= len(b) {
			return false
		}
		k := slices.Index(envelopeKeys[:], string(b[i+1:j]))
		if k < 0 || seen&(1<<k) != 0 {
			return false
		}
		seen |= 1 << k
		if i = skipSpace(b, j+1); i >= len(b) || b[i] != ':' {
			return false
		}
		var ok bool
		if i, ok = skipValue(b, skipSpace(b, i+1)); !ok {
			return false
		}
		i = skipSpace(b, i)
		switch {
		case i < len(b) && b[i] == ',':
			i++
		case i < len(b) && b[i] == '}':
			return skipSpace(b, i+1) == len(b)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index after the JSON value starting at i.
func skipValue(b []byte, i int) (int, bool) {
	depth := 0
	for ; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if i >= len(b) {
				return i, false
			}
			if depth == 0 {
				return i + 1, true
			}
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i, true
			}
			if depth--; depth == 0 {
				return i + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, true
			}
		}
	}
	return i, depth == 0
}

// fastStructured decodes the common case of a structured CloudEvent without the SDK: the
// attributes above and JSON object data. ok is false whenever the event has anything else
// (extensions, data_base64, dataschema, odd values), and the caller lets the SDK decide. What it
// accepts, the SDK accepts with the same attributes and data (FuzzFastPathAgreesWithSDK).
func fastStructured(value []byte) (a attributes, ok bool) {
	var env envelope
	// Invalid UTF-8 is left to the SDK: decoders differ in how they repair it.
	if !utf8.Valid(value) || !exactKeys(value) || fastjson.Unmarshal(value, &env) != nil {
		return attributes{}, false
	}
	optional := func(p *string) bool { return p == nil || (*p != "" && utf8.ValidString(*p)) }
	if env.SpecVersion != event.CloudEventsVersionV1 || env.ID == "" || env.Source == "" || env.Type == "" ||
		!utf8.ValidString(env.ID+env.Source+env.Type) || !optional(env.Subject) || !optional(env.Time) ||
		!optional(env.DataContentType) || len(env.Data) == 0 || env.Data[0] != '{' {
		return attributes{}, false
	}
	// The SDK keeps source as a parsed URI reference: accept only what survives that unchanged.
	if u, err := url.Parse(env.Source); err != nil || u.String() != env.Source {
		return attributes{}, false
	}
	a = attributes{id: env.ID, source: env.Source, typ: env.Type, data: env.Data}
	if env.Subject != nil {
		a.subject = *env.Subject
	}
	if env.Time != nil {
		t, err := time.Parse(time.RFC3339Nano, *env.Time)
		if err != nil {
			return attributes{}, false
		}
		a.time = t
	}
	if env.DataContentType != nil {
		// Media types are case-insensitive and may carry parameters: any JSON one will do for
		// object data (sdkStructured agrees). Other types: the SDK decides what data is.
		if !isJSON(*env.DataContentType) {
			return attributes{}, false
		}
		a.contentType = *env.DataContentType
	}
	return a, true
}

// fastEvent decodes the usual structured event in one pass, without the SDK or reflection: the
// attributes fastStructured reads, each a string without escapes (or null where fastStructured
// allows it), then object data of a type repeatrate consumes, which the schemas parser reads.
// ok is false for anything else and for every invalid event: the caller decodes it the full
// way, which words the error. What it accepts decodes to the same event either way
// (TestFastEventAgrees, FuzzFastEventAgrees); what is valid: docs/semantics.md#validation.
func (d *Decoder) fastEvent(value []byte, now time.Time) (Event, bool) {
	value = bytes.TrimSpace(value)
	if !utf8.Valid(value) {
		return Event{}, false
	}
	var (
		ev   Event
		data []byte
		seen int
	)
	i := skipSpace(value, 0)
	if i >= len(value) || value[i] != '{' {
		return Event{}, false
	}
	for i++; ; {
		name, j, ok := plainString(value, skipSpace(value, i))
		if !ok {
			return Event{}, false
		}
		k := envelopeKey(name)
		if k < 0 || seen&(1<<k) != 0 {
			return Event{}, false
		}
		seen |= 1 << k
		if i = skipSpace(value, j); i >= len(value) || value[i] != ':' {
			return Event{}, false
		}
		i = skipSpace(value, i+1)
		if k == keyData {
			if i >= len(value) || value[i] != '{' {
				return Event{}, false
			}
			// The usual event names its type first: its data is read in the same pass.
			var end int
			switch ev.Type {
			case schemas.TypeLiveAttempt:
				var a schemas.LiveAttempt
				if a, end, ok = d.parser.LiveAttemptAt(value, i, now); ok {
					ev.Live = &a
				}
			case schemas.TypeEvalResult:
				var r schemas.EvalResult
				if r, end, ok = d.parser.EvalResultAt(value, i, now); ok {
					ev.Eval = &r
				}
			default:
				ok = false
			}
			if !ok {
				if end, ok = skipValue(value, i); !ok {
					return Event{}, false
				}
				data = value[i:end]
			}
			i = end
		} else if k >= keySubject && i+4 <= len(value) && string(value[i:i+4]) == "null" {
			// Optional attributes may be null: absent.
			i += 4
		} else {
			s, j, ok := plainString(value, i)
			if !ok || len(s) == 0 {
				return Event{}, false
			}
			i = j
			switch k {
			case keySpecVersion:
				ok = string(s) == event.CloudEventsVersionV1
			case keyID:
				ev.ID = string(s)
			case keySource:
				ev.Source, ok = d.source(s)
			case keyType:
				switch string(s) {
				case schemas.TypeLiveAttempt:
					ev.Type = schemas.TypeLiveAttempt
				case schemas.TypeEvalResult:
					ev.Type = schemas.TypeEvalResult
				default:
					ok = false
				}
			case keyTime:
				if _, ok = schemas.ParseRFC3339(s); !ok {
					_, err := time.Parse(time.RFC3339Nano, string(s))
					ok = err == nil
				}
			case keyDataContentType:
				ok = string(s) == event.ApplicationJSON || isJSON(string(s))
			}
			if !ok {
				return Event{}, false
			}
		}
		i = skipSpace(value, i)
		if i < len(value) && value[i] == ',' {
			i++
			continue
		}
		if i >= len(value) || value[i] != '}' || skipSpace(value, i+1) != len(value) {
			return Event{}, false
		}
		break
	}
	const needed = 1<<keySpecVersion | 1<<keyID | 1<<keySource | 1<<keyType | 1<<keyData
	if seen&needed != needed {
		return Event{}, false
	}
	if ev.Live != nil || ev.Eval != nil {
		return ev, true
	}
	var err error
	if ev.Type == schemas.TypeLiveAttempt {
		var a schemas.LiveAttempt
		if a, err = d.parser.LiveAttempt(data, now); err == nil {
			ev.Live = &a
		}
	} else {
		var r schemas.EvalResult
		if r, err = d.parser.EvalResult(data, now); err == nil {
			ev.Eval = &r
		}
	}
	return ev, err == nil
}

// The indexes of envelopeKeys.
const (
	keySpecVersion = iota
	keyID
	keySource
	keyType
	keySubject
	keyTime
	keyDataContentType
	keyData
)

// envelopeKey returns the index of name in envelopeKeys, or -1.
func envelopeKey(name []byte) int {
	switch string(name) {
	case "specversion":
		return keySpecVersion
	case "id":
		return keyID
	case "source":
		return keySource
	case "type":
		return keyType
	case "subject":
		return keySubject
	case "time":
		return keyTime
	case "datacontenttype":
		return keyDataContentType
	case "data":
		return keyData
	}
	return -1
}

// plainString reads the JSON string at b[i:] that has no escape and no control character (the
// caller checked b is valid UTF-8): its contents and the index after it.
func plainString(b []byte, i int) (s []byte, end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// source returns the source attribute s as a string when it is a URI reference the SDK keeps
// unchanged (fastStructured's rule), the decoder's copy when it accepted s before.
func (d *Decoder) source(s []byte) (string, bool) {
	if src, ok := d.sources.get(s); ok {
		return src, true
	}
	src := string(s)
	if u, err := url.Parse(src); err != nil || u.String() != src {
		return "", false
	}
	d.sources.put(src)
	return src, true
}

// sourceSlots is the size of a decoder's table of accepted sources: a few producers' worth. A
// miss costs only the url.Parse a hit saves.
const sourceSlots = 64

// sourceTable remembers accepted sources, one per slot of a hash of their bytes; each slot is an
// immutable string replaced whole, so readers need no lock.
type sourceTable struct {
	slots [sourceSlots]atomic.Pointer[string]
}

func (t *sourceTable) slot(b []byte) *atomic.Pointer[string] {
	h := uint32(2166136261) // FNV-1a
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	return &t.slots[h%sourceSlots]
}

func (t *sourceTable) get(b []byte) (string, bool) {
	if p := t.slot(b).Load(); p != nil && *p == string(b) {
		return *p, true
	}
	return "", false
}

func (t *sourceTable) put(s string) {
	if len(s) <= maxSourceCached {
		t.slot([]byte(s)).Store(&s)
	}
}

// maxSourceCached is the longest source remembered; longer ones are checked every time.
const maxSourceCached = 1024

func structuredEvent(value []byte) (attributes, error) {
	lead := len(value) - len(bytes.TrimLeftFunc(value, unicode.IsSpace))
	value = bytes.TrimSpace(value)
	if len(value) == 0 || value[0] != '{' {
		return attributes{}, schemas.Invalid(schemas.ReasonUndecodable, "value is not a JSON CloudEvent")
	}
	if a, ok := fastStructured(value); ok {
		return a, nil
	}
	e, err := sdkStructured(value)
	if err != nil {
		if ie, ok := err.(*schemas.InvalidError); ok && ie.Reason == schemas.ReasonUndecodable {
			// Byte offsets in the detail count in the value as received.
			return attributes{}, schemas.Invalid(schemas.ReasonUndecodable, "%s", undecodableDetail(value, lead, ie.Detail))
		}
		return attributes{}, err
	}
	return attributesOf(e), nil
}

// sdkStructured reads a structured CloudEvent with the SDK: every attribute and encoding the
// specification allows, with its precise complaint when something is wrong.
func sdkStructured(value []byte) (event.Event, error) {
	if name, dup := schemas.DuplicateMember(value); dup {
		return event.Event{}, schemas.Invalid(schemas.ReasonBadEnvelope, "attribute %q appears twice: JSON readers disagree on which counts", clipHeader(name))
	}
	value, ct, renamed := sdkJSONMediaType(value)
	var e event.Event
	if err := e.UnmarshalJSON(value); err != nil {
		return event.Event{}, schemas.Invalid(schemas.ReasonUndecodable, "%s", err.Error())
	}
	if renamed {
		e.SetDataContentType(ct)
	}
	if err := e.Validate(); err != nil {
		return event.Event{}, schemas.Invalid(schemas.ReasonBadEnvelope, "%s", clipHeader(validationDetail(err)))
	}
	return e, nil
}

// validationDetail is the SDK's complaint about an envelope, its lines (one per attribute) in the
// order of the attribute names: the SDK's own text follows its map's order, different each time, so
// the same bad event would get a different dead-letter detail on every delivery.
func validationDetail(err error) string {
	var ve event.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(ve)) {
		b.WriteString(k)
		b.WriteString(": ")
		b.WriteString(ve[k].Error())
		b.WriteByte('\n')
	}
	return b.String()
}

// stringAttributes are the CloudEvents attributes whose JSON value must be a string.
var stringAttributes = [...]string{"specversion", "id", "source", "type", "subject", "time",
	"datacontenttype", "dataschema", "data_base64"}

// undecodableDetail words why the SDK could not read value (a structured CloudEvent, trimmed,
// that had lead bytes of white space before it), where sdkErr is what the SDK said. The SDK's
// JSON reader (json-iterator) reports its own function names and a window of the input with an
// offset into that window ("ReadString: expects \" or n, … error found in #10 byte of …"); that
// is no use to a person. This runs only for bad input, so it can afford to re-read the value:
// invalid JSON is described by encoding/json's message with its byte offset; valid JSON with an
// attribute of the wrong type names the attribute and where its value starts; anything else keeps
// the SDK's complaint without the reader's internals. Byte offsets count from 1 at the start of
// the message value.
func undecodableDetail(value []byte, lead int, sdkErr string) string {
	var v any
	var se *json.SyntaxError
	if err := json.Unmarshal(value, &v); errors.As(err, &se) {
		at := lead + int(se.Offset)
		if int(se.Offset) >= len(value) && strings.HasPrefix(se.Error(), "unexpected end") {
			return fmt.Sprintf("invalid JSON: the value ends at byte %d inside an unfinished object, array or string", lead+len(value))
		}
		// Up to 24 bytes ending with the offending one, for a reader to find it.
		from := max(0, int(se.Offset)-24)
		return clipHeader(fmt.Sprintf("invalid JSON at byte %d: %s, near `%s`", at, se.Error(), printable(value[from:se.Offset])))
	}
	if spans, ok := topMembers(value); ok {
		for _, name := range stringAttributes {
			sp, ok := spans[name]
			if !ok {
				continue
			}
			if kind := jsonKind(value[sp[0]]); kind != "string" && kind != "null" {
				return fmt.Sprintf("attribute %s is %s at byte %d, not a string", name, kind, lead+sp[0]+1)
			}
		}
	}
	msg := sdkErr
	if i := strings.Index(msg, ", error found in #"); i >= 0 {
		// json-iterator's "ReadString: expects …, error found in #10 byte of …|window|…": keep
		// the complaint, drop its function name and window.
		msg = msg[:i]
		if name, rest, ok := strings.Cut(msg, ": "); ok && !strings.ContainsAny(name, " \"") {
			msg = rest
		}
	}
	return clipHeader("structured CloudEvent: " + strings.TrimSpace(msg))
}

// printable returns b with every byte outside printable ASCII written as \xNN, so that a quote of
// the input in a detail is one readable line.
func printable(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			fmt.Fprintf(&sb, `\x%02x`, c)
			continue
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

// jsonKind names the kind of the JSON value starting with byte c.
func jsonKind(c byte) string {
	switch c {
	case '"':
		return "string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// sdkJSONMediaType returns value as the SDK should read it. The SDK takes data as a JSON value
// only for a few media types spelled exactly (application/json, text/json, …) and otherwise
// expects a string; but media types are case-insensitive and any */*+json type is JSON. When value
// has object data and a datacontenttype that is JSON by those rules but not by the SDK's, it is
// returned with datacontenttype "application/json", with the original ct and renamed true so the
// caller can restore it. Any other value is returned as it is.
func sdkJSONMediaType(value []byte) (out []byte, ct string, renamed bool) {
	spans, ok := topMembers(value)
	if !ok {
		return value, "", false
	}
	cs, hasCT := spans["datacontenttype"]
	ds, hasData := spans["data"]
	if !hasCT || !hasData || value[cs[0]] != '"' || value[ds[0]] != '{' {
		return value, "", false
	}
	if err := fastjson.Unmarshal(value[cs[0]:cs[1]], &ct); err != nil || !isJSON(ct) || sdkTakesJSON(ct) {
		return value, "", false
	}
	out = make([]byte, 0, len(value))
	out = append(out, value[:cs[0]]...)
	out = append(out, `"`+event.ApplicationJSON+`"`...)
	out = append(out, value[cs[1]:]...)
	return out, ct, true
}

// sdkTakesJSON reports whether the SDK reads data of media type ct as a JSON value (the rule of
// its unexported isJSON and GetDataMediaType).
func sdkTakesJSON(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = strings.TrimSpace(ct[:i])
	}
	switch ct {
	case event.ApplicationJSON, event.TextJSON, event.ApplicationCloudEventsJSON, event.ApplicationCloudEventsBatchJSON:
		return true
	}
	return false
}

// topMembers returns the value span [start, end) of each top-level member of the JSON object b.
// ok is false when b is not a plain object: a member name with an escape or given twice, or
// anything unbalanced. It does not validate values.
func topMembers(b []byte) (spans map[string][2]int, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	spans = map[string][2]int{}
	if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' {
		return spans, skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, false
		}
		j := i + 1
		for j < len(b) && b[j] != '"' {
			if b[j] == '\\' {
				return nil, false
			}
			j++
		}
		if j >= len(b) {
			return nil, false
		}
		name := string(b[i+1 : j])
		if _, dup := spans[name]; dup {
			return nil, false
		}
		if i = skipSpace(b, j+1); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		start := skipSpace(b, i+1)
		end, ok := skipValue(b, start)
		if !ok || end <= start {
			return nil, false
		}
		spans[name] = [2]int{start, end}
		switch i = skipSpace(b, end); {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return spans, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

func binaryEvent(m *kafka.Message, contentType string) (event.Event, error) {
	if v := header(m, headerPrefix+"specversion"); v != event.CloudEventsVersionV1 {
		return event.Event{}, schemas.Invalid(schemas.ReasonBadEnvelope, "ce_specversion %q is not 1.0", clipHeader(v))
	}
	e := event.New(event.CloudEventsVersionV1)
	for _, h := range m.Headers {
		name := strings.ToLower(h.Key)
		if !strings.HasPrefix(name, headerPrefix) {
			continue
		}
		attr, v := name[len(headerPrefix):], string(h.Value)
		switch attr {
		case "specversion":
		case "id":
			e.SetID(v)
		case "source":
			e.SetSource(v)
		case "type":
			e.SetType(v)
		case "subject":
			e.SetSubject(v)
		case "dataschema":
			e.SetDataSchema(v)
		case "time":
			t, perr := time.Parse(time.RFC3339Nano, v)
			if perr != nil {
				return event.Event{}, schemas.Invalid(schemas.ReasonBadEnvelope, "ce_time %q is not RFC 3339", clipHeader(v))
			}
			e.SetTime(t)
		default:
			e.SetExtension(attr, v)
		}
	}
	if contentType != "" {
		e.SetDataContentType(contentType)
	}
	if err := e.Validate(); err != nil {
		return event.Event{}, schemas.Invalid(schemas.ReasonBadEnvelope, "%s", clipHeader(validationDetail(err)))
	}
	e.DataEncoded = m.Value
	return e, nil
}

// isJSON reports whether the media type ct (any case, with or without parameters) is JSON.
func isJSON(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.ToLower(strings.TrimSpace(ct))
	return ct == "application/json" || ct == "text/json" || strings.HasSuffix(ct, "+json")
}

// headerValue returns the value of m's first header named name (any case), nil when none is.
func headerValue(m *kafka.Message, name string) []byte {
	for _, h := range m.Headers {
		if strings.EqualFold(h.Key, name) {
			return h.Value
		}
	}
	return nil
}

// structuredMode reports whether the content type ct is application/cloudevents*, in any case
// (strings.ToLower's), without converting the usual, ASCII ct.
func structuredMode(ct []byte) bool {
	n := min(len(ct), len(structuredType))
	for _, c := range ct[:n] {
		if c >= utf8.RuneSelf {
			return strings.HasPrefix(strings.ToLower(string(ct)), structuredType)
		}
	}
	return n == len(structuredType) && bytes.EqualFold(ct[:n], []byte(structuredType))
}

func header(m *kafka.Message, name string) string {
	for _, h := range m.Headers {
		if strings.EqualFold(h.Key, name) {
			return string(h.Value)
		}
	}
	return ""
}

// MessageSize is the size of m's key, value and headers as a Kafka v2 record holds them: each
// key, value, header key and header value with its varint length, and the varint header count
// (docs/semantics.md#limits). Every header therefore costs at least two bytes, even an empty one:
// counting content bytes only let a message of half a million empty headers pass the limit. The
// rest of the record's framing (its length, attributes, timestamp and offset deltas) is left out:
// it does not grow with what a producer sends.
func MessageSize(m *kafka.Message) int {
	n := sink.VarintLen(len(m.Key)) + len(m.Key) + sink.VarintLen(len(m.Value)) + len(m.Value) + sink.VarintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += sink.HeaderSize(h)
	}
	return n
}

func clipHeader(s string) string {
	const max = 200
	if len(s) > max {
		s = s[:max]
	}
	return strings.ToValidUTF8(s, "")
}

// MaxMessageBytes is the largest message the decoder accepts.
func (d *Decoder) MaxMessageBytes() int { return d.cfg.MaxMessageBytes }

// PartitionKey is the Kafka key the event is written with (docs/semantics.md#message-keys): the
// aggregate ID of an observation, so one aggregate's events keep their order on one partition;
// for any other eval result its case (workspace, suite, case_id, escaped), so the runs of one case
// reach the processor together. ok is false for an event of neither kind.
func (e Event) PartitionKey() (key string, ok bool) {
	if o, ok := e.Observation(); ok {
		return o.Key.String(), true
	}
	if e.Eval != nil {
		return schemas.JoinEscaped(e.Eval.Scope.Workspace, e.Eval.Suite, e.Eval.CaseID), true
	}
	return "", false
}

// MessageKey is the key to write m, a message holding event ev, with: ev's PartitionKey, except
// that an eval result that is no correction check goes unkeyed when its case key would take m
// past the decoder's limit. That key only groups a case's runs (docs/semantics.md#message-keys):
// it must not turn a message the processor takes into a too_large dead letter. An observation
// keeps its aggregate key whatever its size, as it always has.
func (d *Decoder) MessageKey(ev Event, m *kafka.Message) []byte {
	key, ok := ev.PartitionKey()
	if !ok {
		return nil
	}
	if ev.Eval != nil && !ev.Eval.IsCorrectionCheck() {
		keyed := *m
		keyed.Key = []byte(key)
		if MessageSize(&keyed) > d.cfg.MaxMessageBytes {
			return nil
		}
		return keyed.Key
	}
	return []byte(key)
}

// Observation is the event's repeat-rate observation: every live attempt, and eval results that
// are correction checks. ok is false for any other event.
func (e Event) Observation() (o aggregator.Observation, ok bool) {
	switch {
	case e.Live != nil:
		return aggregator.FromLive(e.Live), true
	case e.Eval != nil:
		return aggregator.FromEval(e.Eval)
	}
	return aggregator.Observation{}, false
}
