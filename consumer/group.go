package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

// Handler processes batches for the group in three stages, which the group overlaps across
// batches; *Processor is one. Each stage is called by one goroutine at a time; batches pass Apply
// and Publish one at a time, in the order they were prepared.
type Handler interface {
	// Prepare decodes a batch; it reads and writes nothing outside the process. msgs stays the
	// group's: a handler must not read or keep it once the batch's Publish returned, since the
	// group fills the same slice with a later batch (copy what must outlive it).
	Prepare(msgs []kafka.Message) (*Batch, error)
	// Apply writes a prepared batch durably and seals it (Batch.Mark names its work).
	Apply(ctx context.Context, b *Batch) error
	// Publish gets an applied batch's outputs acknowledged; a nil return lets its offsets be
	// committed once Verify confirms that its work is still held.
	Publish(ctx context.Context, b *Batch) error
	// Verify confirms, right before offsets are queued for commit, that the work of every batch up to
	// mark is still held, and records offsets as about to be committed: ErrRewind when recent work
	// was lost (consume again from the committed offsets), ErrFatal when work whose offsets may be
	// committed was lost. The group calls it from the goroutine that calls Apply, never between a
	// failed Apply and the end of the generation.
	Verify(ctx context.Context, mark int64, offsets map[string]map[int]int64) error
	// CheckOffsets confirms, when a generation assigns partitions, that the work of every offset
	// the group committed on them is still held; ErrFatal when it is not.
	CheckOffsets(ctx context.Context, committed map[string]map[int]int64) error
}

// GroupConfig configures a Group.
type GroupConfig struct {
	Brokers []string
	GroupID string
	Topics  []string
	Dialer  *kafka.Dialer // TLS and SASL; nil for plaintext

	// MaxBatch, MaxBatchBytes and Linger bound a batch: it is processed when it holds MaxBatch
	// messages, when its keys, values and headers reach MaxBatchBytes, or Linger after its first
	// message arrived, whichever comes first; but while a batch collected earlier is still ahead
	// of the apply stage (being decoded, or decoded and waiting for Redis), the one being collected
	// keeps growing past Linger (it could not be applied sooner).
	// Large batches under load spread each Redis call's fixed cost over more events; Linger keeps
	// them small, and latency low, when traffic is light.
	MaxBatch      int
	MaxBatchBytes int
	Linger        time.Duration
	// DrainTimeout bounds each stage of a batch, its apply and its publish, from the moment that
	// stage began (a batch waiting for the publishes before it does not spend its own time), and
	// it is what the batches in flight get, together, to finish once shutdown or a rebalance
	// begins.
	DrainTimeout time.Duration
	// MaxInFlight bounds the batches between the first message of their collection and the end of
	// their publish: with 1 the stages of a batch run one after another and the next batch is
	// collected only then; with 2 or more, the next batch is decoded while Redis applies this
	// one, and applied while this one is published (docs/semantics.md#delivery). Default 4: one
	// batch being collected, one decoded, one applied, one published, so that the next batch is ready when Redis
	// finishes this one even while a publish is slow (with 3, the applying goroutine waited for a
	// prepared batch about a tenth of the time under full load; BENCHMARKS.md).
	MaxInFlight int
	// CommitDelay holds a batch's offsets back until its Redis writes are durable: at least the
	// AOF fsync interval (everysec: one second). Zero commits at once.
	CommitDelay time.Duration

	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration
}

// Batch bounds by default (GroupConfig.MaxBatch, MaxBatchBytes): at 16 000 messages the fixed
// cost of each aggregate's Redis script call is spread over many events of a busy stream
// (BENCHMARKS.md); 32 MiB bounds the memory of a batch of large messages.
const (
	DefaultMaxBatch      = 16000
	DefaultMaxBatchBytes = 32 << 20
)

// DefaultMaxInFlight is GroupConfig.MaxInFlight by default: a batch applying, one publishing, and
// two collected and decoded ahead (docs/semantics.md#delivery).
const DefaultMaxInFlight = 4

// Validate checks the configuration and fills defaults.
func (c *GroupConfig) Validate() error {
	if len(c.Brokers) == 0 || c.GroupID == "" || len(c.Topics) == 0 {
		return errors.New("consumer group needs brokers, a group id and topics")
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.MaxBatchBytes <= 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.Linger <= 0 {
		c.Linger = 20 * time.Millisecond
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.RebalanceTimeout <= 0 {
		c.RebalanceTimeout = 30 * time.Second
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = 2 * time.Second
	}
	return nil
}

// Group consumes the input topics in a Kafka consumer group. It uses kafka-go's ConsumerGroup API
// rather than a group Reader so that it sees every generation end: the batches in flight are
// finished and committed under the generation that fetched them, and nothing of an old generation
// runs when a new one starts. Offsets are committed after the handler published a batch and cover
// exactly the messages of the batches published so far, in order; each partition's messages arrive
// in order, so that is a contiguous prefix.
type Group struct {
	cfg     GroupConfig
	handler Handler
	log     *zap.Logger
	metrics *Metrics
	fatal   func(error) // stops Run with a fatal handler error
}

// NewGroup returns a consumer group runner.
func NewGroup(cfg GroupConfig, h Handler, log *zap.Logger, m *Metrics) (*Group, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Group{cfg: cfg, handler: h, log: log, metrics: m}, nil
}

// Run consumes until ctx ends, then finishes and commits the batch in hand, leaves the group and
// returns nil. It returns an error only when the group cannot be created.
func (g *Group) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g.fatal = func(err error) { cancel(err) }
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                g.cfg.GroupID,
		Brokers:           g.cfg.Brokers,
		Dialer:            g.cfg.Dialer,
		Topics:            g.cfg.Topics,
		StartOffset:       kafka.FirstOffset,
		SessionTimeout:    g.cfg.SessionTimeout,
		RebalanceTimeout:  g.cfg.RebalanceTimeout,
		HeartbeatInterval: g.cfg.HeartbeatInterval,
		JoinGroupBackoff:  time.Second,
		ErrorLogger:       kafka.LoggerFunc(func(f string, a ...any) { g.log.Warn("kafka group", zap.String("detail", fmt.Sprintf(f, a...))) }),
	})
	if err != nil {
		return fmt.Errorf("consumer group %s: %w", g.cfg.GroupID, err)
	}
	defer cg.Close()
	for {
		gen, err := cg.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				return fatalCause(ctx)
			}
			g.log.Warn("join group failed, retrying", zap.Error(err))
			select {
			case <-ctx.Done():
				return fatalCause(ctx)
			case <-time.After(time.Second):
			}
			continue
		}
		g.log.Info("generation started", zap.Int32("generation", gen.ID), zap.String("member", gen.MemberID),
			zap.Int("partitions", countPartitions(gen)))
		g.runGeneration(ctx, gen)
	}
}

// fatalCause returns the fatal error that ended ctx, or nil for an ordinary shutdown.
func fatalCause(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrFatal) {
		return cause
	}
	return nil
}

func countPartitions(gen *kafka.Generation) int {
	n := 0
	for _, as := range gen.Assignments {
		n += len(as)
	}
	return n
}

// runGeneration starts one fetcher per assigned partition and one batch loop, all owned by gen:
// kafka-go waits for every one of them to return before the member joins the next generation.
func (g *Group) runGeneration(ctx context.Context, gen *kafka.Generation) {
	// Before consuming from the committed offsets, make sure the work they stand for is held: a
	// Redis that came back with less than the group committed would otherwise be built on silently.
	committed := make(map[string]map[int]int64)
	for topic, assigned := range gen.Assignments {
		committed[topic] = make(map[int]int64, len(assigned))
		for _, a := range assigned {
			committed[topic][a.ID] = a.Offset
		}
	}
	for {
		cctx, cancel := context.WithTimeout(ctx, g.cfg.DrainTimeout)
		err := g.handler.CheckOffsets(cctx, committed)
		cancel()
		if err == nil {
			break
		}
		if errors.Is(err, ErrFatal) {
			g.log.Error("committed offsets are past the work redis holds; stopping", zap.Int32("generation", gen.ID), zap.Error(err))
			g.fatal(err)
			return
		}
		// Not checked is not consumed: wait for Redis rather than build on what it may have lost.
		g.log.Warn("cannot check committed offsets against redis, retrying", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
	// Bounded: fetchers block when the batch loop is busy, which is the back-pressure we want.
	msgs := make(chan kafka.Message, g.cfg.MaxBatch)
	for topic, assigned := range gen.Assignments {
		for _, a := range assigned {
			topic, a := topic, a
			gen.Start(func(gctx context.Context) { g.fetch(gctx, topic, a, msgs) })
		}
	}
	gen.Start(func(gctx context.Context) { g.consume(ctx, gctx, gen.ID, gen, msgs) })
}

// consume runs the generation's batch loop, then settles its output writes before the member may
// rejoin.
func (g *Group) consume(ctx, gctx context.Context, genID int32, gen committer, msgs <-chan kafka.Message) {
	// When the generation ended (a rebalance began): the group waits RebalanceTimeout from then
	// for this member, the drain included.
	ended := make(chan time.Time, 1)
	stop := context.AfterFunc(gctx, func() { ended <- time.Now() })
	defer stop()
	g.batches(ctx, gctx, genID, gen, msgs)
	from := time.Now() // the batch loop ended on its own: the generation ends now
	select {
	case from = <-ended:
	default:
	}
	g.settle(genID, from)
}

// settler is a Handler whose output writes can outlive the publish that started them (a stage
// timeout stops the wait, not kafka-go's write): Processor, on sink.Kafka.
type settler interface {
	Settle(ctx context.Context) error
}

// settle waits, before the member rejoins and its partitions go to another, until every output
// write of the generation has ended: a snapshot whose publish timed out would otherwise land after
// the new owner's newer one, and compaction keep the older. The wait ends half the rebalance
// timeout after the generation ended (from, before the drain), within the time the group waits
// for this member; writes still running then are logged and counted
// (repeatrate_unsettled_handovers_total).
func (g *Group) settle(genID int32, from time.Time) {
	s, ok := g.handler.(settler)
	if !ok {
		return
	}
	ctx, cancel := context.WithDeadline(context.Background(), from.Add(g.cfg.RebalanceTimeout/2))
	defer cancel()
	if err := s.Settle(ctx); err != nil {
		g.metrics.UnsettledHandovers.Inc()
		g.log.Error("output writes still running as the partitions are handed over: a snapshot may land after the next owner's",
			zap.Int32("generation", genID), zap.Error(err))
	}
}

func (g *Group) fetch(gctx context.Context, topic string, a kafka.PartitionAssignment, out chan<- kafka.Message) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   g.cfg.Brokers,
		Dialer:    g.cfg.Dialer,
		Topic:     topic,
		Partition: a.ID,
		MinBytes:  1,
		MaxBytes:  16 << 20,
		MaxWait:   250 * time.Millisecond,
		ErrorLogger: kafka.LoggerFunc(func(f string, args ...any) {
			detail := fmt.Sprintf(f, args...)
			level := zap.WarnLevel
			if idleReadTimeout(detail) {
				level = zap.DebugLevel
			}
			g.log.Log(level, "kafka reader", zap.String("topic", topic), zap.Int("partition", a.ID), zap.String("detail", detail))
		}),
	})
	defer r.Close()
	if err := r.SetOffset(a.Offset); err != nil {
		g.log.Error("set offset", zap.String("topic", topic), zap.Int("partition", a.ID), zap.Int64("offset", a.Offset), zap.Error(err))
		return
	}
	for {
		m, err := r.FetchMessage(gctx)
		if err != nil {
			if gctx.Err() == nil {
				g.log.Warn("fetch failed; ending generation", zap.String("topic", topic), zap.Int("partition", a.ID), zap.Error(err))
			}
			return
		}
		select {
		case out <- m:
		case <-gctx.Done():
			return
		}
	}
}

// idleReadTimeout reports whether a kafka-go reader error is the timeout of a long-poll fetch that
// found nothing (seen against some brokers, franz-go's kfake among them): a quiet partition, not a
// problem worth a warning.
func idleReadTimeout(detail string) bool {
	return strings.Contains(detail, "i/o timeout") && strings.Contains(detail, "unknown error reading partition")
}

// ErrFatal marks a handler error that no retry or redelivery can fix (Redis state lost, say): the
// group stops and Run returns it.
var ErrFatal = errors.New("fatal")

// ErrRewind marks a handler error that requires consuming again from the committed offsets: the
// generation ends without committing anything pending, and the member rejoins.
var ErrRewind = errors.New("rewind to committed offsets")

// ErrNotYet marks a Verify error that only delays the commit: the work is held, but not yet as
// durable as configured (replicas behind, say). The batches stay pending and the commit is tried
// again; nothing is consumed again.
var ErrNotYet = errors.New("not durable yet")

// notYetRetry is the least time between two tries of a commit that Verify answered with ErrNotYet;
// CommitDelay when longer.
const notYetRetry = time.Second

// pendingCommit is a processed batch whose offsets wait for its Redis writes to become durable.
type pendingCommit struct {
	offsets map[string]map[int]int64
	mark    int64 // the handler's mark of the batch
	ready   time.Time
}

// committer commits offsets under one generation; *kafka.Generation is one.
type committer interface {
	CommitOffsets(offsets map[string]map[int]int64) error
}

// flight is one batch in the pipeline, from its first message until it is published.
type flight struct {
	msgs  []kafka.Message
	start time.Time // its first message was taken
	// queued is when it was handed to the next stage (collected, prepared, then applied): what it
	// waits there is observed as the stage "queued_prepare", "queued_apply" or "queued_publish".
	queued time.Time
	batch  *Batch
	// offsets are the batch's next offsets per partition and mark its batch mark, taken once
	// it was published; its messages and batch are then let go (the messages to collect).
	offsets map[string]map[int]int64
	mark    int64
	// full says the batch closed at MaxBatch or MaxBatchBytes (input was waiting): publish gives
	// its place back (retire); the applying goroutine gives back the others' when it takes them.
	full bool
}

// batches collects, handles and commits batches until the generation or ctx ends, in a pipeline
// of four goroutines and a timer, all owned by this call and ended before it returns:
//
//   - collect takes messages into batches (MaxBatch, MaxBatchBytes, Linger);
//   - prepare decodes them (Prepare), one at a time in order, while the next is collected;
//   - this goroutine applies them to Redis (Apply), one at a time in order, and commits;
//   - publish gets their outputs acknowledged (Publish), one at a time in order;
//   - the drain timer cancels what is still in flight DrainTimeout after the generation or ctx
//     ended (each stage also has DrainTimeout from its own start).
//
// At most MaxInFlight batches are between their first message and the end of their publish; a
// batch takes its place before its first message and gives it back when published if it is full,
// or else once this goroutine took it from publish, so the queues are bounded and, when all
// places are taken, the fetchers wait. A batch that is being
// collected when the generation or ctx ends is still handled, and so are the batches in flight (a
// drain, DrainTimeout in all). Offsets are committed CommitDelay after their batch was published, so that Redis has
// fsynced the writes they stand for (AOF everysec syncs once a second), after Verify confirmed the
// batch mark; commits still pending when the loop ends are made before it returns. When any stage
// fails, nothing pending or in flight is committed: every goroutine stops, and the generation ends
// so that those batches are consumed again from the committed offsets.
//
// Why Redis may apply batch N+1 before N is published (docs/semantics.md#delivery):
//   - outputs are computed in Apply, from the state Apply read after checking the previous batch
//     mark, and carried with the batch; publishing them later publishes what publishing at once
//     would have, and nothing computed after a loss is published, since that batch's Apply fails;
//   - Apply and Publish each take batches one at a time in batch order, so an aggregate's
//     snapshots (and a suite's) reach Kafka in version order: N+1's snapshot of K is sent only
//     after N's was acknowledged;
//   - a batch is sealed in Apply, after its writes; the mark that Verify checks before a commit is
//     the newest one sealed, which proves every write before it, so it still vouches for the
//     batch committed. Verify runs on this goroutine, between Applies, and never after one failed;
//   - a batch that announces revived cases is a barrier (Batch.Barrier): the next batch's Apply
//     waits until it was published and its cases marked announced, or they would be announced
//     twice.
func (g *Group) batches(ctx, gctx context.Context, genID int32, gen committer, in <-chan kafka.Message) {
	// Stages run on in the drain after gctx or ctx ended; base ends only when the pipeline stops.
	base, abort := context.WithCancelCause(context.WithoutCancel(gctx))
	defer abort(nil)
	eg, ectx := errgroup.WithContext(base)
	// Each stage of a batch has DrainTimeout from its own start (stageCtx); once gctx or ctx ends,
	// what is in flight has DrainTimeout in all (dctx).
	dctx, drained := context.WithCancel(ectx)
	defer drained()
	eg.Go(func() error {
		select {
		case <-gctx.Done():
		case <-ctx.Done():
		case <-ectx.Done():
			return nil
		}
		t := time.NewTimer(g.cfg.DrainTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			drained()
		case <-ectx.Done():
		}
		return nil
	})
	stageCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(dctx, g.cfg.DrainTimeout)
	}
	slots := make(chan struct{}, g.cfg.MaxInFlight)
	defer g.metrics.InFlight.Set(0) // on every way out: nothing is in flight once this returns
	// prepared and applied hold at most MaxInFlight batches, one per place: sends there never
	// block. published can hold more (a full batch gives its place back before this goroutine
	// takes it), so publish's sends also watch ectx.
	prepared := make(chan *flight, g.cfg.MaxInFlight)
	applied := make(chan *flight, g.cfg.MaxInFlight)
	published := make(chan *flight, g.cfg.MaxInFlight)
	// taken tells collect that the apply stage took a prepared batch: a batch past its linger
	// waits for that (collect) without polling. ahead counts the batches collected and not yet
	// taken by the apply stage (being decoded, or decoded and waiting).
	taken := make(chan struct{}, 1)
	var ahead atomic.Int32
	// Collected batches go to the decoding goroutine: the next batch is collected while one is
	// decoded (with decoding on the collecting goroutine, the first message of the next batch
	// waited for it in the fetch queue). A batch holds a place, so this never holds more than
	// MaxInFlight.
	closed := make(chan *flight, g.cfg.MaxInFlight)
	// The message slices of published batches, for collect to fill again: grown by append, a
	// batch of 15 000 messages copied ≈ 4 MB, a tenth of the processor's CPU on the bench.
	spare := make(chan []kafka.Message, g.cfg.MaxInFlight)
	eg.Go(func() error {
		defer close(closed)
		return g.collect(ctx, gctx, ectx, in, slots, closed, &ahead, taken, spare)
	})
	eg.Go(func() error {
		defer close(prepared)
		return g.prepare(ectx, closed, prepared)
	})
	eg.Go(func() error {
		defer close(published)
		return g.publish(ectx, stageCtx, applied, published, slots, spare)
	})

	// Verified offsets go to Kafka on a goroutine of their own; every one queued is sent before
	// this call returns (kafka-go waits for it before the member leaves the generation), unless
	// a failure abandoned them.
	commits := g.startCommits(genID, gen)
	defer commits.close()
	var pending []pendingCommit
	var barrier *flight // an applied batch the next Apply waits for (Batch.Barrier)
	failed := func(err error) {
		// Nothing pending is committed: those batches are consumed again, idempotently. Nor,
		// after a loss of verified work, anything queued and not yet sent (lostVerified).
		pending = nil
		lostVerified(commits, err)
		g.metrics.Rewinds.WithLabelValues(rewindReason(err)).Inc()
		g.log.Error("batch not processed; it and every batch in flight will be redelivered", zap.Int32("generation", genID), zap.Error(err))
		if errors.Is(err, ErrFatal) {
			g.fatal(err)
		}
	}
	stopped := false // the pipeline stopped early: in flight is dropped, pending commits are made
	// retired takes a published batch back: its place, if it still holds one, and its offsets
	// for commit. False ends the loop.
	retired := func(f *flight, ok bool) bool {
		if !ok || ectx.Err() != nil {
			// A stage failed meanwhile (or the pipeline stopped): nothing more is taken for
			// commit, even a batch published before the failure (it is consumed again).
			return false
		}
		if !f.full {
			<-slots
			g.metrics.InFlight.Dec()
		}
		if barrier == f {
			barrier = nil
		}
		pending = append(pending, pendingCommit{offsets: f.offsets, mark: f.mark, ready: time.Now().Add(g.cfg.CommitDelay)})
		if !g.commitPending(genID, commits, &pending, false) {
			stopped = true
			return false
		}
		return true
	}
	next := prepared
loop:
	for {
		// Published batches first: Go's select chooses among ready cases at random, and a place
		// not taken back before the next apply was held through it, keeping the batch after
		// next from being collected for a whole apply (queued_collect).
		select {
		case f, ok := <-published:
			if !retired(f, ok) {
				break loop
			}
			continue
		default:
		}
		var due <-chan time.Time
		if len(pending) > 0 {
			due = time.After(time.Until(pending[0].ready))
		}
		take := next
		if barrier != nil {
			take = nil
		}
		select {
		case f, ok := <-take:
			if !ok {
				// Collected and drained: what is in flight is published, then the loop ends.
				next = nil
				close(applied)
				continue
			}
			ahead.Add(-1)
			select {
			case taken <- struct{}{}:
			default: // a signal not yet seen says the same
			}
			actx, cancel := stageCtx()
			began := time.Now()
			g.metrics.StageSeconds.WithLabelValues("queued_apply").Observe(began.Sub(f.queued).Seconds())
			err := g.handler.Apply(actx, f.batch)
			cancel()
			if err != nil {
				err = fmt.Errorf("apply %d messages: %w", len(f.msgs), err)
				// At once, before the other stages are waited for: the committing goroutine
				// would send what is queued meanwhile.
				lostVerified(commits, err)
				abort(err)
				// Cancelled because another stage failed first: that stage's error is the cause,
				// unless this one says more (a loss).
				if werr := eg.Wait(); werr != nil && !errors.Is(err, ErrFatal) && !errors.Is(err, ErrRewind) {
					err = werr
				}
				failed(err)
				return
			}
			g.metrics.StageSeconds.WithLabelValues("apply").Observe(time.Since(began).Seconds())
			if f.batch.Barrier() {
				barrier = f
			}
			f.queued = time.Now()
			applied <- f
		case f, ok := <-published:
			if !retired(f, ok) {
				break loop
			}
		case <-due:
			if ectx.Err() != nil {
				break loop
			}
			if !g.commitPending(genID, commits, &pending, false) {
				stopped = true
				break loop
			}
		case <-commits.failed:
			stopped = true
			break loop
		case <-ectx.Done():
			break loop
		}
	}
	// Every goroutine of the pipeline ends before the generation may: a batch still in flight
	// now is dropped, never committed, and consumed again.
	abort(errPipelineStopped)
	if err := eg.Wait(); err != nil && !stopped {
		failed(err)
		return
	}
	g.commitPending(genID, commits, &pending, true)
}

// batchBytes is what m counts toward MaxBatchBytes: its key, value and headers.
func batchBytes(m *kafka.Message) int {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// errPipelineStopped ends the stages once the batch loop stops.
var errPipelineStopped = errors.New("batch pipeline stopped")

// collect takes messages from in into batches and sends them to out, each after taking a place in
// slots, until the generation or ctx ends (the batch being collected is still sent) or the
// pipeline stops. A batch past its linger while one before it is still ahead of the apply stage
// (ahead: collected, not yet taken) keeps filling until taken says the apply stage took that
// one. A batch is collected into a slice from spare when there is one.
func (g *Group) collect(ctx, gctx, ectx context.Context, in <-chan kafka.Message, slots chan<- struct{}, out chan<- *flight,
	ahead *atomic.Int32, taken <-chan struct{}, spare <-chan []kafka.Message) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	last := 0 // the size of the batch before
	for {
		// The place first: with MaxInFlight 1 nothing of the next batch is taken before the
		// previous one was published, as in a loop without overlap.
		waited := time.Now()
		select {
		case slots <- struct{}{}:
		case <-ectx.Done():
			return nil
		case <-gctx.Done():
			return nil
		case <-ctx.Done():
			return nil
		}
		g.metrics.InFlight.Inc()
		g.metrics.StageSeconds.WithLabelValues("queued_collect").Observe(time.Since(waited).Seconds())
		// Grown as messages come: a light stream's batches stay small. A slice smaller than the
		// batch before is grown to it at once: grown by append a quarter at a time, a batch of
		// 3 000 was copied over and over (2.5–6 % of the processor's CPU at half load).
		var batch []kafka.Message
		select {
		case batch = <-spare:
		default:
			batch = make([]kafka.Message, 0, min(g.cfg.MaxBatch, 256))
		}
		if want := min(g.cfg.MaxBatch, last+last/4); cap(batch) < want {
			batch = slices.Grow(batch, want)
		}
		size := 0
		select {
		case m := <-in:
			batch = append(batch, m)
			size += batchBytes(&m)
		case <-ectx.Done():
			return nil
		case <-gctx.Done():
			return nil
		case <-ctx.Done():
			return nil
		}
		start := time.Now()
		timer.Reset(g.cfg.Linger)
		stopping, lingered := false, false
	fill:
		for len(batch) < g.cfg.MaxBatch && size < g.cfg.MaxBatchBytes {
			select {
			case m := <-in:
				batch = append(batch, m)
				size += batchBytes(&m)
			case <-timer.C:
				if ahead.Load() == 0 {
					break fill
				}
				// A batch before this one is still being decoded or waits for Redis: this one
				// keeps filling until that one is taken, and is decoded while it applies.
				lingered = true
			case <-taken:
				if lingered && ahead.Load() == 0 {
					break fill
				}
			case <-ectx.Done():
				return nil
			case <-gctx.Done():
				stopping = true
				break fill
			case <-ctx.Done():
				stopping = true
				break fill
			}
		}
		timer.Stop()
		now := time.Now()
		g.metrics.StageSeconds.WithLabelValues("collect").Observe(now.Sub(start).Seconds())
		if t := batch[0].Time; !t.IsZero() {
			// Against the producer's clock (CreateTime topics): a clock ahead reads as 0.
			g.metrics.StageSeconds.WithLabelValues("input").Observe(max(0, start.Sub(t).Seconds()))
		}
		last = len(batch)
		ahead.Add(1)
		out <- &flight{msgs: batch, start: start, queued: now, full: len(batch) >= g.cfg.MaxBatch || size >= g.cfg.MaxBatchBytes}
		if stopping {
			return nil
		}
	}
}

// prepare decodes the collected batches of in (Prepare), one at a time in order, and sends them to
// out, until in is closed or the pipeline stops.
func (g *Group) prepare(ectx context.Context, in <-chan *flight, out chan<- *flight) error {
	for {
		select {
		case f, ok := <-in:
			if !ok {
				return nil
			}
			if ectx.Err() != nil {
				return nil // stopped meanwhile: what is left is consumed again, not decoded
			}
			began := time.Now()
			g.metrics.StageSeconds.WithLabelValues("queued_prepare").Observe(began.Sub(f.queued).Seconds())
			b, err := g.handler.Prepare(f.msgs)
			if err != nil {
				return fmt.Errorf("prepare %d messages: %w", len(f.msgs), err)
			}
			f.batch, f.queued = b, time.Now()
			g.metrics.StageSeconds.WithLabelValues("prepare").Observe(f.queued.Sub(began).Seconds())
			out <- f // out holds MaxInFlight, and every batch holds a place: never blocks
		case <-ectx.Done():
			return nil
		}
	}
}

// publish publishes applied batches one at a time, in order, until in is closed or the pipeline
// stops.
//
// A full batch's place is given back here, not when the goroutine that applies batches takes it:
// that goroutine waits for Redis for most of a batch, and a place it held that long kept the batch
// after next from being collected and decoded while input was waiting, so that Redis then waited
// for it.
// A batch its linger closed keeps its place until then: under light load that holds the next
// batch back, so that messages gather in fewer batches, each paying Redis's per-call cost once
// (given back here too, p50 at half load rose by about 30 ms and p99 by 30–170 ms; BENCHMARKS.md).
func (g *Group) publish(ectx context.Context, stageCtx func() (context.Context, context.CancelFunc), in <-chan *flight, out chan<- *flight,
	slots <-chan struct{}, spare chan<- []kafka.Message) error {
	for {
		select {
		case f, ok := <-in:
			if !ok {
				return nil
			}
			pctx, cancel := stageCtx()
			began := time.Now()
			g.metrics.StageSeconds.WithLabelValues("queued_publish").Observe(began.Sub(f.queued).Seconds())
			err := g.handler.Publish(pctx, f.batch)
			cancel()
			if err != nil {
				if ectx.Err() != nil {
					return nil // stopped by another stage, whose error is reported
				}
				return fmt.Errorf("publish %d messages: %w", len(f.msgs), err)
			}
			g.metrics.StageSeconds.WithLabelValues("publish").Observe(time.Since(began).Seconds())
			g.retire(f, slots, spare)
			// out holds MaxInFlight; more can be published before the applying goroutine takes
			// them, and that goroutine may have stopped.
			select {
			case out <- f:
			case <-ectx.Done():
				return nil
			}
		case <-ectx.Done():
			return nil
		}
	}
}

// retire keeps what the applying goroutine still needs of a published batch (its offsets and
// mark), hands its message slice back to collect and, when the batch is full, gives its place
// back.
func (g *Group) retire(f *flight, slots <-chan struct{}, spare chan<- []kafka.Message) {
	f.offsets, f.mark = g.done(f), f.batch.Mark()
	// Nothing reads the batch's messages any more (its dead letters were copied, its observations
	// hold their own strings). Cleared first (2.4 MB for 16 000 messages, a tenth of a
	// millisecond): a slice waiting in spare must not keep the batch's values alive, which
	// GOGC=400 would make five times as much peak memory.
	clear(f.msgs)
	select {
	case spare <- f.msgs[:0]:
	default:
	}
	f.msgs, f.batch = nil, nil
	if f.full {
		<-slots
		g.metrics.InFlight.Dec()
	}
}

// commitPending queues for commit the offsets of every pending batch that is ready (all of them,
// after waiting, when final), once the handler confirmed that their work is still held; false
// means the generation is over. A loss found then drops every pending batch (they are consumed
// again) or, when it reaches committed work, stops the group. It runs on the goroutine that calls
// Apply.
func (g *Group) commitPending(genID int32, commits *offsetCommits, pending *[]pendingCommit, final bool) bool {
	if commits.hasFailed() {
		// The generation is over: no commit would be sent, so none is waited for or verified.
		*pending = nil
		return false
	}
	ps := *pending
	n := 0
	for n < len(ps) && (final || !ps[n].ready.After(time.Now())) {
		n++
	}
	if n == 0 {
		return true
	}
	if wait := time.Until(ps[n-1].ready); final && wait > 0 {
		time.Sleep(min(wait, g.cfg.DrainTimeout))
	}
	merged := make(map[string]map[int]int64)
	for _, p := range ps[:n] {
		mergeOffsets(merged, p.offsets)
	}
	// Timed as the "commit" stage: it runs between two Applies, so its time delays the next batch.
	// The Kafka commit itself does not ("commit_kafka", offsetCommits).
	began := time.Now()
	defer func() { g.metrics.StageSeconds.WithLabelValues("commit").Observe(time.Since(began).Seconds()) }()
	vctx, cancel := context.WithTimeout(context.Background(), g.cfg.DrainTimeout)
	err := g.handler.Verify(vctx, ps[n-1].mark, merged)
	cancel()
	if errors.Is(err, ErrNotYet) {
		g.metrics.Commits.WithLabelValues("waiting").Inc()
		g.log.Warn("commit waits: the work is not yet as durable as configured", zap.Int32("generation", genID),
			zap.Int("pending_batches", len(ps)), zap.Error(err))
		// Tried again notYetRetry from now, not at once: each try may block this loop, which also
		// applies, for the store's whole wait (Redis WAIT's timeout), or come back at once; tried
		// after every batch and whenever due, the apply loop would keep one batch per try, or spin.
		// The batches tried become one, so that pending stays small however long commits wait.
		ps[n-1] = pendingCommit{offsets: merged, mark: ps[n-1].mark, ready: time.Now().Add(max(g.cfg.CommitDelay, notYetRetry))}
		*pending = ps[n-1:]
		return true
	}
	if err != nil {
		g.metrics.Commits.WithLabelValues("unverified").Inc()
		g.metrics.Rewinds.WithLabelValues(rewindReason(err)).Inc()
		*pending = nil
		lostVerified(commits, err)
		if errors.Is(err, ErrFatal) {
			g.log.Error("committed work was lost; stopping", zap.Int32("generation", genID), zap.Error(err))
			g.fatal(err)
		} else {
			g.log.Warn("work not confirmed before commit; consuming again from the committed offsets",
				zap.Int32("generation", genID), zap.Error(err))
		}
		return false
	}
	*pending = ps[n:]
	return commits.queue(merged)
}

// offsetCommits sends verified offsets to Kafka from a goroutine of its own, one commit at a
// time in the order they were verified. The broker's answer takes milliseconds, and the goroutine
// that verifies also applies: waiting for it there would leave Redis idle. Nothing is committed
// that was not verified first. A commit that was queued but not yet sent when the batch loop
// found a loss of verified work is never sent (abandon): before the loss was found it had not
// been made, and after it, it might stand for lost work. A failed commit ends the generation's
// batch loop (failed), as one made on that goroutine did, and nothing later is sent; the batches
// not committed are consumed again.
type offsetCommits struct {
	offsets   chan map[string]map[int]int64
	failed    chan struct{} // closed when a commit failed; nothing later is sent
	abandoned chan struct{} // closed by abandon; nothing queued is sent any more
	abandon1  sync.Once
	// sending is held from the check of abandoned to the broker's answer, so abandon returns
	// only once no commit is being sent and none can begin after it. A channel rather than a
	// mutex: the batch loop's wait on it stays a channel wait, visible as blocked to tests.
	sending chan struct{}
	done    chan struct{} // closed when the goroutine returned
}

// startCommits starts the goroutine that commits under gen. Its owner calls close, which waits
// until every commit queued before it was made, or one failed, or they were abandoned.
func (g *Group) startCommits(genID int32, gen committer) *offsetCommits {
	c := &offsetCommits{
		// Commits come a CommitDelay apart or more; a queue of a few absorbs a slow broker, and a
		// full one holds the batch loop back rather than letting commits fall further behind.
		offsets:   make(chan map[string]map[int]int64, 4),
		failed:    make(chan struct{}),
		abandoned: make(chan struct{}),
		sending:   make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	go func() {
		defer close(c.done)
		for offsets := range c.offsets {
			// What else waits goes in the same commit: offsets only grow, so the merge leaves
			// what sending them one by one would, for one answer of the broker instead of several
			// (which also bounds how long a shutdown waits for a slow broker).
			offsets = c.mergeQueued(offsets)
			c.sending <- struct{}{}
			select {
			case <-c.abandoned:
				<-c.sending
				return
			default:
			}
			began := time.Now()
			err := gen.CommitOffsets(offsets)
			<-c.sending
			g.metrics.StageSeconds.WithLabelValues("commit_kafka").Observe(time.Since(began).Seconds())
			if err != nil {
				g.metrics.Commits.WithLabelValues("error").Inc()
				g.log.Warn("commit failed; the batches will be redelivered and applied idempotently", zap.Int32("generation", genID), zap.Error(err))
				close(c.failed)
				return
			}
			g.metrics.Commits.WithLabelValues("ok").Inc()
		}
	}()
	return c
}

// mergeQueued raises first to every commit queued behind it, each partition at its highest
// offset, and returns it. The maps are the goroutine's once queued.
func (c *offsetCommits) mergeQueued(first map[string]map[int]int64) map[string]map[int]int64 {
	for {
		select {
		case next, ok := <-c.offsets:
			if !ok {
				return first
			}
			mergeOffsets(first, next)
		default:
			return first
		}
	}
}

// mergeOffsets raises every partition of into to at least its offset in from.
func mergeOffsets(into, from map[string]map[int]int64) {
	for t, parts := range from {
		if into[t] == nil {
			into[t] = make(map[int]int64, len(parts))
		}
		for part, off := range parts {
			into[t][part] = max(into[t][part], off)
		}
	}
}

// queue hands verified offsets to the committing goroutine, which owns the map from then on.
// False means an earlier commit failed and these will not be sent; true that they were queued,
// which still does not make them sent (a commit before them may fail, or a loss found later
// abandon them).
func (c *offsetCommits) queue(offsets map[string]map[int]int64) bool {
	if c.hasFailed() {
		return false
	}
	select {
	case c.offsets <- offsets:
		return true
	case <-c.failed:
		return false
	case <-c.abandoned:
		return false
	}
}

// hasFailed reports whether a commit failed.
func (c *offsetCommits) hasFailed() bool {
	select {
	case <-c.failed:
		return true
	default:
		return false
	}
}

// lostVerified abandons the commits queued and not yet sent when err is the loss of verified work
// (ErrFatal): they may stand for it. A loss of later work (ErrRewind) leaves them: the work they
// stand for was verified and, since the loss does not reach it, is still held.
func lostVerified(c *offsetCommits, err error) {
	if errors.Is(err, ErrFatal) {
		c.abandon()
	}
}

// abandon drops every commit queued and not yet sent. It waits for the broker's answer to one
// being sent, so no commit begins after it returns: the loss it follows is then certainly
// found before anything it might stand for is committed.
func (c *offsetCommits) abandon() {
	c.abandon1.Do(func() {
		c.sending <- struct{}{}
		close(c.abandoned)
		<-c.sending
	})
}

// close ends the queue and waits for the commits in it.
func (c *offsetCommits) close() {
	close(c.offsets)
	<-c.done
}

// done records a published batch in the metrics and returns the offsets to commit for it.
func (g *Group) done(f *flight) map[string]map[int]int64 {
	offsets := make(map[string]map[int]int64)
	// The lag of each partition from its newest message in the batch, set once per partition: a
	// labelled gauge hashes its labels on every lookup.
	lag := make(map[string]map[int]int64)
	for i := range f.msgs {
		m := &f.msgs[i]
		if offsets[m.Topic] == nil {
			offsets[m.Topic] = make(map[int]int64)
			lag[m.Topic] = make(map[int]int64)
		}
		if next := m.Offset + 1; next > offsets[m.Topic][m.Partition] {
			offsets[m.Topic][m.Partition] = next
			lag[m.Topic][m.Partition] = max(0, m.HighWaterMark-m.Offset-1)
		}
	}
	for topic, parts := range lag {
		for part, n := range parts {
			g.metrics.Lag.WithLabelValues(topic, partitionLabel(part)).Set(float64(n))
		}
	}
	g.metrics.BatchSize.Observe(float64(len(f.msgs)))
	g.metrics.BatchSeconds.Observe(time.Since(f.start).Seconds())
	last := &f.msgs[len(f.msgs)-1]
	g.metrics.LastEvent.WithLabelValues(last.Topic).Set(float64(last.Time.Unix()))
	return offsets
}
