package sink

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/repeatrate/repeatrate/schemas"
)

// Source is the CloudEvents source attribute of everything repeatrate publishes.
const Source = "urn:repeatrate"

// ContentType is the Kafka content-type header of a structured-mode CloudEvent.
const ContentType = "application/cloudevents+json"

// Out is one output event before encoding: its type, subject (also the Kafka key), time and data.
// IDSeed decides the CloudEvent id: the same seed always gives the same id, so a subscriber can
// drop an event published twice (after a redelivery) by id.
type Out struct {
	Type    string
	Subject string
	Time    time.Time
	IDSeed  string
	Data    any
}

// Encode renders an output event as a structured CloudEvent. The bytes are the CloudEvents SDK's:
// when type and subject are printable ASCII with nothing to escape or trim (every subject
// repeatrate makes: JoinEscaped percent-encodes the rest) and the time is set, the attributes are
// written directly, in the order the SDK writes them, before the data; anything else goes through
// the SDK (TestEncodeAgreesWithSDK). Encoding is a good part of the processor's cost per event.
func Encode(o *Out) ([]byte, error) {
	if !plainAttribute(o.Type) || !plainAttribute(o.Subject) || o.Time.IsZero() || o.Data == nil {
		return encodeSDK(o) // the SDK leaves out the data member of an event without data
	}
	id := eventID(o)
	b := make([]byte, 0, 1280+len(o.Type)+len(o.Subject))
	b = append(b, `{"specversion":"1.0","id":"`...)
	b = hex.AppendEncode(b, id[:])
	b = append(b, `","source":"`+Source+`","type":"`...)
	b = append(b, o.Type...)
	b = append(b, `","subject":"`...)
	b = append(b, o.Subject...)
	b = append(b, `","datacontenttype":"application/json","time":"`...)
	b = o.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","data":`...)
	var err error
	if snap, ok := o.Data.(*schemas.Snapshot); ok && snap != nil {
		b, err = snap.AppendJSON(b)
	} else {
		var data []byte
		data, err = json.Marshal(o.Data)
		b = append(b, data...)
	}
	if err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", o.Type, o.Subject, err)
	}
	return append(b, '}'), nil
}

// eventID is the CloudEvent id of o: the first half of a SHA-256 of type, subject and seed.
func eventID(o *Out) [16]byte {
	sum := sha256.Sum256([]byte(o.Type + "\x00" + o.Subject + "\x00" + o.IDSeed))
	return [16]byte(sum[:16])
}

// plainAttribute reports whether s is written as it is by the SDK: not empty, printable ASCII
// without quotes, backslashes or spaces (the SDK trims spaces off a subject and a type).
func plainAttribute(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// encodeSDK renders o with the CloudEvents SDK.
func encodeSDK(o *Out) ([]byte, error) {
	id := eventID(o)
	e := event.New(event.CloudEventsVersionV1)
	e.SetID(hex.EncodeToString(id[:]))
	e.SetSource(Source)
	e.SetType(o.Type)
	e.SetSubject(o.Subject)
	e.SetTime(o.Time)
	if err := e.SetData(event.ApplicationJSON, o.Data); err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", o.Type, o.Subject, err)
	}
	b, err := e.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode %s %s: %w", o.Type, o.Subject, err)
	}
	return b, nil
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// SnapshotOut is the output event of a repeat-rate snapshot, keyed by aggregate ID.
func SnapshotOut(s *schemas.Snapshot) Out {
	return Out{Type: schemas.TypeSnapshot, Subject: s.Aggregate.ID(), Time: s.ObservedAt,
		IDSeed: strconv.FormatInt(s.Version, 10) + "@" + stamp(s.ObservedAt), Data: s}
}

// EncodeSnapshot renders a snapshot as a structured CloudEvent.
func EncodeSnapshot(s *schemas.Snapshot) ([]byte, error) {
	o := SnapshotOut(s)
	return Encode(&o)
}

// DiscriminationOut is the output event of a suite discrimination snapshot, keyed "d|<ws>|<suite>"
// so it never shares a compacted key with a stability snapshot. It lists at most
// schemas.MaxListedCases revived cases and counts them all in revived_total.
func DiscriminationOut(d *schemas.SuiteDiscrimination) Out {
	c := *d
	c.RevivedTotal = max(c.RevivedTotal, len(c.Revived))
	if len(c.Revived) > schemas.MaxListedCases {
		c.Revived = c.Revived[:schemas.MaxListedCases]
	}
	return Out{Type: schemas.TypeSuiteDiscrimination, Subject: "d|" + schemas.JoinEscaped(d.Workspace, d.Suite),
		Time: d.ObservedAt, IDSeed: stamp(d.ObservedAt), Data: &c}
}

// StabilityOut is the output event of a suite stability snapshot, keyed "s|<ws>|<suite>|<version>".
// It lists the missing runs of at most schemas.MaxListedCases cases; missing_runs_total counts all.
func StabilityOut(s *schemas.SuiteStability) Out {
	c := *s
	if len(c.MissingRuns) > schemas.MaxListedCases {
		c.MissingRuns = c.MissingRuns[:schemas.MaxListedCases]
	}
	return Out{Type: schemas.TypeSuiteStability, Subject: "s|" + schemas.JoinEscaped(s.Workspace, s.Suite, s.Version),
		Time: s.ObservedAt, IDSeed: stamp(s.ObservedAt), Data: &c}
}

// RevivedOut is the output event of a revived case; its id depends only on the flip.
func RevivedOut(r *schemas.CaseRevived, at time.Time) Out {
	return Out{Type: schemas.TypeCaseRevived, Subject: schemas.JoinEscaped(r.Workspace, r.Suite, r.CaseID),
		Time: at, IDSeed: r.Version + "|" + r.From + "|" + r.To, Data: r}
}

// AbnormalOut is the output event of an abnormal sample; its id depends only on the run and metric.
// It quotes at most schemas.MaxFragmentBytes of the repeated fragment.
func AbnormalOut(a *schemas.AbnormalSample, at time.Time) Out {
	c := *a
	if len(c.Fragment) > schemas.MaxFragmentBytes {
		c.Fragment = strings.ToValidUTF8(c.Fragment[:schemas.MaxFragmentBytes], "")
	}
	return Out{Type: schemas.TypeSampleAbnormal,
		Subject: schemas.JoinEscaped(a.Workspace, a.Suite, a.Version, a.CaseID, strconv.FormatInt(a.RunIndex, 10)),
		Time:    at, IDSeed: a.Metric + "|" + strconv.Itoa(a.Tokens) + "|" + strconv.FormatFloat(a.GzipRatio, 'g', -1, 64), Data: &c}
}
