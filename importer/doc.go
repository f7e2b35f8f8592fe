// Package importer maps the result files of eval harnesses to repeatrate.eval.result.v1 events
// (schemas.EvalResult in structured CloudEvents): Inspect AI eval logs (Inspect) and OpenCompass
// outputs (OpenCompass), and lm-evaluation-harness --log_samples output (LMEval). Every event is a pure function of the files and the Options — its
// CloudEvent id, times and content — so importing the same files twice yields the same events,
// which the processor counts once. Each event is checked by the same decoder as the Kafka path
// (cloudevent.Decoder) before it is returned.
package importer
