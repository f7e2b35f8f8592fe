// Package cluster tests the processor on the distributed engines it is meant to run on: a Redis
// Cluster of three primaries with a replica each (deploy/local/redis-cluster.sh) and three Kafka
// brokers (deploy/local/kafka-cluster.sh). The tests skip when the clusters are not running,
// unless CI=true; deploy/local/test.sh starts both and runs them.
package cluster
