// Package suite holds the suite-health semantics of docs/semantics.md (discrimination, revived
// cases, stability and abnormal replies) and the Redis state that makes them durable.
//
// Every eval result is one graded run of its suite. Model is the pure, in-memory statement of the
// rules, used by replay; the Redis store applies the same merge atomically in Lua and is tested
// against the model. Both reduce a suite to the same summary, from which one function builds the
// published snapshots, so the processor and replay agree to the bit.
package suite
