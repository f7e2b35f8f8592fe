package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/schemas"
)

// liveMessage is a live attempt of the one test aggregate, opportunity opp, at offset off of
// partition 0 of topic "in".
func liveMessage(off int64, opp, outcome string) kafka.Message {
	v := strings.NewReplacer(`"id":"e1"`, fmt.Sprintf(`"id":"e%d"`, off), `"opportunity_id":"o"`, `"opportunity_id":"`+opp+`"`,
		`"outcome":"confirmed_repeat"`, `"outcome":"`+outcome+`"`).Replace(structured)
	return kafka.Message{Topic: "in", Partition: 0, Offset: off, Value: []byte(v)}
}

// trace records what the stages did, in order, and lets a test wait for one event.
type trace struct {
	mu      sync.Mutex
	events  []string
	waiting map[string]chan struct{}
}

func (tr *trace) add(format string, a ...any) {
	e := fmt.Sprintf(format, a...)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.events = append(tr.events, e)
	if ch, ok := tr.waiting[e]; ok {
		close(ch)
		delete(tr.waiting, e)
	}
}

// seen returns a channel closed once event e happened.
func (tr *trace) seen(e string) <-chan struct{} {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	ch := make(chan struct{})
	for _, got := range tr.events {
		if got == e {
			close(ch)
			return ch
		}
	}
	if tr.waiting == nil {
		tr.waiting = map[string]chan struct{}{}
	}
	tr.waiting[e] = ch
	return ch
}

func (tr *trace) index(e string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i, got := range tr.events {
		if got == e {
			return i
		}
	}
	return -1
}

func (tr *trace) String() string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return strings.Join(tr.events, ", ")
}

// gateStore applies to the pure model, records each apply by its batch (the first opportunity id)
// and holds an apply until its gate, when it has one, is closed.
type gateStore struct {
	tr    *trace
	model *aggregator.Model
	gates map[string]chan struct{}
	mark  int64
	// behind is how many Verify calls with upTo > 0 report replicas behind before one succeeds.
	behind int
}

func (s *gateStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	b := obs[0].OpportunityID
	s.tr.add("apply %s", b)
	if g, ok := s.gates[b]; ok {
		select {
		case <-g:
		case <-ctx.Done():
			return aggregator.Applied{}, ctx.Err()
		}
	}
	a, err := s.model.Apply(ctx, obs, at)
	s.tr.add("applied %s", b)
	return a, err
}

func (s *gateStore) Seal(context.Context, aggregator.Offsets) (int64, error) {
	s.mark++
	return s.mark, nil
}

func (s *gateStore) Verify(_ context.Context, upTo int64, commit aggregator.Offsets) error {
	if upTo > 0 && s.behind > 0 {
		s.behind--
		s.tr.add("behind %d", commit["in"][0])
		return fmt.Errorf("%w: 0 of 1 replicas", aggregator.ErrReplicasBehind)
	}
	s.tr.add("verify %d up to offset %d", upTo, commit["in"][0])
	return nil
}

func (s *gateStore) CheckOffsets(context.Context, aggregator.Offsets) error { return nil }

// gatePublisher records each acknowledged snapshot and holds (or fails) the publish of a batch
// named by its snapshots' passed+confirmed count.
type gatePublisher struct {
	tr *trace
	// hold is by the all-time scored count of the snapshots; -1 holds suite outputs with revived cases.
	hold   map[int64]func(ctx context.Context) error
	snaps  []schemas.Snapshot
	suites []suite.Output
	mu     sync.Mutex
}

func (p *gatePublisher) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	n := snaps[0].Windows.All.Scored
	p.tr.add("publish %d", n)
	if h, ok := p.hold[n]; ok {
		if err := h(ctx); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.snaps = append(p.snaps, snaps...)
	p.mu.Unlock()
	p.tr.add("published %d", n)
	return nil
}

func (p *gatePublisher) PublishSuites(ctx context.Context, o suite.Output, _ time.Time) error {
	if h, ok := p.hold[-1]; ok && len(o.Revived) > 0 {
		if err := h(ctx); err != nil {
			return err
		}
	}
	p.mu.Lock()
	p.suites = append(p.suites, o)
	p.mu.Unlock()
	return nil
}

// announceTrace is a suite store whose MarkAnnounced calls are traced.
type announceTrace struct {
	SuiteStore
	tr *trace
}

func (s announceTrace) MarkAnnounced(ctx context.Context, k suite.Key, cases []string) error {
	err := s.SuiteStore.MarkAnnounced(ctx, k, cases)
	s.tr.add("announced %v", cases)
	return err
}

// traceHandler is a processor whose Prepare and Apply calls are traced.
type traceHandler struct {
	*Processor
	tr *trace
}

func (h traceHandler) Prepare(msgs []kafka.Message) (*Batch, error) {
	b, err := h.Processor.Prepare(msgs)
	h.tr.add("prepared %d", msgs[0].Offset)
	return b, err
}

func (h traceHandler) Apply(ctx context.Context, b *Batch) error {
	h.tr.add("apply begins %d", b.Messages()[0].Offset)
	return h.Processor.Apply(ctx, b)
}

// commitLog is a generation's committer that records every commit.
type commitLog struct {
	tr      *trace
	mu      sync.Mutex
	commits []int64
}

func (c *commitLog) CommitOffsets(offsets map[string]map[int]int64) error {
	c.mu.Lock()
	c.commits = append(c.commits, offsets["in"][0])
	c.mu.Unlock()
	c.tr.add("commit %d", offsets["in"][0])
	return nil
}

// pipelineRig runs the group's batch loop over messages without Kafka: one message per batch.
type pipelineRig struct {
	tr     *trace
	store  *gateStore
	pub    *gatePublisher
	group  *Group
	commit *commitLog
	fatal  error
}

func newPipelineRig(t *testing.T, maxInFlight int, store *gateStore, pub *gatePublisher) *pipelineRig {
	t.Helper()
	tr := store.tr
	cfg := ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Suite: suite.Config{MinHistory: 1}}
	p, err := NewProcessor(cfg, newTestDecoder(t), store, announceTrace{suite.NewMemory(cfg.Suite), tr},
		pub, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r := &pipelineRig{tr: tr, store: store, pub: pub, commit: &commitLog{tr: tr}}
	r.group, err = NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: 1,
		Linger: time.Millisecond, MaxInFlight: maxInFlight, DrainTimeout: 10 * time.Minute}, traceHandler{p, tr}, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.group.fatal = func(err error) { r.fatal = err }
	return r
}

// run starts one generation's batch loop over msgs; the returned channel closes when it returned.
func (r *pipelineRig) run(ctx context.Context, msgs []kafka.Message) <-chan struct{} {
	in := make(chan kafka.Message, len(msgs))
	for _, m := range msgs {
		in <- m
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.group.batches(ctx, ctx, 1, r.commit, in)
	}()
	return done
}

// within waits for ch for at most d of fake time: the bubble's clock only moves when every
// goroutine is blocked, so d passing means ch cannot close without the test's help.
func within(ch <-chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// The stages of consecutive batches overlap: batch 1 is decoded while Redis applies batch 0, and
// applied while batch 0 is being published; batch 1 is still published only after batch 0 was
// acknowledged, and each batch's offsets are committed only after its publish and a Verify. With
// MaxInFlight 1 the stages run one after another, as before the pipeline.
func TestPipelineOverlapsStages(t *testing.T) {
	for _, tc := range []struct {
		maxInFlight int
		overlap     bool
	}{
		{1, false}, // one batch at a time: the old loop
		{2, true},
		{3, true},
	} {
		t.Run(fmt.Sprint(tc.maxInFlight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &trace{}
				applyGate := make(chan struct{})
				store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour), gates: map[string]chan struct{}{"a": applyGate}}
				pub := &gatePublisher{tr: tr, hold: map[int64]func(context.Context) error{
					// Batch 0's publish waits until batch 1 was applied (or a minute, without overlap),
					// then lingers so that a publish of batch 1 running beside it would finish first.
					1: func(ctx context.Context) error {
						within(tr.seen("applied b"), time.Minute)
						time.Sleep(time.Second)
						return nil
					},
				}}
				r := newPipelineRig(t, tc.maxInFlight, store, pub)
				ctx, cancel := context.WithCancel(t.Context())
				done := r.run(ctx, []kafka.Message{liveMessage(0, "a", "passed"), liveMessage(1, "b", "confirmed_repeat")})

				<-tr.seen("apply a")
				if got := within(tr.seen("prepared 1"), time.Minute); got != tc.overlap {
					t.Fatalf("batch 1 decoded while batch 0 is being applied: %v, want %v (%s)", got, tc.overlap, tr)
				}
				close(applyGate)
				if !within(tr.seen("commit 2"), time.Hour) {
					t.Fatalf("batch 1 not committed: %s (fatal %v)", tr, r.fatal)
				}
				cancel()
				<-done

				if r.fatal != nil {
					t.Fatal(r.fatal)
				}
				appliedDuringPublish := tr.index("applied b") < tr.index("published 1")
				if appliedDuringPublish != tc.overlap {
					t.Errorf("batch 1 applied while batch 0 was being published: %v, want %v (%s)", appliedDuringPublish, tc.overlap, tr)
				}
				// Publishes are one at a time, in batch order: never 1 before 0 is acknowledged.
				if tr.index("publish 2") < tr.index("published 1") {
					t.Errorf("batch 1's publish began before batch 0's was acknowledged: %s", tr)
				}
				var versions []int64
				for _, s := range pub.snaps {
					versions = append(versions, s.Version)
				}
				if len(versions) != 2 || versions[1] <= versions[0] || pub.snaps[1].Windows.All.Scored != 2 {
					t.Errorf("snapshots of the aggregate acknowledged in order %v (scored %d last), want increasing versions", versions, pub.snaps[len(pub.snaps)-1].Windows.All.Scored)
				}
				// Every commit follows its batch's publish and a Verify, and offsets only grow.
				for _, c := range r.commit.commits {
					if tr.index(fmt.Sprintf("commit %d", c)) < tr.index(fmt.Sprintf("published %d", c)) {
						t.Errorf("offset %d committed before its batch was published: %s", c, tr)
					}
				}
				// Each commit follows a Verify of the same offsets: the commit itself is sent from
				// a goroutine of its own, so the next batch's events may come between the two.
				for _, c := range r.commit.commits {
					v := slices.IndexFunc(tr.events, func(e string) bool {
						return strings.HasPrefix(e, "verify ") && strings.HasSuffix(e, fmt.Sprintf(" up to offset %d", c))
					})
					if v < 0 || v > tr.index(fmt.Sprintf("commit %d", c)) {
						t.Errorf("offset %d committed without a Verify of it before: %s", c, tr)
					}
				}
				// Each commit is timed: it holds up the next Apply.
				reg := prometheus.NewPedanticRegistry()
				reg.MustRegister(r.group.metrics.StageSeconds)
				families, err := reg.Gather()
				if err != nil {
					t.Fatal(err)
				}
				var timed uint64
				for _, f := range families {
					for _, m := range f.GetMetric() {
						if l := m.GetLabel(); len(l) == 1 && l[0].GetValue() == "commit" {
							timed = m.GetHistogram().GetSampleCount()
						}
					}
				}
				if len(r.commit.commits) == 0 || timed < uint64(len(r.commit.commits)) {
					t.Errorf("commit stage timed %d times for %d commits", timed, len(r.commit.commits))
				}
			})
		})
	}
}

// A publish that fails for batch 0 after batch 1 was already applied: neither batch is committed,
// the loop ends (so the generation ends and both are consumed again), and consuming them again
// leaves the counts of one clean pass.
func TestPipelinePublishFailureCommitsNeither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		broken := true
		pub := &gatePublisher{tr: tr, hold: map[int64]func(context.Context) error{
			1: func(ctx context.Context) error {
				if !broken {
					return nil
				}
				within(tr.seen("applied b"), time.Minute)
				return errors.New("broker not available")
			},
		}}
		msgs := []kafka.Message{liveMessage(0, "a", "passed"), liveMessage(1, "b", "confirmed_repeat"), liveMessage(2, "c", "passed")}
		r := newPipelineRig(t, 3, store, pub)
		<-r.run(t.Context(), msgs) // ends by itself: the failure ends the generation
		if r.fatal != nil {
			t.Fatalf("a publish failure is not fatal: %v", r.fatal)
		}
		if tr.index("applied b") < 0 {
			t.Fatalf("batch 1 was not applied before batch 0's publish failed; the test tests nothing: %s", tr)
		}
		if len(r.commit.commits) != 0 || tr.index("published 2") >= 0 {
			t.Fatalf("committed %v / published batch 1 after batch 0 failed: %s", r.commit.commits, tr)
		}

		// The next generation consumes both again (nothing was committed) and finishes them.
		broken = false
		ctx, cancel := context.WithCancel(t.Context())
		done := r.run(ctx, msgs)
		<-tr.seen("commit 3")
		cancel()
		<-done
		if r.fatal != nil {
			t.Fatal(r.fatal)
		}
		k := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "fix", Source: aggregator.Live}
		if w := store.model.Tally(k, now).Snapshot(k, now).Windows.All; w.Passed != 2 || w.ConfirmedRepeats != 1 {
			t.Fatalf("after the redelivery: %d passed, %d confirmed; one clean pass gives 2 and 1", w.Passed, w.ConfirmedRepeats)
		}
		last := pub.snaps[len(pub.snaps)-1].Windows.All
		if last.Passed != 2 || last.ConfirmedRepeats != 1 {
			t.Fatalf("last snapshot published: %+v", last)
		}
	})
}

// Replicas that have not acknowledged the writes yet hold the commit back without a rewind: the
// batches stay pending, nothing is applied twice, and the commit that follows once they caught up
// covers every batch.
func TestPipelineCommitWaitsForReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour), behind: 3}
		r := newPipelineRig(t, 3, store, &gatePublisher{tr: tr})
		ctx, cancel := context.WithCancel(t.Context())
		done := r.run(ctx, []kafka.Message{liveMessage(0, "a", "passed"), liveMessage(1, "b", "confirmed_repeat"), liveMessage(2, "c", "passed")})
		if !within(tr.seen("commit 3"), time.Hour) {
			t.Fatalf("never committed: %s (fatal %v)", tr, r.fatal)
		}
		cancel()
		<-done
		if r.fatal != nil {
			t.Fatal(r.fatal)
		}
		if store.behind != 0 {
			t.Fatalf("%d replica shortfalls left: the test tests nothing (%s)", store.behind, tr)
		}
		for _, b := range []string{"a", "b", "c"} {
			n := 0
			for _, e := range tr.events {
				if e == "apply "+b {
					n++
				}
			}
			if n != 1 {
				t.Errorf("batch %s applied %d times, want once: a shortfall must not rewind (%s)", b, n, tr)
			}
		}
		for i, e := range tr.events {
			if strings.HasPrefix(e, "commit ") && !strings.HasPrefix(tr.events[i-1], "verify ") {
				t.Errorf("%s without a successful Verify right before it: %s", e, tr)
			}
		}
	})
}

// A batch that announces a revived case is published, and the case marked announced, before the
// next batch is applied: applied in between, the next batch would read the case as not announced
// and announce it a second time.
func TestPipelineWaitsForAnnouncedRevivedCases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		pub := &gatePublisher{tr: tr, hold: map[int64]func(context.Context) error{
			// The revived case's publish gives batch 2 every chance to be applied beside it.
			-1: func(context.Context) error { within(tr.seen("apply begins 2"), time.Minute); return nil },
		}}
		msgs := []kafka.Message{
			evalMessage("r1", "v1", 1, "pass", "yes"),
			evalMessage("r2", "v2", 2, "fail", "no"), // pass → fail: revived
			evalMessage("r3", "v3", 3, "fail", "no"), // still revived, already announced
		}
		for i := range msgs {
			msgs[i].Offset = int64(i)
		}
		r := newPipelineRig(t, 3, store, pub)
		ctx, cancel := context.WithCancel(t.Context())
		done := r.run(ctx, msgs)
		if !within(tr.seen("commit 3"), time.Hour) {
			t.Fatalf("not all committed: %s", tr)
		}
		cancel()
		<-done
		if tr.index("apply begins 2") < tr.index("announced [k]") {
			t.Errorf("batch 2 applied before batch 1's revived case was marked announced: %s", tr)
		}
		revived := 0
		for _, o := range pub.suites {
			revived += len(o.Revived)
		}
		if revived != 1 {
			t.Errorf("revived case announced %d times, want once: %s", revived, tr)
		}
	})
}

// A batch closes once its keys and values reach MaxBatchBytes, however many messages MaxBatch
// would still take and however long Linger would still wait: large messages cannot pile up a
// batch of MaxBatch times their size.
func TestBatchClosesAtMaxBatchBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		r := newPipelineRig(t, 1, store, &gatePublisher{tr: tr})
		var msgs []kafka.Message
		for i := range 5 {
			msgs = append(msgs, liveMessage(int64(i), fmt.Sprint("o", i), "passed"))
		}
		r.group.cfg.MaxBatch, r.group.cfg.Linger = 100, time.Hour
		r.group.cfg.MaxBatchBytes = len(msgs[0].Value) + 1 // reached by the second message
		ctx, cancel := context.WithCancel(t.Context())
		done := r.run(ctx, msgs)
		if !within(tr.seen("commit 4"), 10*time.Minute) {
			t.Fatalf("batches of two not committed: %s", tr)
		}
		cancel()
		<-done
		for _, first := range []int{0, 2} {
			if tr.index(fmt.Sprint("prepared ", first)) < 0 {
				t.Errorf("no batch began at offset %d: %s", first, tr)
			}
		}
		if tr.index("prepared 1") >= 0 || tr.index("prepared 3") >= 0 {
			t.Errorf("a batch began inside a pair: %s", tr)
		}
	})
}

// A batch past its linger keeps filling while the batch before it waits for the apply stage: it
// could not be applied sooner, and a larger batch spreads Redis's per-call cost. Here batch 0's
// apply waits at a gate, batch 1 waits for the apply stage, and messages 2..5 arrive 20 ms apart
// (each past a linger of 10 ms): they make one batch, not four. Once the gate opens, everything
// is committed.
func TestBatchGrowsWhileTheOneBeforeWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		applyGate := make(chan struct{})
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour), gates: map[string]chan struct{}{"a": applyGate}}
		r := newPipelineRig(t, 3, store, &gatePublisher{tr: tr})
		r.group.cfg.MaxBatch, r.group.cfg.Linger = 100, 10*time.Millisecond
		ctx, cancel := context.WithCancel(t.Context())
		in := make(chan kafka.Message, 10)
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(ctx, ctx, 1, r.commit, in)
		}()
		in <- liveMessage(0, "a", "passed")
		<-tr.seen("apply a")
		in <- liveMessage(1, "b", "passed")
		<-tr.seen("prepared 1")
		for i := 2; i < 6; i++ {
			time.Sleep(20 * time.Millisecond)
			in <- liveMessage(int64(i), fmt.Sprint("c", i), "passed")
		}
		time.Sleep(time.Second)
		if tr.index("prepared 2") >= 0 {
			t.Errorf("batch 2 closed while batch 1 still waited for the apply stage: %s", tr)
		}
		close(applyGate)
		if !within(tr.seen("commit 6"), time.Hour) {
			t.Fatalf("not all committed: %s (fatal %v)", tr, r.fatal)
		}
		cancel()
		<-done
		if tr.index("prepared 2") < 0 {
			t.Fatalf("no batch began with message 2: %s", tr)
		}
		for i := 3; i < 6; i++ {
			if tr.index(fmt.Sprint("prepared ", i)) >= 0 {
				t.Errorf("message %d began a batch of its own: %s", i, tr)
			}
		}
	})
}
