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
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/sink"
)

func rebuildCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return configured(ctx, "rebuild", args, getenv, stderr, func(ctx context.Context, cfg Config, log *zap.Logger) error {
		return rebuildShowing(ctx, cfg, log, stderr)
	})
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
//     have stopped before reaching it); each batch publishes the alerts it raises (revived cases,
//     and abnormal samples of runs past the committed offsets) before marking cases announced;
//  5. publish the rebuilt snapshots and suite snapshots, wait until Redis has made the writes
//     durable (the commit delay, then the batch mark), check that nobody committed meanwhile,
//     commit the group's offsets at the noted end, and only then cut over to the new namespace,
//     where `run` takes over.
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
// Committing first and cutting over last means that a processor only ever runs on a namespace
// holding exactly the messages before the committed offsets; the namespace in use can never lack
// messages the group has passed. The other order, after a crash between the two steps, would
// resume the new namespace from the old committed offsets and apply again messages it already
// holds: harmless only because applying is idempotent and outputs carry deterministic ids, and
// dependent on the group's start offset for partitions that had no committed offset.
// rebuildReplicaWait bounds how long a rebuild waits for redis.wait_replicas replicas to
// acknowledge the rebuilt state before it gives up (nothing committed, nothing cut over).
const rebuildReplicaWait = 2 * time.Minute

func rebuild(ctx context.Context, cfg Config, log *zap.Logger) error {
	return rebuildShowing(ctx, cfg, log, io.Discard)
}

// rebuildShowing is rebuild with its progress shown on stderr if that is a terminal.
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

	published, err := publishedVersions(ctx, kc, cfg.Kafka.SnapshotTopic)
	if err != nil {
		return err
	}
	for k, v := range published {
		if err := store.SeedVersion(ctx, k, v); err != nil {
			return err
		}
	}

	dlqWriter := kc.writer(cfg.Kafka.DLQTopic)
	defer dlqWriter.Close()
	dlq := consumer.NewDeadLetters(dlqWriter, &consumer.KafkaDeadLetterLog{Client: kc.client(), Topic: cfg.Kafka.DLQTopic})
	w := kc.writer(cfg.Kafka.SnapshotTopic)
	sw, aw := kc.writer(cfg.Kafka.SuiteTopic), kc.writer(cfg.Kafka.AlertsTopic)
	defer w.Close()
	defer sw.Close()
	defer aw.Close()
	pub := sink.NewKafka(w, sw, aw)
	defer store.Close(context.WithoutCancel(ctx))

	// Future-dated events: the processor judged each event against its clock when the batch
	// arrived, a time no record keeps. The message's own timestamp is the closest reproducible
	// stand-in: the producer stamps it before the broker appends the message and before any
	// processor can receive it, so with sane clocks it is at most the receipt time, and the
	// rebuild dead-letters at least what the processor did (more only for an event that lay more
	// than max_future_skew ahead of its own producer's clock). The timestamp is the producer's to
	// set (kafka-go reports the record's own time even on LogAppendTime topics), so it is capped at
	// the rebuild's start: no producer can stretch the check past a clock the installation trusts,
	// which is what keeps a far-future occurred_at from moving an aggregate's retention. A message
	// without a timestamp is judged against the start.
	start := time.Now()
	touched := map[aggregator.Key]bool{}
	touchedSuites := map[suite.Key]bool{}
	total, revivedN, abnormalN := 0, 0, 0
	var mark int64
	// Progress: offsets read of the end offsets noted above.
	var endSum, doneBefore int64
	for _, parts := range end {
		for _, last := range parts {
			endSum += last
		}
	}
	prog := newProgress(stderr, "rebuild", endSum)
	for topic, parts := range end {
		for part, last := range parts {
			from, seen := committed[topic][part]
			inPart := 0
			n, err := readPartition(ctx, kc, topic, part, last, rebuildBatch, func(batch []kafka.Message) error {
				var obs []aggregator.Observation
				var runs, unseen []suite.RunObservation
				var dls []consumer.DeadLetter
				now := time.Now()
				for i := range batch {
					recv := start
					if t := batch[i].Time; !t.IsZero() && t.Before(start) {
						recv = t
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
						r := suite.FromEvalRun(ev.Eval, suiteCfg.ReplyMode)
						runs = append(runs, r)
						touchedSuites[r.Key.Key] = true
						if !seen || batch[i].Offset >= from {
							unseen = append(unseen, r)
						}
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
					applied, err := suites.Apply(ctx, runs, now)
					if err != nil {
						return err
					}
					// The alerts these runs raise, as the processor raises them batch by batch:
					// every revived case (the new namespace has announced none; the events'
					// ids are deterministic, so one the processor published before is a
					// recognisable copy), and the abnormal samples of the runs past the
					// committed offsets, whose alerts the processor may not have published.
					// Published before they are marked announced, as the processor does.
					out := suite.BuildOutput(applied, unseen, suiteCfg, now)
					alerts := suite.Output{Revived: out.Revived, Abnormal: out.Abnormal}
					if err := pub.PublishSuites(ctx, alerts, now); err != nil {
						return err
					}
					if err := markAnnounced(ctx, suites, out.Revived); err != nil {
						return err
					}
					revivedN += len(out.Revived)
					abnormalN += len(out.Abnormal)
				}
				// A Redis that lost writes of an earlier batch fails here or in the next apply.
				var err error
				mark, err = store.Seal(ctx, nil)
				inPart += len(batch)
				prog.set(int64(total+inPart), doneBefore+batch[len(batch)-1].Offset+1)
				return err
			})
			if err != nil {
				prog.finish()
				return fmt.Errorf("rebuild %s/%d: %w; run the rebuild again", topic, part, err)
			}
			total += n
			doneBefore += last
			prog.set(int64(total), doneBefore)
		}
	}
	prog.finish()

	// Publish the rebuilt state.
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
		sum, err := suites.Read(ctx, k, now)
		if err != nil {
			return err
		}
		out := suite.BuildOutput(suite.Applied{Suites: []suite.Key{k}, Summaries: map[suite.Key]*suite.Summary{k: sum}}, nil, suiteCfg, now)
		out.Revived = nil // announced batch by batch above
		if err := pub.PublishSuites(ctx, out, now); err != nil {
			return err
		}
	}
	// Durable before committed, as the processor holds its offsets: wait out the commit delay
	// (AOF everysec syncs once a second), then check that Redis still holds the last batch mark,
	// which stands for every write before it. CutOver checks that the new namespace kept its epoch.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(cfg.Batch.CommitDelay):
	}
	// The offsets about to be committed are recorded beside the rebuilt state, as the processor
	// records its commits, so a later loss of the rebuilt state is caught too.
	// With redis.wait_replicas, replicas that lag behind the bulk of rebuilt writes are waited for,
	// up to rebuildReplicaWait; a loss or any other failure ends the rebuild at once.
	for waited := time.Duration(0); ; waited += time.Second {
		err := store.Verify(ctx, mark, end)
		if err == nil {
			break
		}
		if !errors.Is(err, aggregator.ErrReplicasBehind) || waited >= rebuildReplicaWait {
			return fmt.Errorf("rebuild: %w; run the rebuild again", err)
		}
		log.Warn("rebuilt state not yet on enough replicas; waiting", zap.Error(err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
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
		zap.Int("aggregates", len(touched)), zap.Int("suites", len(touchedSuites)),
		zap.Int("revived_published", revivedN), zap.Int("abnormal_published", abnormalN))
	return nil
}

// markAnnounced records revived events as published, per suite.
func markAnnounced(ctx context.Context, suites *suite.Redis, revived []schemas.CaseRevived) error {
	byKey := map[suite.Key][]string{}
	for _, r := range revived {
		k := suite.Key{Workspace: r.Workspace, Suite: r.Suite}
		byKey[k] = append(byKey[k], r.CaseID)
	}
	for k, cases := range byKey {
		if err := suites.MarkAnnounced(ctx, k, cases); err != nil {
			return err
		}
	}
	return nil
}

// rebuildBatch is the most input messages the rebuild applies in one batch.
const rebuildBatch = 5000

// publishedVersions returns the greatest version the snapshot topic holds for every aggregate: each
// partition is read from its start up to its high-water mark as noted on entry, however long that
// takes (a stalled fetch delays the rebuild; it never ends the reading early). A missing topic has
// published nothing. Messages that are not snapshots are skipped.
func publishedVersions(ctx context.Context, kc *kafkaClients, topic string) (map[aggregator.Key]int64, error) {
	published := map[aggregator.Key]int64{}
	ends, err := kc.endOffsets(ctx, []string{topic})
	if errors.Is(err, kafka.UnknownTopicOrPartition) || err != nil && strings.Contains(err.Error(), "not found") {
		return published, nil
	}
	if err != nil {
		return nil, err
	}
	for part, end := range ends[topic] {
		if _, err := readPartition(ctx, kc, topic, part, end, rebuildBatch, func(batch []kafka.Message) error {
			for i := range batch {
				var ev struct {
					Data schemas.Snapshot `json:"data"`
				}
				if json.Unmarshal(batch[i].Value, &ev) != nil {
					continue
				}
				a := ev.Data.Aggregate
				src, ok := aggregator.ParseSource(a.Source)
				if !ok {
					continue
				}
				k := aggregator.Key{Scope: schemas.Scope{Workspace: a.Workspace, Model: a.Model, Run: a.Run,
					Checkpoint: a.Checkpoint, Artifact: a.Artifact}, CorrectionID: a.CorrectionID, Source: src}
				published[k] = max(published[k], ev.Data.Version)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return published, nil
}

// Reading one partition to a fixed offset.
const (
	fetchMaxBytes = 16 << 20
	fetchMaxWait  = 500 * time.Millisecond
	fetchTimeout  = 30 * time.Second // one fetch round trip, reading included
	fetchAttempts = 5                // failed fetches in a row before readPartition gives up
)

// readPartition feeds fn every message of topic/part below offset end, in offset order, in slices
// of at most maxBatch, and returns how many it fed. It stops at end and never waits for silence:
// a fetch that returns no message while the partition's high-water mark is at or past end proves
// that nothing is left below end (records removed by compaction, transaction markers); while the
// high-water mark is below end (a new leader catching up) it keeps fetching until ctx ends.
// Records that retention deletes before they are read are skipped, as they are for every consumer;
// a log truncated below the position (unclean leader election) is an error. A failing fetch is
// retried on a new connection a few times.
func readPartition(ctx context.Context, kc *kafkaClients, topic string, part int, end int64, maxBatch int,
	fn func([]kafka.Message) error) (int, error) {
	var conn *kafka.Conn
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	total, failures := 0, 0
	pos := int64(-1) // the next offset to read; -1: the partition's first
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		from := pos
		var msgs []kafka.Message
		var hwm int64
		err := func() error {
			if conn == nil {
				c, err := dialLeader(ctx, kc, topic, part)
				if err != nil {
					return err
				}
				conn = c
			}
			if pos < 0 {
				conn.SetDeadline(time.Now().Add(fetchTimeout))
				first, err := conn.ReadFirstOffset()
				if err != nil {
					return err
				}
				pos, from = first, first
			}
			if pos >= end {
				return nil
			}
			var err error
			msgs, hwm, pos, err = fetchTo(conn, pos, end)
			return err
		}()
		if errors.Is(err, kafka.OffsetOutOfRange) && conn != nil {
			conn.SetDeadline(time.Now().Add(fetchTimeout))
			first, ferr := conn.ReadFirstOffset()
			if ferr == nil && first > pos {
				pos = first // retention deleted what was not read yet
				continue
			}
			return total, fmt.Errorf("read %s/%d at %d (first offset %d, end %d): %w", topic, part, pos, first, end, errors.Join(err, ferr))
		}
		if err != nil {
			failures++
			if failures >= fetchAttempts {
				return total, fmt.Errorf("read %s/%d at %d: %w", topic, part, pos, err)
			}
			if conn != nil {
				conn.Close()
				conn = nil
			}
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(time.Duration(failures) * 200 * time.Millisecond):
			}
			continue
		}
		failures = 0
		if pos >= end || (len(msgs) == 0 && pos == from && hwm >= end) {
			// Read up to end, or nothing is left below it (see above).
			pos = max(pos, end)
		}
		for len(msgs) > 0 {
			n := min(len(msgs), maxBatch)
			if err := fn(msgs[:n]); err != nil {
				return total, err
			}
			total += n
			msgs = msgs[n:]
		}
		if pos >= end {
			return total, nil
		}
	}
}

// fetchTo makes one fetch at offset pos and returns its messages below end, the partition's
// high-water mark, and the offset to read next (past records the fetch showed were compacted away).
func fetchTo(conn *kafka.Conn, pos, end int64) ([]kafka.Message, int64, int64, error) {
	if _, err := conn.Seek(pos, kafka.SeekAbsolute|kafka.SeekDontCheck); err != nil {
		return nil, 0, pos, err
	}
	conn.SetDeadline(time.Now().Add(fetchTimeout))
	b := conn.ReadBatchWith(kafka.ReadBatchConfig{MinBytes: 1, MaxBytes: fetchMaxBytes, MaxWait: fetchMaxWait})
	var msgs []kafka.Message
	next := pos
	for {
		m, err := b.ReadMessage()
		if err != nil || m.Offset >= end {
			break
		}
		msgs = append(msgs, m)
		next = m.Offset + 1
	}
	hwm := b.HighWaterMark()
	if err := b.Close(); err != nil {
		return nil, hwm, pos, err
	}
	return msgs, hwm, max(next, b.Offset()), nil
}

// dialLeader connects to the leader of topic/part through the first broker that answers.
func dialLeader(ctx context.Context, kc *kafkaClients, topic string, part int) (*kafka.Conn, error) {
	var errs []error
	for _, b := range kc.brokers {
		c, err := kc.dialer.DialLeader(ctx, "tcp", b, topic, part)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("connect to the leader of %s/%d: %w", topic, part, errors.Join(errs...))
}
