package consumer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

// The pipeline's promises (docs/semantics.md#delivery) at the new default of four batches in
// flight and deeper: a fault in each stage of a batch that has MaxInFlight−1 batches in flight
// beside it, a rebalance in the middle of a full pipeline, and redelivery of everything not
// committed, in one in-memory rig.

// deepOffsetKey carries the first offset of the batch a stage runs for, so that the store, the
// publisher and the dead-letter sender know which batch calls them.
type deepOffsetKey struct{}

func deepOffset(ctx context.Context) int64 { off, _ := ctx.Value(deepOffsetKey{}).(int64); return off }

// deepRig runs the group's batch loop, one message per batch, over generations that each start at
// the offset committed so far, as Kafka would redeliver them, with one fault injected in the first
// generation.
type deepRig struct {
	t           *testing.T
	tr          *trace
	maxInFlight int
	fault       string // the stage that fails, "" for none
	at          int64  // the batch (its offset) it fails for
	msgs        []kafka.Message
	model       *aggregator.Model
	group       *Group
	proc        *Processor
	procMetrics *Metrics
	publishTime time.Duration

	mu            sync.Mutex
	gen           int
	gcancel       context.CancelFunc
	fired         bool
	hits          int
	depth         int            // batches in flight when the fault fired
	inFlight      int            // prepared in this generation and not yet published
	maxDepth      int            // the most ever in flight
	publishing    int            // Publish calls running now
	maxPublishing int            // the most ever running at once
	published     map[int64]bool // offsets published in this generation
	committed     int64          // the offset committed last
	genStart      int64          // committed when this generation started
	genCommits    [][]int64      // commits by generation
	versions      [][]int64      // the aggregate's snapshot versions by generation, in publish order
	lastSnap      schemas.Snapshot
	prepared      []int64 // offsets prepared in this generation
	applyOK       int     // Apply calls that succeeded
	publishOK     int     // Publish calls that succeeded
	all           chan struct{}
	fatal         error
}

// hit reports whether the fault fires now for stage at offset off: once (twice for
// apply_transient; on every call in the first generation for the stages that fail until their
// deadline), the first time only after the pipeline is full.
func (r *deepRig) hit(stage string, off int64) bool {
	r.mu.Lock()
	if stage != r.fault || off != r.at || r.gen != 0 {
		r.mu.Unlock()
		return false
	}
	first := !r.fired
	r.fired = true
	r.hits++
	hits := r.hits
	r.mu.Unlock()
	switch {
	case r.persistent():
	case stage == "apply_transient" && hits <= 2: // fails twice, then succeeds
	case !first:
		return false
	}
	if first {
		// Let the pipeline fill: every place taken by a batch (all but the one being prepared, for
		// the stages that run before this batch took its place in the count).
		want := r.maxInFlight
		if stage == "prepare" || stage == "verify" || stage == "commit" {
			want = r.maxInFlight - 1
		}
		for range 6000 {
			r.mu.Lock()
			n := r.inFlight
			r.mu.Unlock()
			if n >= want {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		r.mu.Lock()
		r.depth = r.inFlight
		r.mu.Unlock()
	}
	return true
}

// persistent reports whether the fault is one that lasts until the stage's deadline.
func (r *deepRig) persistent() bool { return r.fault == "publish" || r.fault == "dead_letter" }

type deepStore struct{ r *deepRig }

func (s deepStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	off := deepOffset(ctx)
	if s.r.hit("apply", off) {
		return aggregator.Applied{}, fmt.Errorf("%w: injected at offset %d", aggregator.ErrWritesLost, off)
	}
	if s.r.hit("apply_transient", off) {
		return aggregator.Applied{}, errors.New("connection reset by peer")
	}
	return s.r.model.Apply(ctx, obs, at)
}

func (s deepStore) Seal(ctx context.Context, _ aggregator.Offsets) (int64, error) {
	if s.r.hit("seal", deepOffset(ctx)) {
		return 0, fmt.Errorf("%w: injected", aggregator.ErrWritesLost)
	}
	return 1, nil
}

func (s deepStore) Verify(_ context.Context, upTo int64, commit aggregator.Offsets) error {
	if upTo == 0 {
		return nil
	}
	r := s.r
	next := commit["in"][0]
	if next > r.at && r.hit("verify", r.at) {
		return fmt.Errorf("%w: injected before committing %d", aggregator.ErrWritesLost, next)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for off := r.genStart; off < next; off++ {
		if !r.published[off] {
			r.t.Errorf("generation %d: about to commit %d although offset %d was not published", r.gen, next, off)
		}
	}
	return nil
}

func (s deepStore) CheckOffsets(context.Context, aggregator.Offsets) error { return nil }

type deepPublisher struct{ r *deepRig }

func (p deepPublisher) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	r := p.r
	off := deepOffset(ctx)
	if r.hit("publish", off) {
		return errors.New("broker not available")
	}
	// A publish takes a second (or publishTime): the applies run ahead and fill every place in
	// the pipeline.
	select {
	case <-time.After(cmp.Or(r.publishTime, time.Second)):
	case <-ctx.Done():
		return ctx.Err()
	}
	if r.hit("rebalance", off) {
		r.mu.Lock()
		r.gcancel() // the generation ends; what is in flight is drained under it
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range snaps {
		r.versions[r.gen] = append(r.versions[r.gen], s.Version)
		r.lastSnap = s
	}
	return nil
}

func (p deepPublisher) PublishSuites(context.Context, suite.Output, time.Time) error { return nil }

type deepDLQ struct{ r *deepRig }

func (d deepDLQ) Send(ctx context.Context, _ []DeadLetter) error {
	if d.r.hit("dead_letter", deepOffset(ctx)) {
		return errors.New("dead-letter topic not available")
	}
	return nil
}

// deepHandler is the processor with the rig's bookkeeping around each stage.
type deepHandler struct {
	*Processor
	r *deepRig
}

func (h deepHandler) Prepare(msgs []kafka.Message) (*Batch, error) {
	r := h.r
	off := msgs[0].Offset
	if r.hit("prepare", off) {
		return nil, errors.New("injected prepare failure")
	}
	b, err := h.Processor.Prepare(msgs)
	r.mu.Lock()
	r.inFlight++
	r.maxDepth = max(r.maxDepth, r.inFlight)
	if r.inFlight > r.maxInFlight {
		r.t.Errorf("generation %d: %d batches prepared and not yet published, MaxInFlight %d", r.gen, r.inFlight, r.maxInFlight)
	}
	r.prepared = append(r.prepared, off)
	r.mu.Unlock()
	r.tr.add("prepared %d", off)
	return b, err
}

func (h deepHandler) Apply(ctx context.Context, b *Batch) error {
	off := b.Messages()[0].Offset
	err := h.Processor.Apply(context.WithValue(ctx, deepOffsetKey{}, off), b)
	if err == nil {
		h.r.mu.Lock()
		h.r.applyOK++
		h.r.mu.Unlock()
		h.r.tr.add("applied %d", off)
	}
	return err
}

func (h deepHandler) Publish(ctx context.Context, b *Batch) error {
	r := h.r
	off := b.Messages()[0].Offset
	r.mu.Lock()
	r.publishing++
	r.maxPublishing = max(r.maxPublishing, r.publishing)
	r.mu.Unlock()
	err := h.Processor.Publish(context.WithValue(ctx, deepOffsetKey{}, off), b)
	r.mu.Lock()
	r.publishing--
	if err == nil {
		r.publishOK++
		r.published[off] = true
		r.inFlight--
	}
	r.mu.Unlock()
	if err == nil {
		r.tr.add("published %d", off)
	}
	return err
}

func (h deepHandler) Verify(ctx context.Context, mark int64, commit map[string]map[int]int64) error {
	return h.Processor.Verify(ctx, mark, commit)
}

// deepCommitter is the generation's committer.
type deepCommitter struct{ r *deepRig }

func (c deepCommitter) CommitOffsets(offsets map[string]map[int]int64) error {
	r := c.r
	next := offsets["in"][0]
	if next > r.at && r.hit("commit", r.at) {
		return errors.New("injected: not the group's current generation")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if next < r.committed {
		r.t.Errorf("generation %d: committed %d after %d", r.gen, next, r.committed)
	}
	r.committed = next
	r.genCommits[r.gen] = append(r.genCommits[r.gen], next)
	if next == int64(len(r.msgs)) {
		select {
		case <-r.all:
		default:
			close(r.all)
		}
	}
	return nil
}

// deepMessages are n one-message batches over 16 opportunities of one aggregate, every fourth
// a confirmed repeat; offsets 16 and on send the first ones again (new event ids).
func deepMessages(n int) []kafka.Message {
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		opp := i % 16
		outcome := "passed"
		if opp%4 == 0 {
			outcome = "confirmed_repeat"
		}
		msgs[i] = liveMessage(int64(i), fmt.Sprintf("o%d", opp), outcome)
	}
	return msgs
}

func newDeepRig(t *testing.T, maxInFlight int, fault string, at int64, msgs []kafka.Message) *deepRig {
	t.Helper()
	r := &deepRig{t: t, tr: &trace{}, maxInFlight: maxInFlight, fault: fault, at: at, msgs: msgs,
		model: aggregator.NewModel(30 * 24 * time.Hour), all: make(chan struct{}), procMetrics: NewMetrics(nil)}
	cfg := ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Suite: suite.Config{MinHistory: 1}}
	p, err := NewProcessor(cfg, newTestDecoder(t), deepStore{r}, suite.NewMemory(cfg.Suite), deepPublisher{r}, deepDLQ{r},
		func() time.Time { return now }, zap.NewNop(), r.procMetrics)
	if err != nil {
		t.Fatal(err)
	}
	r.proc = p
	r.group, err = NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: 1,
		Linger: time.Millisecond, MaxInFlight: maxInFlight, DrainTimeout: time.Minute, CommitDelay: 2 * time.Second},
		deepHandler{p, r}, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.group.fatal = func(err error) { r.fatal = err }
	return r
}

// runAll runs generations until every message is committed.
func (r *deepRig) runAll(ctx context.Context) {
	for gen := 0; ; gen++ {
		r.mu.Lock()
		from := r.committed
		r.mu.Unlock()
		if from == int64(len(r.msgs)) {
			return
		}
		if gen == 6 {
			r.t.Fatalf("still at offset %d of %d after %d generations: %s", from, len(r.msgs), gen, r.tr)
		}
		gctx, gcancel := context.WithCancel(ctx)
		r.mu.Lock()
		r.gen, r.gcancel, r.genStart = gen, gcancel, from
		r.published, r.inFlight, r.prepared = map[int64]bool{}, 0, nil
		r.genCommits, r.versions = append(r.genCommits, nil), append(r.versions, nil)
		r.mu.Unlock()
		in := make(chan kafka.Message, len(r.msgs))
		for _, m := range r.msgs[from:] {
			in <- m
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(ctx, gctx, int32(gen), deepCommitter{r}, in)
		}()
		select {
		case <-done:
		case <-r.all:
			gcancel()
			<-done
		}
		gcancel()
		if r.fatal != nil {
			r.t.Fatalf("generation %d: fatal %v", gen, r.fatal)
		}
	}
}

// cleanPass is the aggregate's all-time window after one pass over msgs without faults.
func cleanPass(t *testing.T, msgs []kafka.Message) schemas.Window {
	t.Helper()
	model := aggregator.NewModel(30 * 24 * time.Hour)
	p, err := NewProcessor(ProcessorConfig{}, newTestDecoder(t), &flakyStore{model: model}, suite.NewMemory(suite.Config{}), &recordingPublisher{},
		&recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Handle(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	return model.Tally(deepKey, now).Snapshot(deepKey, now).Windows.All
}

var deepKey = aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "fix", Source: aggregator.Live}

func TestDeepPipelineKeepsItsPromises(t *testing.T) {
	msgs := deepMessages(24)
	want := cleanPass(t, msgs)
	if want.Passed != 12 || want.ConfirmedRepeats != 4 {
		t.Fatalf("clean pass: %+v, want 12 passed and 4 confirmed", want)
	}
	const at = 10
	for _, maxInFlight := range []int{DefaultMaxInFlight, 6, 8} {
		for _, fault := range []string{"", "prepare", "apply", "apply_transient", "seal", "dead_letter", "publish", "verify", "commit", "rebalance"} {
			t.Run(fmt.Sprintf("%d/%s", maxInFlight, fault), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					r := newDeepRig(t, maxInFlight, fault, at, msgs)
					r.runAll(t.Context())

					t.Logf("depth at the fault %d (most %d), commits by generation %v, versions by generation %v", r.depth, r.maxDepth, r.genCommits, r.versions)
					if fault != "" && !r.fired {
						t.Fatalf("the fault never fired: the test tests nothing (%s)", r.tr)
					}
					if fault != "" && r.depth < maxInFlight-1 {
						t.Errorf("%d batches in flight when the fault fired, want at least %d", r.depth, maxInFlight-1)
					}
					if r.maxDepth != maxInFlight {
						t.Errorf("at most %d batches were in flight, want %d (the pipeline never filled, or overfilled)", r.maxDepth, maxInFlight)
					}
					if r.maxPublishing != 1 {
						t.Errorf("%d publishes ran at once, want one at a time", r.maxPublishing)
					}
					rewinds := map[string]bool{"prepare": true, "apply": true, "seal": true, "dead_letter": true, "publish": true, "verify": true}
					if rewinds[fault] {
						if len(r.genCommits) < 2 {
							t.Errorf("the failure did not end the generation: commits %v", r.genCommits)
						}
						for _, c := range r.genCommits[0] {
							if c > at {
								t.Errorf("the failing generation committed %d, past the failed batch %d: %v", c, at, r.genCommits)
							}
						}
					}
					if fault == "" || fault == "apply_transient" {
						if len(r.genCommits) != 1 {
							t.Errorf("%d generations, want 1 (a retried step is not a failure): %v", len(r.genCommits), r.genCommits)
						}
					}
					if fault == "rebalance" {
						// Every batch in flight when the generation ended is drained and committed under it.
						g0 := r.genCommits[0]
						if len(g0) == 0 || g0[len(g0)-1] < at+int64(maxInFlight) {
							t.Errorf("generation 0 ended with commits %v, want its %d batches in flight after offset %d drained and committed", g0, maxInFlight, at)
						}
					}
					// Snapshots reach the publisher in version order within a generation.
					for g, vs := range r.versions {
						for i := 1; i < len(vs); i++ {
							if vs[i] < vs[i-1] {
								t.Errorf("generation %d published versions %v: out of order", g, vs)
								break
							}
						}
					}
					if got := r.model.Tally(deepKey, now).Snapshot(deepKey, now).Windows.All; got.Passed != want.Passed || got.ConfirmedRepeats != want.ConfirmedRepeats {
						t.Errorf("after the redelivery: %d passed, %d confirmed; one clean pass gives %d and %d", got.Passed, got.ConfirmedRepeats, want.Passed, want.ConfirmedRepeats)
					}
					if got := r.lastSnap.Windows.All; got.Passed != want.Passed || got.ConfirmedRepeats != want.ConfirmedRepeats {
						t.Errorf("last snapshot published: %+v", got)
					}
					// Each step timed once per batch that reached it, its retries included, and the
					// one that failed too (TestStepTimedWhenItFails).
					wantSeal := uint64(r.applyOK)
					if fault == "seal" {
						wantSeal++
					}
					if got := stepCount(t, r.procMetrics, "seal"); got != wantSeal {
						t.Errorf("seal step observed %d times for %d applied batches (fault %q)", got, r.applyOK, fault)
					}
					if got := stepCount(t, r.procMetrics, "suite_announce"); got != uint64(r.publishOK) {
						t.Errorf("suite_announce step observed %d times for %d published batches", got, r.publishOK)
					}
					if fault == "" || fault == "apply_transient" {
						if got := stepCount(t, r.procMetrics, "apply"); got != uint64(len(msgs)) {
							t.Errorf("apply step observed %d times for %d batches", got, len(msgs))
						}
					}
				})
			})
		}
	}
}

// A step that fails is time spent too: a publish retried for the whole of its batch's deadline
// (a broker down for 30 s, say) is what repeatrate_batch_step_seconds is there to show ("which
// Redis or Kafka call holds a stage up", retries included). Observed only when the step
// succeeds, that time is in no step at all: the dashboard's "Time in each step" panel reads 0 for
// publish during exactly the outage it should point at, and the rewind it ends in.
func TestStepTimedWhenItFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		metrics := NewMetrics(nil)
		store := &flakyStore{model: aggregator.NewModel(30 * 24 * time.Hour)}
		p, err := NewProcessor(ProcessorConfig{RetryMin: 100 * time.Millisecond, RetryMax: time.Second}, newTestDecoder(t), store,
			suite.NewMemory(suite.Config{}), &failingPublisher{}, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), metrics)
		if err != nil {
			t.Fatal(err)
		}
		b, err := p.Prepare([]kafka.Message{liveMessage(0, "a", "passed")})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Apply(t.Context(), b); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // the batch's deadline
		defer cancel()
		if err := p.Publish(ctx, b); err == nil {
			t.Fatal("publish succeeded against a broker that is down")
		}
		if got := stepCount(t, metrics, "publish"); got != 1 {
			t.Errorf("the publish step, retried for 30 s and failed, was observed %d times, want once (its 30 s are in no step)", got)
		}
		// The steps before it, which succeeded, are observed once each.
		if got := stepCount(t, metrics, "dead_letter"); got != 1 {
			t.Errorf("dead_letter step observed %d times, want 1", got)
		}
		// The steps after it never ran: not observed.
		if got := stepCount(t, metrics, "suite_publish"); got != 0 {
			t.Errorf("suite_publish step observed %d times, want 0: it never ran", got)
		}
	})
}

// failingPublisher never gets anything acknowledged.
type failingPublisher struct{}

func (failingPublisher) Publish(context.Context, []schemas.Snapshot) error {
	return errors.New("broker not available")
}

func (failingPublisher) PublishSuites(context.Context, suite.Output, time.Time) error {
	return errors.New("broker not available")
}

// Each batch's publish must end DrainTimeout after its apply began, but a batch applied ahead
// waits for the publishes of every batch before it: with MaxInFlight batches in flight and
// publishes of P each, the last one applied spends about (MaxInFlight−1) × P of its DrainTimeout
// queueing. A Kafka whose acknowledgements are slow (acks=all with a slow follower) then fails
// the batch at the back of every full pipeline although no publish took anywhere near
// DrainTimeout: the generation ends, the member rejoins and the batches are consumed again, over
// and over. The deadline was meant to bound a drain, not a queue wait. With the default 30 s:
// 8 s publishes pass with 3 in flight and fail with the new default of 4; 4 s publishes pass
// with 4 and fail with 8.
func TestSlowPublishesDoNotRewindADeepPipeline(t *testing.T) {
	msgs := deepMessages(24)
	for _, tc := range []struct {
		maxInFlight int
		publish     time.Duration
	}{
		{3, 8 * time.Second},
		{DefaultMaxInFlight, 4 * time.Second},
		{DefaultMaxInFlight, 8 * time.Second},
		{8, 4 * time.Second},
	} {
		t.Run(fmt.Sprintf("%d/%v", tc.maxInFlight, tc.publish), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newDeepRig(t, tc.maxInFlight, "", -1, msgs)
				r.publishTime = tc.publish
				r.group.cfg.DrainTimeout = 30 * time.Second // the default
				r.runAll(t.Context())
				if len(r.genCommits) != 1 {
					t.Errorf("%d generations for 24 batches with %v publishes (well under DrainTimeout each), want 1: commits by generation %v",
						len(r.genCommits), tc.publish, r.genCommits)
				}
			})
		})
	}
}
