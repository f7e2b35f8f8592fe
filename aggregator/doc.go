// Package aggregator holds the correction repeat-rate semantics (docs/semantics.md) and the Redis
// state that makes them durable; its subpackage suite does the same for suite health.
//
// Model is the pure, in-memory statement of the rules: opportunity identity, re-assessment order,
// retention, windows, rates and Wilson intervals. It takes time as an argument and does no I/O;
// replay runs on it and the Redis store is tested against it. Redis applies the same rules
// atomically, one Lua script call per aggregate and batch, so that a retried or redelivered batch
// changes nothing twice. The commonest call the processor may compute itself (computed.go) and
// store through a script that writes only if nothing it read changed; any other runs apply.lua.
//
// The package does not read Kafka or publish anything: package consumer feeds it and package sink
// carries its snapshots out.
package aggregator
