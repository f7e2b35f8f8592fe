package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
)

// Handler processes batches for the group; *Processor is one.
type Handler interface {
	// Handle processes one batch; a nil return lets its offsets be committed once Verify confirms
	// that its work is still held.
	Handle(ctx context.Context, msgs []kafka.Message) error
	// Mark names the work of the last batch Handle completed.
	Mark() int64
	// Verify confirms, immediately before committing offsets, that the work of every batch up to
	// mark is still held, and records offsets as about to be committed: ErrRewind when recent work
	// was lost (consume again from the committed offsets), ErrFatal when work whose offsets may be
	// committed was lost.
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

	// MaxBatch and Linger bound a batch: it is processed when it holds MaxBatch messages or Linger
	// after its first message arrived, whichever comes first.
	MaxBatch int
	Linger   time.Duration
	// DrainTimeout bounds finishing the batch in hand once shutdown or a rebalance begins.
	DrainTimeout time.Duration
	// CommitDelay holds a batch's offsets back until its Redis writes are durable: at least the
	// AOF fsync interval (everysec: one second). Zero commits at once.
	CommitDelay time.Duration

	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration
}

// Validate checks the configuration and fills defaults.
func (c *GroupConfig) Validate() error {
	if len(c.Brokers) == 0 || c.GroupID == "" || len(c.Topics) == 0 {
		return errors.New("consumer group needs brokers, a group id and topics")
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 2000
	}
	if c.Linger <= 0 {
		c.Linger = 50 * time.Millisecond
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = 30 * time.Second
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
// rather than a group Reader so that it sees every generation end: the batch in hand is finished
// and committed under the generation that fetched it, and nothing of an old generation runs when a
// new one starts. Offsets are committed after the handler returns nil and cover exactly the
// messages of that batch; each partition's messages arrive in order, so that is a contiguous prefix.
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
	gen.Start(func(gctx context.Context) { g.batches(ctx, gctx, gen, msgs, g.fatal) })
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

// pendingCommit is a processed batch whose offsets wait for its Redis writes to become durable.
type pendingCommit struct {
	offsets map[string]map[int]int64
	mark    int64 // the handler's mark of the batch
	ready   time.Time
}

// batches collects, handles and commits batches until the generation or ctx ends. A batch that is
// being collected when either ends is still handled (a drain). Offsets are committed CommitDelay
// after their batch was applied, so that Redis has fsynced the writes they stand for (AOF everysec
// syncs once a second); commits still pending when the loop ends are made before it returns.
func (g *Group) batches(ctx, gctx context.Context, gen *kafka.Generation, in <-chan kafka.Message, fatal func(error)) {
	batch := make([]kafka.Message, 0, g.cfg.MaxBatch)
	var pending []pendingCommit
	defer func() { g.commitPending(gen, &pending, true) }()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		batch = batch[:0]
		var due <-chan time.Time
		if len(pending) > 0 {
			due = time.After(time.Until(pending[0].ready))
		}
		select {
		case m := <-in:
			batch = append(batch, m)
		case <-due:
			if !g.commitPending(gen, &pending, false) {
				return
			}
			continue
		case <-gctx.Done():
			return
		case <-ctx.Done():
			return
		}
		start := time.Now()
		timer.Reset(g.cfg.Linger)
		stopping := false
	fill:
		for len(batch) < g.cfg.MaxBatch {
			select {
			case m := <-in:
				batch = append(batch, m)
			case <-timer.C:
				break fill
			case <-gctx.Done():
				stopping = true
				break fill
			case <-ctx.Done():
				stopping = true
				break fill
			}
		}
		timer.Stop()
		offsets, err := g.process(gctx, batch, start)
		if err != nil {
			// Nothing pending is committed: those batches are consumed again, idempotently.
			pending = nil
			if errors.Is(err, ErrFatal) {
				fatal(err)
			}
			return
		}
		pending = append(pending, pendingCommit{offsets: offsets, mark: g.handler.Mark(), ready: time.Now().Add(g.cfg.CommitDelay)})
		if !g.commitPending(gen, &pending, false) || stopping {
			return
		}
	}
}

// commitPending commits the offsets of every pending batch that is ready (all of them, after
// waiting, when final), once the handler confirmed that their work is still held; false means the
// generation is over. A loss found then drops every pending batch (they are consumed again) or,
// when it reaches committed work, stops the group.
func (g *Group) commitPending(gen *kafka.Generation, pending *[]pendingCommit, final bool) bool {
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
		for t, parts := range p.offsets {
			if merged[t] == nil {
				merged[t] = make(map[int]int64)
			}
			for part, off := range parts {
				merged[t][part] = max(merged[t][part], off)
			}
		}
	}
	vctx, cancel := context.WithTimeout(context.Background(), g.cfg.DrainTimeout)
	err := g.handler.Verify(vctx, ps[n-1].mark, merged)
	cancel()
	if err != nil {
		g.metrics.Commits.WithLabelValues("unverified").Inc()
		*pending = nil
		if errors.Is(err, ErrFatal) {
			g.log.Error("committed work was lost; stopping", zap.Int32("generation", gen.ID), zap.Error(err))
			g.fatal(err)
		} else {
			g.log.Warn("work not confirmed before commit; consuming again from the committed offsets",
				zap.Int32("generation", gen.ID), zap.Error(err))
		}
		return false
	}
	*pending = ps[n:]
	if err := gen.CommitOffsets(merged); err != nil {
		g.metrics.Commits.WithLabelValues("error").Inc()
		g.log.Warn("commit failed; the batches will be redelivered and applied idempotently", zap.Int32("generation", gen.ID), zap.Error(err))
		return false
	}
	g.metrics.Commits.WithLabelValues("ok").Inc()
	return true
}

// process handles one batch and returns the offsets to commit for it.
func (g *Group) process(gctx context.Context, batch []kafka.Message, start time.Time) (map[string]map[int]int64, error) {
	// The batch in hand is finished even when the generation ends meanwhile: its effects are
	// idempotent, and committing it (if the generation still stands) spares the next owner the work.
	hctx, cancel := context.WithTimeout(context.WithoutCancel(gctx), g.cfg.DrainTimeout)
	defer cancel()
	if err := g.handler.Handle(hctx, batch); err != nil {
		g.log.Error("batch not processed; it will be redelivered", zap.Int("messages", len(batch)), zap.Error(err))
		return nil, err
	}
	offsets := make(map[string]map[int]int64)
	for i := range batch {
		m := &batch[i]
		if offsets[m.Topic] == nil {
			offsets[m.Topic] = make(map[int]int64)
		}
		if next := m.Offset + 1; next > offsets[m.Topic][m.Partition] {
			offsets[m.Topic][m.Partition] = next
		}
		g.metrics.Lag.WithLabelValues(m.Topic, partitionLabel(m.Partition)).Set(float64(max(0, m.HighWaterMark-m.Offset-1)))
	}
	g.metrics.BatchSize.Observe(float64(len(batch)))
	g.metrics.BatchSeconds.Observe(time.Since(start).Seconds())
	last := &batch[len(batch)-1]
	g.metrics.LastEvent.WithLabelValues(last.Topic).Set(float64(last.Time.Unix()))
	return offsets, nil
}
