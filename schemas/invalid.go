package schemas

import (
	"errors"
	"fmt"
)

// ErrInvalid is the sentinel every validation failure wraps: input that matches it is dead-lettered,
// never retried.
var ErrInvalid = errors.New("invalid event")

// Reason is the stable, low-cardinality category of a validation failure. It names the dead-letter
// header value and the metric label, so its values never change once released.
type Reason string

// The reasons a message can be quarantined for.
const (
	ReasonTooLarge      Reason = "too_large"      // message or field over its size limit
	ReasonUndecodable   Reason = "undecodable"    // bytes that are not a CloudEvent
	ReasonBadEnvelope   Reason = "bad_cloudevent" // a CloudEvent missing or breaking a required attribute
	ReasonUnknownType   Reason = "unknown_type"   // a CloudEvent type repeatrate does not consume
	ReasonMissingField  Reason = "missing_field"  // a required data field absent or empty
	ReasonBadEnum       Reason = "bad_enum"       // a value outside its enumeration
	ReasonBadTime       Reason = "bad_time"       // a time that is not RFC 3339
	ReasonFutureEvent   Reason = "future_event"   // occurred_at or assessed_at beyond the allowed clock skew
	ReasonBadValue      Reason = "bad_value"      // a number out of range or a field of the wrong JSON type
	ReasonBadDataFormat Reason = "bad_data"       // data that is not a JSON object
)

// InvalidError says why an event was rejected: a Reason for machines and a detail for people. It
// wraps ErrInvalid.
type InvalidError struct {
	Reason Reason
	Detail string
}

// Invalid returns an *InvalidError with a formatted detail.
func Invalid(r Reason, format string, args ...any) *InvalidError {
	return &InvalidError{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

func (e *InvalidError) Error() string { return string(e.Reason) + ": " + e.Detail }

// Unwrap makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Unwrap() error { return ErrInvalid }

// ReasonOf returns the Reason of an invalid-input error, or "" when err is not one.
func ReasonOf(err error) Reason {
	var ie *InvalidError
	if errors.As(err, &ie) {
		return ie.Reason
	}
	return ""
}
