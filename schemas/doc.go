// Package schemas defines the events repeatrate reads and writes: the two input event types, the
// snapshots and alerts, their JSON Schemas, and the validation rules that decide which input is
// quarantined and why (docs/semantics.md#input, #validation).
//
// It does no I/O and knows nothing of Kafka: unwrapping CloudEvents from Kafka messages is done in
// package consumer, which hands the event data to ParseLiveAttempt or ParseEvalResult.
package schemas
