// Package alert turns the published snapshots into alerts: it reads a rules file, evaluates each
// rule against the latest repeat-rate and suite snapshots, steps a Prometheus-style lifecycle per
// (rule, subject) — inactive → pending (`for`) → firing → resolved, with `keep_firing_for` and a
// resend interval — and delivers each firing and resolved notification exactly once, whichever
// instance evaluates (docs/semantics.md#alerting).
//
// The pure parts take time as an argument and do no I/O: Parse validates a rules file, Table holds
// the latest snapshots, Evaluate decides each rule's condition with its evidence, Step moves one
// lifecycle, and the statistics (ChangeTest, the beta-binomial confidence sequence, Fisher's exact
// test) are plain functions. Redis holds the lifecycle state and a per-sink outbox, changed only by
// compare-and-set scripts; Evaluator wires them to a clock, and Kafka and Alertmanager carry the
// notifications out.
//
// The package does not compute repeat rates or suite health (packages aggregator and
// aggregator/suite do) and reads no input topic: it sees exactly what a subscriber of the snapshot
// topics sees.
package alert
