package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
)

// Store applies observations durably and returns their outcomes and the touched aggregates'
// tallies. Applying the same observations again must change nothing; aggregator.Redis is one.
type Store interface {
	Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error)
	// Seal ends a batch and returns its mark, recording the batch's offsets (the next offset of
	// each partition it read) beside its work: it fails with aggregator.ErrWritesLost when the
	// store lost writes it acknowledged for earlier batches, and with aggregator.ErrStateLost when
	// the loss reaches a mark that Verify confirmed.
	Seal(ctx context.Context, offsets aggregator.Offsets) (int64, error)
	// Verify confirms, right before a commit is queued, that the store still holds every write up to
	// the batch of mark upTo, with the same errors as Seal, and records the offsets about to be
	// committed beside the state.
	Verify(ctx context.Context, upTo int64, commit aggregator.Offsets) error
	// CheckOffsets fails with aggregator.ErrStateLost when the group committed offsets past the
	// work the store holds.
	CheckOffsets(ctx context.Context, committed aggregator.Offsets) error
}

// encoder is a Store that can do the CPU part of Apply (grouping and encoding the observations)
// ahead, in Prepare, so that it overlaps the previous batch's Redis work instead of delaying the
// next one; aggregator.Redis is one.
type encoder interface {
	Encode(obs []aggregator.Observation) *aggregator.Encoded
	ApplyEncoded(ctx context.Context, e *aggregator.Encoded, at time.Time) (aggregator.Applied, error)
}

// suiteEncoder is a SuiteStore that applies graded runs Prepare encoded with suite.Encode;
// suite.Redis is one.
type suiteEncoder interface {
	ApplyEncoded(ctx context.Context, e *suite.Encoded, at time.Time) (suite.Applied, error)
}

// jointEncoder is an encoder that writes a suite store's part of a batch in the pipeline of its
// own (aggregator.Redis), and suiteCompanion the suite store that hands it that part
// (suite.Redis): a batch then reaches Redis in one round trip, not two, and Redis does not idle
// between them. The processor joins them only when both are given.
type jointEncoder interface {
	ApplyEncodedWith(ctx context.Context, e *aggregator.Encoded, at time.Time, c aggregator.Companion) (aggregator.Applied, error)
}
type suiteCompanion interface {
	Companion(e *suite.Encoded, at time.Time) *suite.Companion
}

// Publisher publishes results and returns once they are acknowledged; sink.Kafka is one.
type Publisher interface {
	Publish(ctx context.Context, snaps []schemas.Snapshot) error
	PublishSuites(ctx context.Context, o suite.Output, at time.Time) error
}

// SuiteStore stores graded runs durably and returns every touched suite's summary as observed at
// time at. Applying the same runs again must change nothing; suite.Redis is one.
type SuiteStore interface {
	Apply(ctx context.Context, obs []suite.RunObservation, at time.Time) (suite.Applied, error)
	MarkAnnounced(ctx context.Context, k suite.Key, cases []string) error
}

// DeadLetterSender quarantines messages and returns once they are acknowledged.
type DeadLetterSender interface {
	Send(ctx context.Context, dls []DeadLetter) error
}

// ProcessorConfig configures a Processor.
type ProcessorConfig struct {
	// RetryMin and RetryMax bound the backoff between retries of a failing stage.
	RetryMin, RetryMax time.Duration
	// Suite configures suite discrimination and stability.
	Suite suite.Config
	// Receipt is the clock events are judged "from the future" against (docs/semantics.md:
	// receipt time); nil uses the processor's clock. `run` passes a ReceiptClock, which a wall
	// clock stepped back does not turn back.
	Receipt func() time.Time
}

// Validate fills defaults.
func (c *ProcessorConfig) Validate() error {
	if c.RetryMin <= 0 {
		c.RetryMin = 50 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = 5 * time.Second
	}
	return c.Suite.Validate()
}

// Processor handles batches of input messages: decode, apply, publish snapshots, quarantine bad
// input. It is the unit between fetch and commit, in three stages the group overlaps across
// batches (docs/semantics.md#delivery): Prepare decodes (CPU only), Apply writes to Redis and seals
// the batch, Publish gets every output acknowledged. Each stage is called by one goroutine at a
// time, and the batches pass Apply and Publish in the order they were prepared.
type Processor struct {
	cfg     ProcessorConfig
	decoder *cloudevent.Decoder
	store   Store
	suites  SuiteStore
	enc     encoder        // store, when it is one
	renc    suiteEncoder   // suites, when it is one
	joint   jointEncoder   // store, when it is one and suites is a suiteCompanion
	comp    suiteCompanion // suites, when joint is set
	pub     Publisher
	dlq     DeadLetterSender
	now     func() time.Time
	log     *zap.Logger
	metrics *Metrics
}

// NewProcessor returns a processor. now is the clock that stamps observation times and judges
// future-dated events; pass time.Now outside tests.
func NewProcessor(cfg ProcessorConfig, d *cloudevent.Decoder, s Store, suites SuiteStore, p Publisher, dlq DeadLetterSender, now func() time.Time, log *zap.Logger, m *Metrics) (*Processor, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d == nil || s == nil || suites == nil || p == nil || dlq == nil || now == nil || log == nil || m == nil {
		return nil, errors.New("processor: every dependency is required")
	}
	proc := &Processor{cfg: cfg, decoder: d, store: s, suites: suites, pub: p, dlq: dlq, now: now, log: log, metrics: m}
	proc.enc, _ = s.(encoder)
	proc.renc, _ = suites.(suiteEncoder)
	if j, ok := s.(jointEncoder); ok {
		if c, ok := suites.(suiteCompanion); ok {
			proc.joint, proc.comp = j, c
		}
	}
	return proc, nil
}

// Batch is one batch of input messages on its way through the processor's stages. Each stage
// fills in what the next one needs; nothing in it is shared with another batch.
type Batch struct {
	msgs []kafka.Message
	obs  []aggregator.Observation
	enc  *aggregator.Encoded // obs encoded by Prepare, when the store is an encoder
	runs []suite.RunObservation
	renc *suite.Encoded // runs encoded by Prepare, when the suite store is a suiteEncoder
	dls  []DeadLetter

	// Filled by Apply.
	applied aggregator.Applied
	suites  suite.Applied
	at      time.Time // observation time of the snapshots
	out     suite.Output
	mark    int64 // the store's mark of this batch
	// applyTries counts the attempts of the apply stage: after a failed one, duplicates may be
	// that attempt's own work (metric outcome "reapplied").
	applyTries int
	suiteTries int // the same for the suite_apply stage (0 when the runs go with the apply stage)
}

// Messages returns the batch's input messages, valid until its Publish returned (Group reuses the
// slice for a later batch).
func (b *Batch) Messages() []kafka.Message { return b.msgs }

// Mark returns the store's mark of the batch once Apply sealed it.
func (b *Batch) Mark() int64 { return b.mark }

// Barrier reports whether the next batch must not be applied before this one is published: this
// batch announces revived cases, and marks them announced only after publishing them, so a suite
// apply that ran in between would read them as not announced and announce them again.
func (b *Batch) Barrier() bool { return len(b.out.Revived) > 0 }

// Handle processes msgs completely or not at all as far as the caller is concerned: it returns nil
// only when every observation is applied, every touched aggregate's snapshot published and every
// bad message dead-lettered, so the caller may commit. It is Prepare, Apply and Publish in a row.
func (p *Processor) Handle(ctx context.Context, msgs []kafka.Message) error {
	b, err := p.Prepare(msgs)
	if err != nil {
		return err
	}
	if err := p.Apply(ctx, b); err != nil {
		return err
	}
	return p.Publish(ctx, b)
}

// Prepare decodes msgs, sorts out the bad ones for the dead-letter topic and groups the rest into
// observations and graded runs, encoded for the store when it can take them so. It reads and
// writes nothing outside the process.
func (p *Processor) Prepare(msgs []kafka.Message) (*Batch, error) {
	recv := p.now()
	if p.cfg.Receipt != nil {
		recv = p.cfg.Receipt()
	}
	b := &Batch{msgs: msgs, obs: make([]aggregator.Observation, 0, len(msgs))}
	seen := make(map[[2]string]struct{}, len(msgs))
	// Events counted by type per batch, not per event: a labelled counter hashes its labels on
	// every lookup, and a stream has a handful of types.
	var types eventTypes
	defer func() { types.flush(p.metrics.Events) }()
	for i := range msgs {
		m := &msgs[i]
		ev, err := p.decoder.Decode(m, recv)
		if err != nil {
			var ie *schemas.InvalidError
			if !errors.As(err, &ie) {
				return nil, fmt.Errorf("decode %s/%d@%d: %w", m.Topic, m.Partition, m.Offset, err)
			}
			b.dls = append(b.dls, DeadLetter{Message: *m, Reason: ie.Reason, Detail: ie.Detail})
			p.metrics.DeadLetters.WithLabelValues(string(ie.Reason)).Inc()
			continue
		}
		types.add(ev.Type)
		id := [2]string{ev.Source, ev.ID}
		if _, dup := seen[id]; dup {
			// Counted for visibility only: the opportunity identity, not the CloudEvent id, decides.
			p.metrics.Transport.Inc()
		}
		seen[id] = struct{}{}
		if o, ok := ev.Observation(); ok {
			b.obs = append(b.obs, o)
		}
		if ev.Eval != nil {
			b.runs = append(b.runs, suite.FromEvalRun(ev.Eval, p.cfg.Suite.ReplyMode))
		}
	}
	if p.enc != nil && len(b.obs) > 0 {
		b.enc = p.enc.Encode(b.obs)
	}
	if p.renc != nil && len(b.runs) > 0 {
		b.renc = suite.Encode(b.runs)
	}
	return b, nil
}

// eventTypes counts a batch's events by type.
type eventTypes []eventCount

type eventCount struct {
	name string
	n    int
}

func (t *eventTypes) add(name string) {
	for i := range *t {
		if (*t)[i].name == name {
			(*t)[i].n++
			return
		}
	}
	*t = append(*t, eventCount{name, 1})
}

func (t eventTypes) flush(c *prometheus.CounterVec) {
	for _, e := range t {
		c.WithLabelValues(e.name).Add(float64(e.n))
	}
}

// stage is one retried step of a batch.
type stage struct {
	name string
	run  func(context.Context) error
}

// Apply writes the batch to Redis and seals it: observations applied (their tallies read back),
// graded runs applied and the suite outputs computed, then the batch mark written. Every output
// is computed here, on state whose previous batch mark was just confirmed, and only published by
// Publish; a failing step is retried with backoff until it succeeds or ctx ends. Apply of the
// next batch may run while this one is being published (docs/semantics.md#delivery). When the
// stores can (jointEncoder), a batch's observations and graded runs go to Redis in one pipeline,
// the step "apply", and there is no "suite_apply" step.
func (p *Processor) Apply(ctx context.Context, b *Batch) error {
	// From the stored state, not the outcomes: a redelivered batch (all duplicates) publishes the
	// same alerts again, with the same ids.
	suiteOut := func(now time.Time) { b.out = suite.BuildOutput(b.suites, b.runs, p.cfg.Suite, now) }
	joined := p.joint != nil && b.enc != nil && b.renc != nil
	stages := []stage{{"apply", func(ctx context.Context) error {
		b.applyTries++
		if len(b.obs) == 0 {
			if len(b.runs) == 0 {
				return nil
			}
			// No tally to compute, but suite outputs are about to be: check the batch mark
			// first, as Apply does, so nothing computed on lost writes is published.
			return durability(p.store.Verify(ctx, 0, nil))
		}
		b.at = p.now()
		var err error
		switch {
		case joined:
			c := p.comp.Companion(b.renc, b.at)
			if b.applied, err = p.joint.ApplyEncodedWith(ctx, b.enc, b.at, c); err == nil {
				b.suites = c.Applied
				suiteOut(b.at)
			}
		case b.enc != nil:
			b.applied, err = p.enc.ApplyEncoded(ctx, b.enc, b.at)
		default:
			b.applied, err = p.store.Apply(ctx, b.obs, b.at)
		}
		return durability(err)
	}}}
	if !joined {
		stages = append(stages, stage{"suite_apply", func(ctx context.Context) error {
			b.suiteTries++
			if len(b.runs) == 0 {
				return nil
			}
			now := p.now()
			var err error
			if b.renc != nil {
				b.suites, err = p.renc.ApplyEncoded(ctx, b.renc, now)
			} else {
				b.suites, err = p.suites.Apply(ctx, b.runs, now)
			}
			if errors.Is(err, aggregator.ErrStateLost) {
				return fmt.Errorf("%w: %w", ErrFatal, err)
			}
			if err == nil {
				suiteOut(now)
			}
			return err
		}})
	}
	stages = append(stages, stage{"seal", func(ctx context.Context) error {
		mark, err := p.store.Seal(ctx, nextOffsets(b.msgs))
		if err == nil {
			b.mark = mark
		}
		return durability(err)
	}})
	return p.run(ctx, stages)
}

// nextOffsets returns the next offset to consume of each partition of msgs.
func nextOffsets(msgs []kafka.Message) aggregator.Offsets {
	offsets := make(aggregator.Offsets)
	for i := range msgs {
		m := &msgs[i]
		if offsets[m.Topic] == nil {
			offsets[m.Topic] = make(map[int]int64)
		}
		offsets[m.Topic][m.Partition] = max(offsets[m.Topic][m.Partition], m.Offset+1)
	}
	return offsets
}

// Settle waits until every output write the publisher and the dead-letter sender started has
// ended, when they can tell (sink.Kafka.Settle, DeadLetters.Settle); the group calls it before it
// hands its partitions over.
func (p *Processor) Settle(ctx context.Context) error {
	for _, out := range []any{p.pub, p.dlq} {
		if s, ok := out.(interface{ Settle(context.Context) error }); ok {
			if err := s.Settle(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// Publish gets the batch's outputs acknowledged: dead letters, snapshots, suite outputs and
// alerts, then marks revived cases announced. Batches must be published in the order they were
// applied, one at a time: each aggregate's snapshots then reach Kafka in version order.
func (p *Processor) Publish(ctx context.Context, b *Batch) error {
	err := p.run(ctx, []stage{
		{"dead_letter", func(ctx context.Context) error { return p.dlq.Send(ctx, b.dls) }},
		{"publish", func(ctx context.Context) error {
			if len(b.applied.Keys) == 0 {
				return nil
			}
			snaps := make([]schemas.Snapshot, len(b.applied.Keys))
			for i, k := range b.applied.Keys {
				snaps[i] = b.applied.Tallies[k].Snapshot(k, b.at)
			}
			return p.pub.Publish(ctx, snaps)
		}},
		{"suite_publish", func(ctx context.Context) error {
			if len(b.runs) == 0 {
				return nil
			}
			return p.pub.PublishSuites(ctx, b.out, p.now())
		}},
		{"suite_announce", func(ctx context.Context) error {
			// After publishing: a crash in between re-publishes the revived event with the same id.
			byKey := map[suite.Key][]string{}
			for _, r := range b.out.Revived {
				k := suite.Key{Workspace: r.Workspace, Suite: r.Suite}
				byKey[k] = append(byKey[k], r.CaseID)
			}
			for k, cases := range byKey {
				if err := p.suites.MarkAnnounced(ctx, k, cases); err != nil {
					return err
				}
			}
			return nil
		}},
	})
	if err != nil {
		return err
	}
	for _, o := range b.applied.Outcomes {
		label := o.String()
		if o == aggregator.Duplicate && b.applyTries > 1 {
			// Applied again after an attempt whose answer was lost: the duplicate may be that
			// attempt's own work, not an event sent twice.
			label = "reapplied"
		}
		p.metrics.Outcomes.WithLabelValues(label).Inc()
	}
	for _, o := range b.suites.Outcomes {
		label := o.String()
		if o == aggregator.Duplicate && (b.suiteTries > 1 || b.suiteTries == 0 && b.applyTries > 1) {
			label = "reapplied"
		}
		p.metrics.RunOutcomes.WithLabelValues(label).Inc()
	}
	p.metrics.Alerts.WithLabelValues("revived").Add(float64(len(b.out.Revived)))
	p.metrics.Alerts.WithLabelValues("abnormal_sample").Add(float64(len(b.out.Abnormal)))
	return nil
}

// run runs stages in order, each retried until it succeeds; stages already done are not repeated.
func (p *Processor) run(ctx context.Context, stages []stage) error {
	for _, st := range stages {
		began := time.Now()
		err := p.retry(ctx, st.name, st.run)
		// Failed steps too: a step retried until its deadline is where the time went.
		p.metrics.StepSeconds.WithLabelValues(st.name).Observe(time.Since(began).Seconds())
		if err != nil {
			return err
		}
	}
	return nil
}

// Verify confirms that the store still holds the work of every batch up to mark and records the
// offsets about to be committed; the group calls it right before it queues them for commit.
func (p *Processor) Verify(ctx context.Context, mark int64, commit map[string]map[int]int64) error {
	return durability(p.store.Verify(ctx, mark, commit))
}

// CheckOffsets confirms that the store holds the work of every offset the group committed; the
// group calls it when a generation hands it partitions.
func (p *Processor) CheckOffsets(ctx context.Context, committed map[string]map[int]int64) error {
	return durability(p.store.CheckOffsets(ctx, committed))
}

// durability maps the store's loss errors to what the group does about them: consume again from
// the committed offsets, or stop because committed work is gone.
func durability(err error) error {
	switch {
	case errors.Is(err, aggregator.ErrStateLost):
		return fmt.Errorf("%w: %w", ErrFatal, err)
	case errors.Is(err, aggregator.ErrWritesLost):
		return fmt.Errorf("%w: %w", ErrRewind, err)
	case errors.Is(err, aggregator.ErrReplicasBehind):
		return fmt.Errorf("%w: %w", ErrNotYet, err)
	}
	return err
}

func (p *Processor) retry(ctx context.Context, stage string, fn func(context.Context) error) error {
	wait := p.cfg.RetryMin
	for {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if errors.Is(err, ErrFatal) || errors.Is(err, ErrRewind) {
			return fmt.Errorf("%s: %w", stage, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", stage, err)
		}
		p.metrics.Retries.WithLabelValues(stage).Inc()
		p.log.Warn("batch stage failed, retrying", zap.String("stage", stage), zap.Duration("backoff", wait), zap.Error(err))
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", stage, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, p.cfg.RetryMax)
	}
}
