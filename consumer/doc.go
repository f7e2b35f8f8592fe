// Package consumer is the Kafka side of repeatrate: it reads input topics in a consumer group,
// decodes each message with package schemas/cloudevent, quarantines bad input on the dead-letter
// topic with its reason, hands observations to the aggregator, and commits
// offsets only after a batch's state is stored and its snapshots are published.
//
// It holds no metric logic (package aggregator) and publishes no snapshots itself (package sink);
// both are reached through the small interfaces Store and Publisher.
package consumer
