// Package sink carries repeatrate's results out to Kafka: snapshot, suite and alert CloudEvents,
// each record sized and refused before a broker would refuse it. The HTTP read side that serves
// them is package readside.
//
// It computes no metric itself: snapshots come from package aggregator, already final.
package sink
