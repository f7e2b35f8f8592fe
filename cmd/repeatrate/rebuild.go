package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

func rebuildCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return configured(ctx, "rebuild", args, getenv, stderr, rebuild)
}

// rebuild recomputes the whole state from the input topics into a fresh Redis namespace and cuts
// over to it, with the processors stopped:
//
//  1. check that the group has no member, create the fresh namespace and retire the one in use
//     (aggregator.Retire): from here on a processor on the old namespace fails its next batch and a
//     starting one refuses, so nothing publishes or commits from the old state any more;
//  2. note the group's committed offsets and the input topics' end offsets: the rebuild covers
//     everything before the end offsets;
//  3. read the snapshot topic, so every aggregate's version continues above what was published;
//  4. apply every input message from the beginning, in batches, with the processor's own stores;
//     bad input is dead-lettered unless the dead-letter topic already has it (the processor may
//     have stopped before reaching it);
//  5. publish the rebuilt snapshots, mark revived cases announced, wait out the commit delay so
//     that Redis has made the writes durable, check that nobody committed meanwhile, commit the
//     group's offsets at the noted end, and only then cut over to the new namespace, where `run`
//     takes over.
//
// Why this order loses nothing and counts nothing twice when the rebuild stops at any step:
//   - before the commit, the group's offsets are what they were (a processor resuming would
//     re-read everything the rebuild covered), and the old namespace is retired, so no processor
//     resumes on it: the error says to run the rebuild again, which starts over in another fresh
//     namespace. The half-built namespace is never used.
//   - between the commit and the cut-over, the group stands at the end offsets but the pointer
//     still names the retired namespace: again every processor refuses, and the next rebuild
//     recomputes from the beginning up to the (unchanged or later) end offsets and commits those.
//   - after the cut-over the new namespace holds exactly the messages before the committed
//     offsets, and `run` continues from there.
//
// Committing first and cutting over last means the namespace in use and the committed offsets
// never disagree in the one direction that loses data (a namespace that lacks messages the group
// has passed). The other order would rely on re-applying the messages between the old committed
// offsets and the end offsets, which is harmless only because applying is idempotent, and would
// lose messages of partitions that had no committed offset at all.
func rebuild(ctx context.Context, cfg Config, log *zap.Logger) error {
	kc, rdb, err := openClients(cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()
	groups, err := kc.client().DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{cfg.Kafka.GroupID}})
	if err != nil {
		return fmt.Errorf("describe group %s: %w", cfg.Kafka.GroupID, err)
	}
	for _, g := range groups.Groups {
		if len(g.Members) > 0 {
			return fmt.Errorf("group %s has %d active members: stop every processor before a rebuild", cfg.Kafka.GroupID, len(g.Members))
		}
	}
	state, err := aggregator.NewNamespace(ctx, rdb, cfg.Redis.KeyPrefix)
	if err != nil {
		return err
	}
	retired, err := aggregator.Retire(ctx, rdb, cfg.Redis.KeyPrefix, state)
	if err != nil {
		return err
	}
	// After the retirement: no processor commits from here on, so these are the offsets up to
	// which every output of the input was published.
	committed, err := kc.committed(ctx, cfg.Kafka.GroupID, cfg.Kafka.InputTopics)
	if err != nil {
		return err
	}
	end, err := kc.endOffsets(ctx, cfg.Kafka.InputTopics)
	if err != nil {
		return err
	}
	log.Info("rebuilding", zap.String("namespace", state.Namespace), zap.String("retired", retired),
		zap.Any("end_offsets", end))
	st, err := openStores(rdb, state, cfg)
	if err != nil {
		return err
	}
	store, suites, suiteCfg, dec := st.rates, st.suites, st.suiteCfg, st.decoder

	// Versions published so far, from the compacted snapshot topic.
	published := map[aggregator.Key]int64{}
	if err := tail(ctx, kc, cfg.Kafka.SnapshotTopic, 3*time.Second, func(m kafka.Message) error {
		var ev struct {
			Data schemas.Snapshot `json:"data"`
		}
		if json.Unmarshal(m.Value, &ev) != nil {
			return nil
		}
		a := ev.Data.Aggregate
		src, ok := aggregator.ParseSource(a.Source)
		if !ok {
			return nil
		}
		k := aggregator.Key{Scope: schemas.Scope{Workspace: a.Workspace, Model: a.Model, Run: a.Run, Checkpoint: a.Checkpoint,
			Artifact: a.Artifact}, CorrectionID: a.CorrectionID, Source: src}
		published[k] = max(published[k], ev.Data.Version)
		return nil
	}); err != nil && !strings.Contains(err.Error(), "not found") {
		return err
	}
	for k, v := range published {
		if err := store.SeedVersion(ctx, k, v); err != nil {
			return err
		}
	}

	dlqWriter := kc.writer(cfg.Kafka.DLQTopic)
	defer dlqWriter.Close()
	dlq := consumer.NewDeadLetters(dlqWriter, &consumer.KafkaDeadLetterLog{Brokers: kc.brokers, Dialer: kc.dialer,
		Client: kc.client(), Topic: cfg.Kafka.DLQTopic})
	touched := map[aggregator.Key]bool{}
	touchedSuites := map[aggregator.SuiteKey]bool{}
	total := 0
	for topic, parts := range end {
		for part, last := range parts {
			n, err := rebuildPartition(ctx, kc, topic, part, last, func(batch []kafka.Message) error {
				var obs []aggregator.Observation
				var runs []aggregator.RunObservation
				var dls []consumer.DeadLetter
				now := time.Now()
				for i := range batch {
					// Future-dated events are judged against the time Kafka took the message: the
					// nearest record of when the processor first received it.
					recv := batch[i].Time
					if recv.IsZero() {
						recv = now
					}
					ev, err := dec.Decode(&batch[i], recv)
					if err != nil {
						var ie *schemas.InvalidError
						if errors.As(err, &ie) {
							dls = append(dls, consumer.DeadLetter{Message: batch[i], Reason: ie.Reason, Detail: ie.Detail})
						}
						continue
					}
					if o, ok := ev.Observation(); ok {
						obs = append(obs, o)
						touched[o.Key] = true
					}
					if ev.Eval != nil {
						r := aggregator.FromEvalRun(ev.Eval, suiteCfg.ReplyMode)
						runs = append(runs, r)
						touchedSuites[r.Key.SuiteKey] = true
					}
				}
				if err := dlq.Send(ctx, dls); err != nil {
					return err
				}
				if len(obs) > 0 {
					if _, err := store.Apply(ctx, obs, now); err != nil {
						return err
					}
				}
				if len(runs) > 0 {
					if _, err := suites.Apply(ctx, runs); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return err
			}
			total += n
		}
	}

	// Publish the rebuilt state, then cut over and hand the group its offsets.
	w := kc.writer(cfg.Kafka.SnapshotTopic)
	sw, aw := kc.writer(cfg.Kafka.SuiteTopic), kc.writer(cfg.Kafka.AlertsTopic)
	defer w.Close()
	defer sw.Close()
	defer aw.Close()
	pub := sink.NewKafka(w, sw, aw)
	now := time.Now()
	var snaps []schemas.Snapshot
	for k := range touched {
		t, err := store.Tally(ctx, k, now)
		if err != nil {
			return err
		}
		snaps = append(snaps, t.Snapshot(k, now))
	}
	if err := pub.Publish(ctx, snaps); err != nil {
		return err
	}
	for k := range touchedSuites {
		applied, err := suites.Read(ctx, k)
		if err != nil {
			return err
		}
		d, revived := aggregator.Discrimination(k, applied, suiteCfg, now)
		out := aggregator.SuiteOutput{Discrimination: []schemas.SuiteDiscrimination{d}}
		versions := map[string]bool{}
		for _, e := range applied {
			versions[e.Key.Version] = true
		}
		for v := range versions {
			out.Stability = append(out.Stability, aggregator.Stability(k, v, aggregator.VersionRuns(applied, v), suiteCfg, now))
		}
		if err := pub.PublishSuites(ctx, out, now); err != nil {
			return err
		}
		var cases []string
		for _, r := range revived {
			cases = append(cases, r.CaseID)
		}
		if err := suites.MarkAnnounced(ctx, k, cases); err != nil {
			return err
		}
	}
	// Durable before committed, as the processor holds its offsets: wait out the commit delay
	// (AOF everysec syncs once a second). CutOver checks that the new namespace kept its epoch.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(cfg.Batch.CommitDelay):
	}
	// A processor that joined after the check above and committed meanwhile published from the
	// old state, beyond what the versions were seeded from: start over rather than guess.
	again, err := kc.committed(ctx, cfg.Kafka.GroupID, cfg.Kafka.InputTopics)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(again, committed) {
		return fmt.Errorf("group %s committed offsets during the rebuild (%v, then %v): stop every processor and run the rebuild again",
			cfg.Kafka.GroupID, committed, again)
	}
	// Commit, then cut over (see the order above). The broker accepts a commit without a
	// generation only while the group has no member, so a processor that joined meanwhile makes
	// this step fail rather than race it.
	commit := &kafka.OffsetCommitRequest{GroupID: cfg.Kafka.GroupID, GenerationID: -1, Topics: map[string][]kafka.OffsetCommit{}}
	for topic, parts := range end {
		for part, off := range parts {
			commit.Topics[topic] = append(commit.Topics[topic], kafka.OffsetCommit{Partition: part, Offset: off})
		}
	}
	resp, err := kc.client().OffsetCommit(ctx, commit)
	if err != nil {
		return fmt.Errorf("commit rebuilt offsets: %w; run the rebuild again", err)
	}
	for t, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return fmt.Errorf("commit rebuilt offsets %s/%d: %w; run the rebuild again", t, p.Partition, p.Error)
			}
		}
	}
	if err := aggregator.CutOver(ctx, rdb, cfg.Redis.KeyPrefix, state); err != nil {
		return fmt.Errorf("%w; run the rebuild again", err)
	}
	log.Info("rebuilt", zap.String("namespace", state.Namespace), zap.Int("messages", total),
		zap.Int("aggregates", len(touched)), zap.Int("suites", len(touchedSuites)))
	return nil
}

// rebuildPartition feeds every message of one partition before offset end to fn, in batches.
func rebuildPartition(ctx context.Context, kc *kafkaClients, topic string, part int, end int64, fn func([]kafka.Message) error) (int, error) {
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: kc.brokers, Dialer: kc.dialer, Topic: topic, Partition: part,
		MinBytes: 1, MaxBytes: 16 << 20, MaxWait: 200 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(kafka.FirstOffset); err != nil {
		return 0, err
	}
	total := 0
	batch := make([]kafka.Message, 0, 5000)
	for {
		if len(batch) > 0 && (len(batch) == cap(batch) || batch[len(batch)-1].Offset+1 >= end) {
			if err := fn(batch); err != nil {
				return total, err
			}
			total += len(batch)
			if batch[len(batch)-1].Offset+1 >= end {
				return total, nil
			}
			batch = batch[:0]
		}
		if total == 0 && len(batch) == 0 {
			if first, err := firstOffset(ctx, kc, topic, part); err != nil || first >= end {
				return 0, err
			}
		}
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return total, fmt.Errorf("rebuild read %s/%d: %w", topic, part, err)
		}
		batch = append(batch, m)
	}
}

func firstOffset(ctx context.Context, kc *kafkaClients, topic string, part int) (int64, error) {
	resp, err := kc.client().ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: {kafka.FirstOffsetOf(part)}}})
	if err != nil {
		return 0, err
	}
	for _, p := range resp.Topics[topic] {
		return p.FirstOffset, p.Error
	}
	return 0, fmt.Errorf("no offsets for %s/%d", topic, part)
}
