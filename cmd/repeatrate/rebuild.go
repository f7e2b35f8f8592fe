package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/rebuild"
	"github.com/repeatrate/repeatrate/sink"
)

func rebuildCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return configured(ctx, "rebuild", args, getenv, stderr, func(ctx context.Context, cfg Config, log *zap.Logger) error {
		return rebuildShowing(ctx, cfg, log, stderr)
	})
}

// rebuildReplicaWait bounds how long a rebuild waits for redis.wait_replicas replicas to
// acknowledge the rebuilt state before it gives up (nothing committed, nothing cut over).
const rebuildReplicaWait = 2 * time.Minute

func runRebuild(ctx context.Context, cfg Config, log *zap.Logger) error {
	return rebuildShowing(ctx, cfg, log, io.Discard)
}

// rebuildShowing wires a rebuild (package rebuild) with its progress shown on stderr if that is a
// terminal.
func rebuildShowing(ctx context.Context, cfg Config, log *zap.Logger, stderr io.Writer) error {
	kc, rdb, err := openClients(cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if _, err := aggregator.CheckEviction(ctx, rdb); err != nil {
		return err
	}
	// The same output limits as the processor's, before anything changes (docs/semantics.md#limits).
	if err := kc.checkOutputLimits(ctx, []string{cfg.Kafka.SnapshotTopic, cfg.Kafka.SuiteTopic, cfg.Kafka.AlertsTopic,
		cfg.Kafka.DLQTopic}, log); err != nil {
		return err
	}
	dlqWriter := kc.writer(cfg.Kafka.DLQTopic)
	defer dlqWriter.Close()
	w, sw, aw := kc.writer(cfg.Kafka.SnapshotTopic), kc.writer(cfg.Kafka.SuiteTopic), kc.writer(cfg.Kafka.AlertsTopic)
	defer w.Close()
	defer sw.Close()
	defer aw.Close()
	var prog *progress
	finished := false
	r := &rebuild.Rebuild{
		Group: cfg.Kafka.GroupID, Inputs: cfg.Kafka.InputTopics, SnapshotTopic: cfg.Kafka.SnapshotTopic,
		Prefix: cfg.Redis.KeyPrefix, Layout: aggregator.Layout(cfg.Redis.StateLayout), CommitDelay: cfg.Batch.CommitDelay, ReplicaWait: rebuildReplicaWait,
		Redis: rdb, Kafka: rebuildKafka{kc, log},
		Open: func(state aggregator.State) (rebuild.Stores, error) {
			st, err := openStores(ctx, rdb, state, cfg)
			return rebuild.Stores{Rates: st.rates, Suites: st.suites, SuiteConfig: st.suiteCfg, Decoder: st.decoder}, err
		},
		DeadLetters: consumer.NewDeadLetters(dlqWriter, &consumer.KafkaDeadLetterLog{Client: kc.client(), Topic: cfg.Kafka.DLQTopic}),
		Publisher:   sink.NewKafka(w, sw, aw),
		Progress: func(events, done, total int64) {
			if finished {
				return
			}
			if prog == nil {
				prog = newProgress(stderr, "rebuild", total)
			}
			prog.set(events, done)
			if done >= total {
				// Every offset read: the line ends before the publishing and commit steps log.
				prog.finish()
				finished = true
			}
		},
		Log: log,
	}
	err = r.Run(ctx)
	if prog != nil && !finished {
		prog.finish() // a replay that failed part way ends its line too
	}
	return err
}

// rebuildKafka is the cluster as a rebuild asks of it (rebuild.Kafka): its clients, and the log a
// wait for the group's coordinator warns on (nil: none).
type rebuildKafka struct {
	*kafkaClients
	log *zap.Logger
}

func (k rebuildKafka) Members(ctx context.Context, group string) (int, error) {
	return groupMembers(ctx, k.client(), group)
}

// groupMembers returns how many members group has (members of the classic protocol, which
// kafka-go's consumers and Kafka's own classic consumers speak). A coordinator that is moving or
// still loading (a broker just started answers Not Coordinator For Group for a while) is asked
// again for about 10 s, and a group Kafka does not know has none; any other error, or an answer
// without the group, is returned, since a rebuild must not take an error for an empty group.
func groupMembers(ctx context.Context, c *kafka.Client, group string) (int, error) {
	return consumer.RetryTemporary(ctx, consumer.LeaderMoves, consumer.LeaderWait, func() (int, error) {
		groups, err := c.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
		if err != nil {
			return 0, err
		}
		for _, g := range groups.Groups {
			if g.GroupID != group {
				continue
			}
			var ke kafka.Error
			switch {
			case errors.Is(g.Error, kafka.GroupIdNotFound):
				return 0, nil
			case errors.As(g.Error, &ke):
				return 0, g.Error
			case g.Error != nil: // kafka-go could not read a member's subscription: a member exists
				return 0, fmt.Errorf("the group has members this client cannot read (%w): stop every consumer of the group", g.Error)
			}
			return len(g.Members), nil
		}
		return 0, fmt.Errorf("the answer names no group %s", group)
	})
}

func (k rebuildKafka) Committed(ctx context.Context, group string, topics []string) (map[string]map[int]int64, error) {
	return k.committed(ctx, group, topics, k.log)
}

func (k rebuildKafka) EndOffsets(ctx context.Context, topics []string) (map[string]map[int]int64, error) {
	return k.endOffsets(ctx, topics)
}

// Commit commits offsets for group, asking again while the group's coordinator moves or loads (a
// temporary error, as consumer.RetryTemporary waits them out): committing the same offsets twice
// is harmless, and a rebuild that has replayed everything should not fail on its last request. A
// group that has a member refuses the commit with an error that is not temporary, at once, as
// before.
func (k rebuildKafka) Commit(ctx context.Context, group string, offsets map[string]map[int]int64) error {
	_, err := consumer.RetryTemporary(ctx, consumer.LeaderMoves, consumer.LeaderWait, func() (struct{}, error) {
		return struct{}{}, k.commitOnce(ctx, group, offsets)
	})
	return err
}

func (k rebuildKafka) commitOnce(ctx context.Context, group string, offsets map[string]map[int]int64) error {
	commit := &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{}}
	for topic, parts := range offsets {
		for part, off := range parts {
			commit.Topics[topic] = append(commit.Topics[topic], kafka.OffsetCommit{Partition: part, Offset: off})
		}
	}
	resp, err := k.client().OffsetCommit(ctx, commit)
	if err != nil {
		return err
	}
	for t, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return fmt.Errorf("%s/%d: %w", t, p.Partition, p.Error)
			}
		}
	}
	return nil
}

func (k rebuildKafka) Read(ctx context.Context, topic string, part int, end int64, maxBatch int,
	fn func([]kafka.Message) error) (int, error) {
	return k.partitionReader().Read(ctx, topic, part, end, maxBatch, fn)
}

// partitionReader reads partitions to a fixed offset over the process's connections.
func (k *kafkaClients) partitionReader() consumer.PartitionReader {
	return consumer.PartitionReader{Dialer: k.dialer, Brokers: k.brokers}
}
