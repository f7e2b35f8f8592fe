package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/segmentio/kafka-go"
)

// repeatedLive returns n live attempts with event ids from first: opportunities o0.. for the
// first n-again, every fourth a confirmed repeat, then again of those sent a second time (every
// stride-th), so that a clean pass counts n-again.
func repeatedLive(first int64, n, again, stride int) []kafka.Message {
	msgs := make([]kafka.Message, 0, n)
	for i := range n {
		opp, outcome := i, "passed"
		if i >= n-again {
			opp = (i - (n - again)) * stride
		}
		if opp%4 == 0 {
			outcome = "confirmed_repeat"
		}
		m := liveMessage(first+int64(i), fmt.Sprintf("o%d", opp), outcome)
		msgs = append(msgs, kafka.Message{Value: m.Value})
	}
	return msgs
}

// createTopic creates topic name with the given partitions on the test brokers.
func createTopic(ctx context.Context, t *testing.T, brokers []string, name string, partitions int) {
	t.Helper()
	kc := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	if _, err := kc.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: name, NumPartitions: partitions, ReplicationFactor: 1}}}); err != nil {
		t.Fatal(err)
	}
}

// writeAll writes msgs with w, trying again while a new topic has no leader yet.
func writeAll(ctx context.Context, t *testing.T, w *kafka.Writer, msgs []kafka.Message) {
	t.Helper()
	var err error
	for range 50 {
		if err = w.WriteMessages(ctx, msgs...); err == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal(err)
}

// redisStores returns the repeat-rate and suite stores of cfg on client.
func redisStores(t *testing.T, client *redis.Client, cfg aggregator.RedisConfig) (*aggregator.Redis, *suite.Redis) {
	t.Helper()
	rates, err := aggregator.NewRedis(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	suites, err := suite.NewRedis(client, cfg, suite.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return rates, suites
}

// runGroup runs g until the returned stop is called; stop waits for Run to end and reports its
// error. ran delivers Run's error if it ends first.
func runGroup(ctx context.Context, t *testing.T, g *Group) (ran <-chan error, stop func()) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	c := make(chan error, 1)
	go func() { c <- g.Run(runCtx) }()
	return c, func() {
		cancel()
		if err := <-c; err != nil {
			t.Errorf("group: %v", err)
		}
	}
}
