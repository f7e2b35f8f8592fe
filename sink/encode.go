package sink

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/repeatrate/repeatrate/schemas"
)

// Source is the CloudEvents source attribute of everything repeatrate publishes.
const Source = "urn:repeatrate"

// ContentType is the Kafka content-type header of a structured-mode CloudEvent.
const ContentType = "application/cloudevents+json"

// EncodeSnapshot renders a snapshot as a structured CloudEvent. Its id is derived from the
// aggregate, version and observation time, so the same snapshot always has the same id and a
// subscriber can drop exact repeats; subject is the aggregate ID, the message key.
func EncodeSnapshot(s *schemas.Snapshot) ([]byte, error) {
	key := s.Aggregate.ID()
	sum := sha256.Sum256([]byte(key + "\x00" + strconv.FormatInt(s.Version, 10) + "\x00" + s.ObservedAt.Format("2006-01-02T15:04:05.999999999Z07:00")))
	e := event.New(event.CloudEventsVersionV1)
	e.SetID(hex.EncodeToString(sum[:16]))
	e.SetSource(Source)
	e.SetType(schemas.TypeSnapshot)
	e.SetSubject(key)
	e.SetTime(s.ObservedAt)
	if err := e.SetData(event.ApplicationJSON, s); err != nil {
		return nil, fmt.Errorf("encode snapshot %s: %w", key, err)
	}
	b, err := e.MarshalJSON()
	if err != nil {
		return nil, fmt.Errorf("encode snapshot %s: %w", key, err)
	}
	return b, nil
}
