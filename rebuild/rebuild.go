// Package rebuild recomputes the whole state from the input topics into a fresh Redis namespace
// and cuts over to it, with the processors stopped (`repeatrate rebuild`): what an operator runs
// after Redis lost state, or to move to a new state layout.
package rebuild

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

// Kafka is what a rebuild asks of the cluster: the group's members and offsets, the input
// topics' ends, and their messages up to those ends.
type Kafka interface {
	// Members is how many members the group has now.
	Members(ctx context.Context, group string) (int, error)
	// Committed is the group's committed offsets of topics; partitions without one are absent.
	Committed(ctx context.Context, group string, topics []string) (map[string]map[int]int64, error)
	// EndOffsets is the next offset to be written of every partition of topics.
	EndOffsets(ctx context.Context, topics []string) (map[string]map[int]int64, error)
	// Commit commits offsets for the group without a generation: the broker accepts that only
	// while the group has no member.
	Commit(ctx context.Context, group string, offsets map[string]map[int]int64) error
	// Read feeds fn the messages of topic/part below end in offset order, in slices of at most
	// maxBatch (consumer.PartitionReader.Read).
	Read(ctx context.Context, topic string, part int, end int64, maxBatch int, fn func([]kafka.Message) error) (int, error)
}

// Stores are the processor's stores of one namespace, as a rebuild applies the input to them.
type Stores struct {
	Rates       *aggregator.Redis
	Suites      *suite.Redis
	SuiteConfig suite.Config
	Decoder     *cloudevent.Decoder
}

// Rebuild is one rebuild's configuration and the clients it runs with.
type Rebuild struct {
	Group         string
	Inputs        []string
	SnapshotTopic string
	// Prefix is the installation's Redis key prefix, under which namespaces are created.
	Prefix string
	// Layout is the state layout the rebuilt namespace is created in (0: layout 10): a rebuild is
	// how an installation moves to another layout.
	Layout aggregator.Layout
	// CommitDelay is the processor's commit delay: how long Redis takes to make a write durable.
	CommitDelay time.Duration
	// ReplicaWait bounds how long the rebuild waits for the configured replicas to acknowledge
	// the rebuilt state before it gives up (nothing committed, nothing cut over).
	ReplicaWait time.Duration

	Redis redis.UniversalClient
	Kafka Kafka
	// Open opens the processor's stores on a namespace.
	Open        func(aggregator.State) (Stores, error)
	DeadLetters *consumer.DeadLetters
	Publisher   *sink.Kafka
	// Progress, if set, is told the events applied and the offsets read of total as the
	// rebuild goes.
	Progress func(events, done, total int64)
	Log      *zap.Logger
}

// batchSize is the most input messages the rebuild applies in one batch.
const batchSize = 5000

// Run recomputes the whole state from the input topics into a fresh Redis namespace and cuts
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
//     where `repeatrate run` takes over.
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
func (r *Rebuild) Run(ctx context.Context) error {
	members, err := r.Kafka.Members(ctx, r.Group)
	if err != nil {
		return fmt.Errorf("describe group %s: %w", r.Group, err)
	}
	if members > 0 {
		return fmt.Errorf("group %s has %d active members: stop every processor before a rebuild", r.Group, members)
	}
	layout := r.Layout
	if layout == 0 {
		layout = aggregator.Layout10
	}
	state, err := aggregator.NewNamespaceIn(ctx, r.Redis, r.Prefix, layout)
	if err != nil {
		return err
	}
	retired, err := aggregator.Retire(ctx, r.Redis, r.Prefix, state)
	if err != nil {
		return err
	}
	// After the retirement: no processor commits from here on, so these are the offsets up to
	// which every output of the input was published.
	committed, err := r.Kafka.Committed(ctx, r.Group, r.Inputs)
	if err != nil {
		return err
	}
	end, err := r.Kafka.EndOffsets(ctx, r.Inputs)
	if err != nil {
		return err
	}
	r.Log.Info("rebuilding", zap.String("namespace", state.Namespace), zap.String("retired", retired),
		zap.Any("end_offsets", end))
	st, err := r.Open(state)
	if err != nil {
		return err
	}
	store := st.Rates
	defer store.Close(context.WithoutCancel(ctx))
	published, err := PublishedVersions(ctx, r.Kafka, r.SnapshotTopic)
	if err != nil {
		return err
	}
	for k, v := range published {
		if err := store.SeedVersion(ctx, k, v); err != nil {
			return err
		}
	}
	a := applier{Rebuild: r, st: st, start: time.Now(), committed: committed,
		touched: map[aggregator.Key]bool{}, touchedSuites: map[suite.Key]bool{}}
	if err := a.replay(ctx, end); err != nil {
		return err
	}
	if err := a.publish(ctx); err != nil {
		return err
	}
	if err := r.commit(ctx, store, a.mark, committed, end); err != nil {
		return err
	}
	if err := aggregator.CutOver(ctx, r.Redis, r.Prefix, state); err != nil {
		return fmt.Errorf("%w; run the rebuild again", err)
	}
	r.Log.Info("rebuilt", zap.String("namespace", state.Namespace), zap.Int("messages", a.total),
		zap.Int("aggregates", len(a.touched)), zap.Int("suites", len(a.touchedSuites)),
		zap.Int("revived_published", a.revived), zap.Int("abnormal_published", a.abnormal))
	return nil
}

// applier replays the input topics into a namespace's stores.
type applier struct {
	*Rebuild
	st Stores
	// start is the rebuild's start, the latest receipt time it trusts (see replay).
	start     time.Time
	committed map[string]map[int]int64

	touched           map[aggregator.Key]bool
	touchedSuites     map[suite.Key]bool
	total             int
	revived, abnormal int
	mark              int64
}

// replay applies every input message below end, partition by partition.
//
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
func (a *applier) replay(ctx context.Context, end map[string]map[int]int64) error {
	// Progress: offsets read of the end offsets noted above.
	var endSum, doneBefore int64
	for _, parts := range end {
		for _, last := range parts {
			endSum += last
		}
	}
	progress := func(events, done int64) {
		if a.Progress != nil {
			a.Progress(events, done, endSum)
		}
	}
	progress(0, 0)
	for topic, parts := range end {
		for part, last := range parts {
			from, seen := a.committed[topic][part]
			inPart := 0
			n, err := a.Kafka.Read(ctx, topic, part, last, batchSize, func(batch []kafka.Message) error {
				if err := a.apply(ctx, batch, func(offset int64) bool { return !seen || offset >= from }); err != nil {
					return err
				}
				inPart += len(batch)
				progress(int64(a.total+inPart), doneBefore+batch[len(batch)-1].Offset+1)
				return nil
			})
			if err != nil {
				return fmt.Errorf("rebuild %s/%d: %w; run the rebuild again", topic, part, err)
			}
			a.total += n
			doneBefore += last
			progress(int64(a.total), doneBefore)
		}
	}
	return nil
}

// apply applies one batch of one partition's messages; unseen says whether the processor may not
// have published the outputs of the message at an offset (it is at or past the committed offset).
func (a *applier) apply(ctx context.Context, batch []kafka.Message, unseenAt func(int64) bool) error {
	var obs []aggregator.Observation
	var runs, unseen []suite.RunObservation
	var dls []consumer.DeadLetter
	now := time.Now()
	for i := range batch {
		recv := a.start
		if t := batch[i].Time; !t.IsZero() && t.Before(a.start) {
			recv = t
		}
		ev, err := a.st.Decoder.Decode(&batch[i], recv)
		if err != nil {
			var ie *schemas.InvalidError
			if errors.As(err, &ie) {
				dls = append(dls, consumer.DeadLetter{Message: batch[i], Reason: ie.Reason, Detail: ie.Detail})
			}
			continue
		}
		if o, ok := ev.Observation(); ok {
			obs = append(obs, o)
			a.touched[o.Key] = true
		}
		if ev.Eval != nil {
			run := suite.FromEvalRun(ev.Eval, a.st.SuiteConfig.ReplyMode)
			runs = append(runs, run)
			a.touchedSuites[run.Key.Key] = true
			if unseenAt(batch[i].Offset) {
				unseen = append(unseen, run)
			}
		}
	}
	if err := a.DeadLetters.Send(ctx, dls); err != nil {
		return err
	}
	if len(obs) > 0 {
		if _, err := a.st.Rates.Apply(ctx, obs, now); err != nil {
			return err
		}
	}
	if len(runs) > 0 {
		applied, err := a.st.Suites.Apply(ctx, runs, now)
		if err != nil {
			return err
		}
		// The alerts these runs raise, as the processor raises them batch by batch: every
		// revived case (the new namespace has announced none; the events' ids are
		// deterministic, so one the processor published before is a recognisable copy), and
		// the abnormal samples of the runs past the committed offsets, whose alerts the
		// processor may not have published. Published before they are marked announced, as
		// the processor does.
		out := suite.BuildOutput(applied, unseen, a.st.SuiteConfig, now)
		alerts := suite.Output{Revived: out.Revived, Abnormal: out.Abnormal}
		if err := a.Publisher.PublishSuites(ctx, alerts, now); err != nil {
			return err
		}
		if err := markAnnounced(ctx, a.st.Suites, out.Revived); err != nil {
			return err
		}
		a.revived += len(out.Revived)
		a.abnormal += len(out.Abnormal)
	}
	// A Redis that lost writes of an earlier batch fails here or in the next apply.
	var err error
	a.mark, err = a.st.Rates.Seal(ctx, nil)
	return err
}

// publish publishes the rebuilt snapshots and suite snapshots of everything the replay touched.
func (a *applier) publish(ctx context.Context) error {
	now := time.Now()
	var snaps []schemas.Snapshot
	for k := range a.touched {
		t, err := a.st.Rates.Tally(ctx, k, now)
		if err != nil {
			return err
		}
		snaps = append(snaps, t.Snapshot(k, now))
	}
	if err := a.Publisher.Publish(ctx, snaps); err != nil {
		return err
	}
	for k := range a.touchedSuites {
		sum, err := a.st.Suites.Read(ctx, k, now)
		if err != nil {
			return err
		}
		out := suite.BuildOutput(suite.Applied{Suites: []suite.Key{k}, Summaries: map[suite.Key]*suite.Summary{k: sum}}, nil, a.st.SuiteConfig, now)
		out.Revived = nil // announced batch by batch in apply
		if err := a.Publisher.PublishSuites(ctx, out, now); err != nil {
			return err
		}
	}
	return nil
}

// commit makes the rebuilt state durable and commits the group's offsets at end.
//
// Durable before committed, as the processor holds its offsets: wait out the commit delay (AOF
// everysec syncs once a second), then check that Redis still holds the last batch mark, which
// stands for every write before it (CutOver then checks that the new namespace kept its epoch).
// The offsets about to be committed are recorded beside the rebuilt state, as the processor
// records its commits, so a later loss of the rebuilt state is caught too. With replicas to wait
// for, replicas that lag behind the bulk of rebuilt writes are waited for up to ReplicaWait; a
// loss or any other failure ends the rebuild at once.
func (r *Rebuild) commit(ctx context.Context, store *aggregator.Redis, mark int64, committed, end map[string]map[int]int64) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.CommitDelay):
	}
	for waited := time.Duration(0); ; waited += time.Second {
		err := store.Verify(ctx, mark, end)
		if err == nil {
			break
		}
		if !errors.Is(err, aggregator.ErrReplicasBehind) || waited >= r.ReplicaWait {
			return fmt.Errorf("rebuild: %w; run the rebuild again", err)
		}
		r.Log.Warn("rebuilt state not yet on enough replicas; waiting", zap.Error(err))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	// A processor that joined after the first check and committed meanwhile published from the
	// old state, beyond what the versions were seeded from: start over rather than guess.
	again, err := r.Kafka.Committed(ctx, r.Group, r.Inputs)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(again, committed) {
		return fmt.Errorf("group %s committed offsets during the rebuild (%v, then %v): stop every processor and run the rebuild again",
			r.Group, committed, again)
	}
	// Commit, then cut over (see Run for the order). The broker accepts a commit without a
	// generation only while the group has no member, so a processor that joined meanwhile makes
	// this step fail rather than race it.
	if err := r.Kafka.Commit(ctx, r.Group, end); err != nil {
		return fmt.Errorf("commit rebuilt offsets: %w; run the rebuild again", err)
	}
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
