// Package sink carries repeatrate's results out: snapshot CloudEvents to Kafka, and an HTTP server
// with health, Prometheus metrics, a read API of current snapshots and the R badge.
//
// It computes no metric itself: snapshots come from package aggregator, already final.
package sink
