// Package cloudevent decodes repeatrate's input: a Kafka message holding a CloudEvent in the
// structured or binary mode of the Kafka protocol binding becomes a validated live attempt or eval
// result, or an error carrying its dead-letter reason (docs/semantics.md#validation). The
// processor, the HTTP ingest and the importers all judge an event with it, so what one accepts the
// others accept. It also keys messages (by aggregate, or by case) and sizes them as Kafka records.
package cloudevent
