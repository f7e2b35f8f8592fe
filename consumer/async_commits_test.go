package consumer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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

// Adversarial tests of the asynchronous offset commits (cf13f49) and the reuse of batch message
// slices (84db456). Every helper here is prefixed commitsRig.

// commitsKey is the one aggregate every liveMessage counts toward.
var commitsKey = aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"},
	CorrectionID: "fix", Source: aggregator.Live}

// commitsStore is a gateStore with faults injected by batch and by Verify call, and a record of the
// offsets each successful Verify recorded beside mark (what aggregator.Redis keeps in its offsets
// hash, which CheckOffsets compares committed offsets against).
type commitsStore struct {
	*gateStore
	mu sync.Mutex
	// applyErr fails the Apply of the batch whose first opportunity is the key, once.
	applyErr map[string]error
	// applyHook runs before an Apply of the batch whose first opportunity is the key.
	applyHook map[string]func()
	// verifyErr answers the n-th Verify that commits something (upTo > 0), 1-based.
	verifyErr map[int]error
	verifies  int
	recorded  map[int64]int64 // mark -> partition 0 offset recorded by Verify
	seals     int64
}

func newCommitsStore(tr *trace) *commitsStore {
	return &commitsStore{gateStore: &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)},
		applyErr: map[string]error{}, applyHook: map[string]func(){}, verifyErr: map[int]error{}, recorded: map[int64]int64{}}
}

func (s *commitsStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	b := obs[0].OpportunityID
	s.mu.Lock()
	hook := s.applyHook[b]
	err := s.applyErr[b]
	delete(s.applyErr, b)
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		s.tr.add("lost at apply %s", b)
		return aggregator.Applied{}, err
	}
	return s.gateStore.Apply(ctx, obs, at)
}

func (s *commitsStore) Seal(ctx context.Context, _ aggregator.Offsets) (int64, error) {
	s.mu.Lock()
	s.seals++
	s.mu.Unlock()
	return s.gateStore.Seal(ctx, nil)
}

func (s *commitsStore) Verify(ctx context.Context, upTo int64, commit aggregator.Offsets) error {
	if upTo > 0 {
		s.mu.Lock()
		s.verifies++
		err := s.verifyErr[s.verifies]
		s.mu.Unlock()
		if err != nil {
			s.tr.add("verify failed %d up to offset %d: %v", upTo, commit["in"][0], err)
			return err
		}
	}
	if err := s.gateStore.Verify(ctx, upTo, commit); err != nil {
		return err
	}
	if upTo > 0 {
		s.mu.Lock()
		s.recorded[upTo] = commit["in"][0]
		s.mu.Unlock()
	}
	return nil
}

// survivingRecord is the newest offset recorded by a Verify of a mark below lostFrom: what the
// store still holds once every mark from lostFrom on was lost.
func (s *commitsStore) survivingRecord(lostFrom int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rec int64
	for mark, off := range s.recorded {
		if mark < lostFrom {
			rec = max(rec, off)
		}
	}
	return rec
}

// commitsCommitter commits under one generation: each call is numbered (1-based), may wait for a
// gate, take time, or fail, and is traced as "commit begins N", then "commit N" or "commit failed N"
// (N the offset of partition 0).
type commitsCommitter struct {
	tr    *trace
	mu    sync.Mutex
	calls []map[string]map[int]int64
	ok    []map[string]map[int]int64
	gate  map[int]chan struct{}
	fail  map[int]error
	delay func(n int) time.Duration
}

func newCommitsCommitter(tr *trace) *commitsCommitter {
	return &commitsCommitter{tr: tr, gate: map[int]chan struct{}{}, fail: map[int]error{}}
}

func (c *commitsCommitter) CommitOffsets(offsets map[string]map[int]int64) error {
	cp := map[string]map[int]int64{}
	for t, ps := range offsets {
		cp[t] = map[int]int64{}
		for p, o := range ps {
			cp[t][p] = o
		}
	}
	c.mu.Lock()
	c.calls = append(c.calls, cp)
	n := len(c.calls)
	gate, err := c.gate[n], c.fail[n]
	c.mu.Unlock()
	off := offsets["in"][0]
	c.tr.add("commit begins %d", off)
	if gate != nil {
		<-gate
	}
	if c.delay != nil {
		time.Sleep(c.delay(n))
	}
	if err != nil {
		c.tr.add("commit failed %d", off)
		return err
	}
	c.mu.Lock()
	c.ok = append(c.ok, cp)
	c.mu.Unlock()
	c.tr.add("commit %d", off)
	return nil
}

func (c *commitsCommitter) made() (calls, ok []map[string]map[int]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls), slices.Clone(c.ok)
}

// commitsRig is one group with its processor over an commitsStore.
type commitsRig struct {
	tr    *trace
	store *commitsStore
	pub   *gatePublisher
	dlq   *recordingDLQ
	group *Group
	mu    sync.Mutex
	fatal error
}

func newCommitsRig(t *testing.T, maxInFlight, maxBatch int, commitDelay time.Duration) *commitsRig {
	t.Helper()
	tr := &trace{}
	r := &commitsRig{tr: tr, store: newCommitsStore(tr), pub: &gatePublisher{tr: tr}, dlq: &recordingDLQ{}}
	cfg := ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Suite: suite.Config{MinHistory: 1}}
	p, err := NewProcessor(cfg, newTestDecoder(t), r.store, announceTrace{suite.NewMemory(cfg.Suite), tr},
		r.pub, r.dlq, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.group, err = NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: maxBatch,
		Linger: time.Millisecond, MaxInFlight: maxInFlight, DrainTimeout: 10 * time.Minute, CommitDelay: commitDelay},
		traceHandler{p, tr}, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.group.fatal = func(err error) {
		r.mu.Lock()
		r.fatal = err
		r.mu.Unlock()
		tr.add("fatal")
	}
	return r
}

func (r *commitsRig) fatalErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fatal
}

// run starts one generation's batch loop; the channel closes when batches returned.
func (r *commitsRig) run(ctx, gctx context.Context, c committer, in <-chan kafka.Message) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.group.batches(ctx, gctx, 1, c, in)
	}()
	return done
}

func (r *commitsRig) passed() int64 {
	return r.store.model.Tally(commitsKey, now).Snapshot(commitsKey, now).Windows.All.Passed
}

func commitsFeed(msgs []kafka.Message) chan kafka.Message {
	in := make(chan kafka.Message, len(msgs)+1)
	for _, m := range msgs {
		in <- m
	}
	return in
}

// commitsCommitted is the newest offset committed per partition of topic "in".
func commitsCommitted(ok []map[string]map[int]int64) map[int]int64 {
	got := map[int]int64{}
	for _, call := range ok {
		for p, o := range call["in"] {
			got[p] = max(got[p], o)
		}
	}
	return got
}

func commitsLive(n int) []kafka.Message {
	var msgs []kafka.Message
	for i := range n {
		msgs = append(msgs, liveMessage(int64(i), fmt.Sprint("o", i), "passed"))
	}
	return msgs
}

// ---------------------------------------------------------------------------------------------
// Commits

// BUG (cf13f49): a commit queued behind a slow one is still sent after the store reported that the
// work it stands for was lost. Batch a's commit waits for the broker; batch b is applied,
// published and verified (mark 2), its commit queued; then batch c's Apply (subtest "seal") or the
// next Verify (subtest "verify") finds the loss of mark 2: ErrStateLost, the group stops. When the
// broker answers, the committing goroutine sends b's offsets anyway. Before cf13f49 a commit was
// made on the apply goroutine right after its Verify, so no commit could ever follow the discovery
// that its work was gone; the docs still say "a loss of uncommitted work ends the generation without
// committing". The cost: Kafka now holds offset 2 while the store's surviving record of committed
// offsets (written by the Verify of mark 1) says 1, so the next start's CheckOffsets fails with
// "redis state lost … run repeatrate rebuild", where not sending the queued commit would have
// let a restart consume again from offset 1 and recover by itself.
func TestQueuedCommitSentAfterItsWorkWasFoundLost(t *testing.T) {
	for _, where := range []string{"seal", "verify"} {
		t.Run(where, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newCommitsRig(t, 1, 1, 0)
				tr := r.tr
				lost := fmt.Errorf("%w: mark 2 missing", aggregator.ErrStateLost)
				event := "lost at apply o2"
				if where == "seal" {
					r.store.applyErr["o2"] = lost
				} else {
					r.store.verifyErr[3] = lost // the Verify of batch c, after a's and b's
					event = "fatal"
				}
				c := newCommitsCommitter(tr)
				c.gate[1] = make(chan struct{})
				done := r.run(t.Context(), t.Context(), c, commitsFeed(commitsLive(3)))
				// On the pre-change code the first commit holds the apply loop, and the loss is
				// found only after the gate opens; on the current code it is found while a's commit
				// still waits for the broker and b's is queued behind it.
				foundFirst := within(tr.seen(event), time.Hour)
				// The store traces the loss just before Apply returns it; the group acts on it a
				// moment later, on its own goroutine. Opening the gate at the trace raced with
				// that (a -race run of the package sent b's commit in between, once): the promise
				// is about commits sent after the group found the loss, so let it act first.
				synctest.Wait()
				close(c.gate[1])
				if !within(done, time.Hour) {
					t.Fatalf("the batch loop did not return: %s", tr)
				}
				if !errors.Is(r.fatalErr(), ErrFatal) {
					t.Fatalf("a loss of verified work did not stop the group: %v (%s)", r.fatalErr(), tr)
				}
				if !foundFirst && tr.index(event) < 0 {
					t.Fatalf("the loss was never found: the test tests nothing (%s)", tr)
				}
				// The group acted on the loss at "fatal" (it abandons the queue first): a commit
				// begun before that was on its way when the loss was found, one begun after it is
				// the bug. Scheduling decides which of a's and b's commits began before.
				loss := tr.index("fatal")
				calls, _ := c.made()
				for _, call := range calls {
					off := call["in"][0]
					if b := tr.index(fmt.Sprintf("commit begins %d", off)); b > loss {
						t.Errorf("offset %d was sent to Kafka after the group found its work lost (%q): Kafka now holds %d "+
							"while the store's surviving record of committed offsets is %d, so the next start fails CheckOffsets "+
							"and needs a rebuild; trace: %s", off, event, off, r.store.survivingRecord(2), tr)
					}
				}
			})
		})
	}
}

// Nothing queued behind a failed commit is sent, however many are queued (the queue holds 4), and
// the loop ends without stopping the group; a generation that consumes again from the last
// successful commit gets the counts of one clean pass.
func TestFailedCommitDropsEveryQueuedOne(t *testing.T) {
	for _, failAt := range []int{1, 2, 3} {
		t.Run(fmt.Sprint("fail call ", failAt), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 12
				r := newCommitsRig(t, 2, 1, 0)
				tr := r.tr
				c := newCommitsCommitter(tr)
				c.gate[failAt] = make(chan struct{})
				c.fail[failAt] = errors.New("not coordinator")
				msgs := commitsLive(n)
				done := r.run(t.Context(), t.Context(), c, commitsFeed(msgs))
				// Let the apply loop run ahead while the failing commit waits: commits queue up.
				within(tr.seen(fmt.Sprint("published ", n)), time.Hour)
				close(c.gate[failAt])
				if !within(done, time.Hour) {
					t.Fatalf("the batch loop did not end after a failed commit: %s", tr)
				}
				if err := r.fatalErr(); err != nil {
					t.Fatalf("a failed commit stopped the group: %v", err)
				}
				calls, ok := c.made()
				if len(calls) != failAt {
					t.Fatalf("%d commits tried, want %d (none after the failed one): %s", len(calls), failAt, tr)
				}
				if f := tr.index(fmt.Sprintf("commit failed %d", calls[failAt-1]["in"][0])); f < 0 || f != len(tr.events)-1 &&
					slices.ContainsFunc(tr.events[f+1:], func(e string) bool { return strings.HasPrefix(e, "commit") }) {
					t.Fatalf("a commit event after the failure: %s", tr)
				}
				// Consume again from the last successful commit.
				var from int64
				if len(ok) > 0 {
					from = ok[len(ok)-1]["in"][0]
				}
				ctx, cancel := context.WithCancel(t.Context())
				c2 := newCommitsCommitter(tr)
				done = r.run(ctx, ctx, c2, commitsFeed(msgs[from:]))
				if !within(tr.seen(fmt.Sprint("commit ", n)), time.Hour) {
					t.Fatalf("the redelivery did not commit every offset: %s", tr)
				}
				cancel()
				<-done
				if got := r.passed(); got != n {
					t.Fatalf("after the redelivery %d passed, one clean pass gives %d", got, n)
				}
			})
		})
	}
}

// A commit failure and an Apply failure (a rewind) meet, in either order: the loop ends, no Verify
// follows the failed Apply, nothing is committed after the failed commit, the group is not stopped.
func TestCommitFailureRacesApplyFailure(t *testing.T) {
	for _, order := range []string{"commit first", "apply first", "together"} {
		t.Run(order, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 8
				r := newCommitsRig(t, 3, 1, 0)
				tr := r.tr
				c := newCommitsCommitter(tr)
				c.gate[1] = make(chan struct{})
				c.fail[1] = errors.New("rebalance in progress")
				applyGate := make(chan struct{})
				r.store.applyErr["o4"] = fmt.Errorf("%w: token replaced", aggregator.ErrWritesLost)
				r.store.applyHook["o4"] = func() { <-applyGate }
				done := r.run(t.Context(), t.Context(), c, commitsFeed(commitsLive(n)))
				if !within(tr.seen("apply begins 4"), time.Hour) {
					// Before cf13f49 the first commit holds the apply loop: its failure comes first.
					t.Logf("the apply loop waits for the first commit (the pre-cf13f49 behaviour): %s", tr)
					order = "commit first"
				}
				switch order {
				case "commit first":
					close(c.gate[1])
					within(tr.seen(fmt.Sprintf("commit failed %d", 1)), time.Hour)
					time.Sleep(time.Second)
					close(applyGate)
				case "apply first":
					close(applyGate)
					within(tr.seen("lost at apply o4"), time.Hour)
					time.Sleep(time.Second)
					close(c.gate[1])
				default:
					close(applyGate)
					close(c.gate[1])
				}
				if !within(done, time.Hour) {
					t.Fatalf("the batch loop did not return: %s", tr)
				}
				if err := r.fatalErr(); err != nil {
					t.Fatalf("neither failure is fatal: %v", err)
				}
				// At most the failed first commit is tried, and none is made. None is tried when
				// the apply loop took batch 4 before it took batch 1 back from publish (its
				// select picks at random among ready channels; seen on a loaded machine): the
				// commit of batch 1 is then queued only after Apply(o4) failed, and never sent.
				calls, ok := c.made()
				if len(calls) > 1 || len(ok) > 0 {
					t.Errorf("commits tried %v, made %v; want at most the failed first one, none made: %s", calls, ok, tr)
				}
				if a := tr.index("lost at apply o4"); a >= 0 {
					for _, e := range tr.events[a+1:] {
						if strings.HasPrefix(e, "verify") {
							t.Errorf("Verify after a failed Apply (%q): %s", e, tr)
						}
					}
				}
			})
		})
	}
}

// ErrNotYet and ErrRewind from Verify while an earlier commit still waits for the broker: the
// earlier, verified commit is still made (the generation waits for it), nothing unverified is
// committed, commits never go backwards, and the redelivery gives one clean pass.
func TestVerifyAnswersWhileCommitInFlight(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"not yet", fmt.Errorf("%w: 0 of 1 replicas", aggregator.ErrReplicasBehind)},
		{"rewind", fmt.Errorf("%w: mark 3 missing", aggregator.ErrWritesLost)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 6
				r := newCommitsRig(t, 2, 1, 0)
				tr := r.tr
				r.store.verifyErr[2] = tc.err
				r.store.verifyErr[3] = tc.err
				c := newCommitsCommitter(tr)
				c.gate[1] = make(chan struct{})
				msgs := commitsLive(n)
				ctx, cancel := context.WithCancel(t.Context())
				done := r.run(ctx, ctx, c, commitsFeed(msgs))
				if !within(tr.seen("commit begins 1"), time.Hour) {
					t.Fatalf("no first commit: %s", tr)
				}
				within(tr.seen("verify failed 2 up to offset 2: "+tc.err.Error()), time.Hour)
				if tc.name == "rewind" && within(done, time.Hour) {
					t.Fatalf("the loop returned before the verified commit was answered: %s", tr)
				}
				close(c.gate[1])
				if tc.name == "not yet" {
					if !within(tr.seen(fmt.Sprint("commit ", n)), time.Hour) {
						t.Fatalf("not everything committed once replicas caught up: %s", tr)
					}
					cancel()
				}
				if !within(done, time.Hour) {
					t.Fatalf("the loop did not return: %s", tr)
				}
				cancel()
				if err := r.fatalErr(); err != nil {
					t.Fatal(err)
				}
				calls, ok := c.made()
				if len(calls) == 0 || calls[0]["in"][0] != 1 || len(ok) == 0 {
					t.Fatalf("the verified first commit was not made: %v (%s)", calls, tr)
				}
				for i := 1; i < len(calls); i++ {
					if calls[i]["in"][0] <= calls[i-1]["in"][0] {
						t.Errorf("commits go backwards or repeat: %v", calls)
					}
				}
				for _, call := range calls {
					off := call["in"][0]
					v := slices.IndexFunc(tr.events, func(e string) bool {
						return strings.HasPrefix(e, "verify ") && strings.HasSuffix(e, fmt.Sprint(" up to offset ", off))
					})
					if v < 0 || v > tr.index(fmt.Sprint("commit begins ", off)) {
						t.Errorf("offset %d committed without a successful Verify of it first: %s", off, tr)
					}
				}
				if tc.name == "rewind" {
					if len(calls) != 1 {
						t.Fatalf("after a rewind only the commit verified before it may be made: %v (%s)", calls, tr)
					}
					r.store.mu.Lock()
					clear(r.store.verifyErr)
					r.store.mu.Unlock()
					ctx, cancel := context.WithCancel(t.Context())
					c2 := newCommitsCommitter(tr)
					done = r.run(ctx, ctx, c2, commitsFeed(msgs[1:]))
					if !within(tr.seen(fmt.Sprint("commit ", n)), time.Hour) {
						t.Fatalf("the redelivery did not commit every offset: %s", tr)
					}
					cancel()
					<-done
				}
				if got := r.passed(); got != n {
					t.Fatalf("%d passed, one clean pass gives %d", got, n)
				}
			})
		})
	}
}

// The generation ends (gctx, a rebalance) while a commit waits for the broker and more are queued:
// the batch in hand is finished and committed under this generation, after the queued ones and in
// order, and batches returns only once every one was answered.
func TestGenerationEndsWhileCommitBlocked(t *testing.T) {
	for _, n := range []int{5, 12} { // 5: every commit fits the queue; 12: the loop waits for room
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newCommitsRig(t, 3, 1, 0)
				tr := r.tr
				c := newCommitsCommitter(tr)
				c.gate[1] = make(chan struct{})
				gctx, endGen := context.WithCancel(t.Context())
				in := commitsFeed(commitsLive(n))
				done := r.run(t.Context(), gctx, c, in)
				all := within(tr.seen(fmt.Sprint("published ", n)), time.Hour)
				endGen()
				if within(done, time.Hour) {
					t.Fatalf("batches returned while a commit it allowed was still unanswered: %s", tr)
				}
				close(c.gate[1])
				if !within(done, time.Hour) {
					t.Fatalf("batches did not return once the broker answered: %s", tr)
				}
				calls, ok := c.made()
				if len(ok) != len(calls) || len(ok) == 0 {
					t.Fatalf("commits %v, want every one made: %s", calls, tr)
				}
				last := ok[len(ok)-1]["in"][0]
				if all && last != int64(n) {
					t.Errorf("last commit %d, want 5: %s", last, tr)
				}
				for _, e := range tr.events {
					var o int64
					if _, err := fmt.Sscanf(e, "published %d", &o); err == nil && o > last {
						t.Errorf("batch up to %d published but the generation ended with a commit of %d: %s", o, last, tr)
					}
				}
				for i := 1; i < len(calls); i++ {
					if calls[i]["in"][0] <= calls[i-1]["in"][0] {
						t.Errorf("commits go backwards or repeat: %v", calls)
					}
				}
			})
		})
	}
}

// With a broker slow to answer every commit (10 s each, commit delay 1 s) the apply loop runs
// ahead until the queue is full, then waits (back-pressure, not an unbounded backlog); a clean
// shutdown still commits the batch in hand, last, in order. The time from the cancel to the return
// is logged: it is up to the queue's length of broker answers (before cf13f49: at most two).
func TestShutdownWithFullCommitQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 40
		r := newCommitsRig(t, 4, 1, time.Second)
		tr := r.tr
		c := newCommitsCommitter(tr)
		c.delay = func(int) time.Duration { return 10 * time.Second }
		ctx, cancel := context.WithCancel(t.Context())
		in := make(chan kafka.Message, n)
		done := r.run(ctx, ctx, c, in)
		for _, m := range commitsLive(n) {
			in <- m
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(20 * time.Second)
		// The committer waits on the broker: at most the queue (4) plus the commit being made
		// plus one Verify the loop waits to queue may be outstanding.
		var verified, begun int
		for _, e := range strings.Split(tr.String(), ", ") {
			switch {
			case strings.HasPrefix(e, "verify "):
				verified++
			case strings.HasPrefix(e, "commit begins"):
				begun++
			}
		}
		if verified-begun > 5 {
			t.Errorf("%d verified commits wait for the broker beyond the one being made: the queue does not hold the loop back (%s)", verified-begun, tr)
		}
		cancelled := time.Now()
		cancel()
		if !within(done, time.Hour) {
			t.Fatalf("shutdown did not end: %s", tr)
		}
		took := time.Since(cancelled)
		t.Logf("shutdown took %v with a broker answering in 10 s", took)
		// Bounded by the queue: the commit being made, 4 queued and the final one (plus the
		// final commit's wait for its CommitDelay).
		if took > 6*10*time.Second+time.Second {
			t.Errorf("shutdown took %v, more than the commit queue's bound of six broker answers", took)
		}
		calls, ok := c.made()
		if len(ok) != len(calls) {
			t.Fatalf("a commit failed: %v", calls)
		}
		last := calls[len(calls)-1]["in"][0]
		if tr.index(fmt.Sprint("published ", last)) < 0 {
			t.Fatalf("offset %d committed but never published: %s", last, tr)
		}
		for _, e := range tr.events {
			var o int64
			if _, err := fmt.Sscanf(e, "published %d", &o); err == nil && o > last {
				t.Fatalf("batch up to %d published but the last commit covers %d: a clean shutdown must commit the batch in hand (%s)", o, last, tr)
			}
		}
		for i := 1; i < len(calls); i++ {
			if calls[i]["in"][0] <= calls[i-1]["in"][0] {
				t.Errorf("commits go backwards or repeat: %v", calls)
			}
		}
	})
}

// Random faults and timings against the invariants: commits only grow, each follows a successful
// Verify of the same offsets and the publish of the batch it covers, nothing is sent after a failed
// commit, no Verify follows a failed Apply, a clean end commits every published batch, the batch
// loop leaves no goroutine behind (synctest fails on one), and a generation that consumes again
// from the last commit gives one clean pass.
func TestRandomFaultsKeepTheInvariants(t *testing.T) {
	seeds := 120
	if testing.Short() {
		seeds = 20
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rnd := rand.New(rand.NewPCG(uint64(seed), 10))
				n := 5 + rnd.IntN(30)
				maxInFlight := 1 + rnd.IntN(4)
				maxBatch := 1 + rnd.IntN(5)
				commitDelay := []time.Duration{0, 0, time.Second, 3 * time.Second}[rnd.IntN(4)]
				r := newCommitsRig(t, maxInFlight, maxBatch, commitDelay)
				tr := r.tr
				c := newCommitsCommitter(tr)
				lat := []time.Duration{0, 10 * time.Millisecond, time.Second, 5 * time.Second}[rnd.IntN(4)]
				c.delay = func(int) time.Duration { return lat }
				faults := []string{}
				if rnd.IntN(3) == 0 {
					c.fail[1+rnd.IntN(4)] = errors.New("not coordinator")
					faults = append(faults, "commit")
				}
				if rnd.IntN(3) == 0 {
					r.store.applyErr[fmt.Sprint("o", rnd.IntN(n))] = fmt.Errorf("%w: token", aggregator.ErrWritesLost)
					faults = append(faults, "apply")
				}
				for range rnd.IntN(3) {
					r.store.verifyErr[1+rnd.IntN(6)] = fmt.Errorf("%w: 0 of 1", aggregator.ErrReplicasBehind)
				}
				if rnd.IntN(4) == 0 {
					r.store.verifyErr[1+rnd.IntN(6)] = fmt.Errorf("%w: REWIND", aggregator.ErrWritesLost)
					faults = append(faults, "verify")
				}
				ctx, cancel := context.WithCancel(t.Context())
				gctx, endGen := context.WithCancel(t.Context())
				defer endGen()
				msgs := commitsLive(n)
				in := make(chan kafka.Message, n)
				done1 := r.run(ctx, gctx, c, in)
				done := done1
				pauses := make([]time.Duration, n)
				for i := range pauses {
					pauses[i] = time.Duration(rnd.IntN(3)) * 5 * time.Millisecond
				}
				fed := make(chan struct{})
				go func() {
					defer close(fed)
					for i, m := range msgs {
						select {
						case in <- m:
						case <-done1:
							return
						}
						time.Sleep(pauses[i])
					}
				}()
				stop := time.Duration(rnd.IntN(4000)) * time.Millisecond
				if within(done, stop) {
					// ended by a fault
				} else if rnd.IntN(2) == 0 {
					cancel()
				} else {
					endGen()
				}
				if !within(done, time.Hour) {
					t.Fatalf("the batch loop did not end (faults %v): %s", faults, tr)
				}
				cancel()
				<-fed
				cfg := fmt.Sprintf("n %d, in flight %d, batch %d, delay %v, latency %v, faults %v", n, maxInFlight, maxBatch, commitDelay, lat, faults)
				if err := r.fatalErr(); err != nil {
					t.Fatalf("%s: no injected fault is fatal: %v", cfg, err)
				}
				calls, ok := c.made()
				for i := 1; i < len(calls); i++ {
					if calls[i]["in"][0] <= calls[i-1]["in"][0] {
						t.Errorf("%s: commits go backwards or repeat: %v", cfg, calls)
					}
				}
				failedAt := -1
				for i, e := range tr.events {
					if strings.HasPrefix(e, "commit failed") {
						failedAt = i
						break
					}
				}
				for _, call := range calls {
					off := call["in"][0]
					b := tr.index(fmt.Sprint("commit begins ", off))
					v := slices.IndexFunc(tr.events, func(e string) bool {
						return strings.HasPrefix(e, "verify ") && strings.HasSuffix(e, fmt.Sprint(" up to offset ", off))
					})
					if v < 0 || v > b {
						t.Errorf("%s: offset %d committed without a successful Verify of it first: %s", cfg, off, tr)
					}
					if p := tr.index(fmt.Sprint("published ", off)); p < 0 || p > b {
						t.Errorf("%s: offset %d committed before its batch was published: %s", cfg, off, tr)
					}
					if failedAt >= 0 && b > failedAt {
						t.Errorf("%s: offset %d sent after a failed commit: %s", cfg, off, tr)
					}
				}
				if a := slices.IndexFunc(tr.events, func(e string) bool { return strings.HasPrefix(e, "lost at apply") }); a >= 0 {
					for _, e := range tr.events[a+1:] {
						if strings.HasPrefix(e, "verify") {
							t.Errorf("%s: Verify after a failed Apply (%q): %s", cfg, e, tr)
						}
					}
				}
				// Clean: no fault fired, and the last check before a commit succeeded (a final Verify
				// answering ErrNotYet leaves its batches uncommitted, as before cf13f49).
				lastVerify := ""
				for _, e := range tr.events {
					if strings.HasPrefix(e, "verify") {
						lastVerify = e
					}
				}
				clean := failedAt < 0 && !strings.HasPrefix(lastVerify, "verify failed") && !slices.ContainsFunc(tr.events, func(e string) bool {
					return strings.HasPrefix(e, "lost at apply") || strings.HasPrefix(e, "verify failed") && strings.Contains(e, "REWIND")
				})
				if clean {
					var last int64
					if len(ok) > 0 {
						last = ok[len(ok)-1]["in"][0]
					}
					for _, e := range tr.events {
						var o int64
						if _, err := fmt.Sscanf(e, "published %d", &o); err == nil && o > last {
							t.Errorf("%s: batch up to %d published but the last commit covers %d after a clean end: %s", cfg, o, last, tr)
							break
						}
					}
				}
				// The next generation consumes again from the last successful commit.
				var from int64
				if len(ok) > 0 {
					from = ok[len(ok)-1]["in"][0]
				}
				r.store.mu.Lock()
				clear(r.store.applyErr)
				clear(r.store.verifyErr)
				r.store.mu.Unlock()
				ctx2, cancel2 := context.WithCancel(t.Context())
				c2 := newCommitsCommitter(tr)
				done = r.run(ctx2, ctx2, c2, commitsFeed(msgs[from:]))
				if int(from) < n && !within(tr.seen(fmt.Sprint("commit ", n)), time.Hour) {
					t.Fatalf("%s: the redelivery from %d did not commit every offset: %s", cfg, from, tr)
				}
				cancel2()
				<-done
				if got := r.passed(); got != int64(n) {
					t.Fatalf("%s: %d passed after consuming again from %d, one clean pass gives %d: %s", cfg, got, from, n, tr)
				}
			})
		})
	}
}

// ---------------------------------------------------------------------------------------------
// Reused message slices

// commitsMsg is what a batch was prepared with, copied.
type commitsMsg struct {
	part  int
	off   int64
	value string
}

// commitsReuseHandler checks, at Prepare, that a reused slice holds nothing past the batch's end,
// and at Apply and around Publish that the batch still holds exactly the messages (partition,
// offset, value bytes) it was prepared with.
type commitsReuseHandler struct {
	traceHandler
	t      *testing.T
	mu     sync.Mutex
	seen   map[*Batch][]commitsMsg
	arrays map[*kafka.Message]int
	caps   map[*kafka.Message]int
}

func newCommitsReuseHandler(t *testing.T, r *commitsRig) *commitsReuseHandler {
	h := &commitsReuseHandler{traceHandler: r.group.handler.(traceHandler), t: t, seen: map[*Batch][]commitsMsg{},
		arrays: map[*kafka.Message]int{}, caps: map[*kafka.Message]int{}}
	r.group.handler = h
	return h
}

func commitsCopy(msgs []kafka.Message) []commitsMsg {
	var out []commitsMsg
	for _, m := range msgs {
		out = append(out, commitsMsg{m.Partition, m.Offset, string(m.Value)})
	}
	return out
}

func (h *commitsReuseHandler) Prepare(msgs []kafka.Message) (*Batch, error) {
	for i, m := range msgs[len(msgs):cap(msgs)] {
		if m.Value != nil || m.Offset != 0 || m.Topic != "" || m.Headers != nil {
			h.t.Errorf("a reused slice holds message %d/%d@%d past the batch's end (index %d of cap %d)",
				m.Partition, m.Offset, len(msgs)+i, len(msgs)+i, cap(msgs))
			break
		}
	}
	b, err := h.traceHandler.Prepare(msgs)
	h.mu.Lock()
	defer h.mu.Unlock()
	if b != nil {
		h.seen[b] = commitsCopy(msgs)
	}
	h.arrays[&msgs[:1][0]]++
	h.caps[&msgs[:1][0]] = max(h.caps[&msgs[:1][0]], cap(msgs))
	return b, err
}

func (h *commitsReuseHandler) check(b *Batch, when string) {
	h.mu.Lock()
	want := h.seen[b]
	h.mu.Unlock()
	if got := commitsCopy(b.Messages()); !slices.Equal(got, want) {
		h.t.Errorf("%s: a batch prepared with %v holds %v", when, want, got)
	}
}

func (h *commitsReuseHandler) Apply(ctx context.Context, b *Batch) error {
	h.check(b, "apply")
	err := h.traceHandler.Apply(ctx, b)
	h.check(b, "applied")
	return err
}

func (h *commitsReuseHandler) Publish(ctx context.Context, b *Batch) error {
	h.check(b, "publish")
	err := h.Processor.Publish(ctx, b)
	h.check(b, "published")
	return err
}

func (h *commitsReuseHandler) reused() (batches, arrays int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.seen), len(h.arrays)
}

// commitsMixed is n messages on two partitions, every kth of them bad (a dead letter) with a value
// of its own.
func commitsMixed(n, k int) (msgs []kafka.Message, bad map[[2]int64]string) {
	bad = map[[2]int64]string{}
	offs := [2]int64{}
	for i := range n {
		p := i % 2
		var m kafka.Message
		if k > 0 && i%k == k-1 {
			v := fmt.Sprintf("garbage %d %s", i, strings.Repeat("x", i%13))
			m = kafka.Message{Topic: "in", Partition: p, Offset: offs[p], Value: []byte(v)}
			bad[[2]int64{int64(p), offs[p]}] = v
		} else {
			m = liveMessage(offs[p], fmt.Sprint("o", i), "passed")
			m.Partition = p
		}
		offs[p]++
		msgs = append(msgs, m)
	}
	return msgs, bad
}

// Slices are reused across batches of very different sizes (bursts of 1 to 300 messages, MaxBatch
// 300 so a slice grows past its first capacity of 256), with dead letters among them and on two
// partitions, for MaxInFlight 1 (every batch in the same array) and 4: each batch holds exactly
// its messages through Apply and Publish, the tail past a shorter batch is cleared, every dead
// letter is sent once with its own bytes, every good message counted once, and the last commit
// covers both partitions.
func TestReuseWithDeadLettersAndUnevenBatches(t *testing.T) {
	for _, maxInFlight := range []int{1, 4} {
		t.Run(fmt.Sprint("in flight ", maxInFlight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := newCommitsRig(t, maxInFlight, 300, 0)
				r.group.cfg.Linger = 5 * time.Millisecond
				h := newCommitsReuseHandler(t, r)
				tr := r.tr
				msgs, bad := commitsMixed(900, 7)
				c := newCommitsCommitter(tr)
				ctx, cancel := context.WithCancel(t.Context())
				in := make(chan kafka.Message, len(msgs))
				done := r.run(ctx, ctx, c, in)
				bursts := []int{300, 1, 2, 290, 3, 1, 150, 7, 1, 145}
				i := 0
				for _, b := range bursts {
					for range b {
						if i < len(msgs) {
							in <- msgs[i]
							i++
						}
					}
					time.Sleep(50 * time.Millisecond)
				}
				for ; i < len(msgs); i++ {
					in <- msgs[i]
				}
				deadline := time.Now().Add(time.Hour)
				for {
					_, ok := c.made()
					if got := commitsCommitted(ok); got[0] == 450 && got[1] == 450 {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("not everything committed: %v", commitsCommitted(ok))
					}
					time.Sleep(10 * time.Millisecond)
				}
				cancel()
				<-done
				if err := r.fatalErr(); err != nil {
					t.Fatal(err)
				}
				batches, arrays := h.reused()
				if arrays >= batches {
					t.Fatalf("%d batches in %d arrays: no slice was reused, the test tests nothing", batches, arrays)
				}
				good := int64(len(msgs) - len(bad))
				if got := r.passed(); got != good {
					t.Errorf("%d passed, want %d (each good message once)", got, good)
				}
				got := map[[2]int64]string{}
				for _, d := range r.dlq.dls {
					k := [2]int64{int64(d.Message.Partition), d.Message.Offset}
					if _, dup := got[k]; dup {
						t.Errorf("dead letter %v sent twice", k)
					}
					got[k] = string(d.Message.Value)
				}
				if len(got) != len(bad) {
					t.Errorf("%d dead letters, want %d", len(got), len(bad))
				}
				for k, v := range bad {
					if got[k] != v {
						t.Errorf("dead letter %v holds %q, want %q", k, got[k], v)
					}
				}
				_, ok := c.made()
				prev := map[int]int64{}
				for _, call := range ok {
					for p, o := range call["in"] {
						if o <= prev[p] {
							t.Errorf("partition %d committed %d after %d", p, o, prev[p])
						}
						prev[p] = o
					}
				}
			})
		})
	}
}

// A publish fails after slices were reused, dropping the batches in flight (a rewind of the
// generation); the next generation, with a new pipeline, consumes everything again from the
// committed offsets: every batch of both generations holds its own messages throughout, and the
// counts are those of one clean pass.
func TestReuseAcrossAFailedPublish(t *testing.T) {
	for _, maxInFlight := range []int{1, 2, 4} {
		t.Run(fmt.Sprint("in flight ", maxInFlight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 60
				r := newCommitsRig(t, maxInFlight, 4, 0)
				h := newCommitsReuseHandler(t, r)
				tr := r.tr
				broken := true
				var pubMu sync.Mutex
				r.pub.hold = map[int64]func(context.Context) error{}
				for _, k := range []int64{31, 32, 33, 34} { // whichever batch reaches message 30 fails
					r.pub.hold[k] = func(context.Context) error {
						pubMu.Lock()
						defer pubMu.Unlock()
						if broken {
							return errors.New("broker not available")
						}
						return nil
					}
				}
				msgs := commitsLive(n)
				c := newCommitsCommitter(tr)
				in := make(chan kafka.Message, n)
				done := r.run(t.Context(), t.Context(), c, in)
				for i, m := range msgs {
					in <- m
					if i%3 == 2 {
						time.Sleep(2 * time.Millisecond)
					}
				}
				if !within(done, time.Hour) {
					t.Fatalf("the generation did not end on the failed publish: %s", tr)
				}
				_, ok := c.made()
				var from int64
				if len(ok) > 0 {
					from = ok[len(ok)-1]["in"][0]
				}
				if from > 30 {
					t.Fatalf("committed %d, past the failed publish: %s", from, tr)
				}
				pubMu.Lock()
				broken = false
				pubMu.Unlock()
				ctx, cancel := context.WithCancel(t.Context())
				c2 := newCommitsCommitter(tr)
				done = r.run(ctx, ctx, c2, commitsFeed(msgs[from:]))
				if !within(tr.seen(fmt.Sprint("commit ", n)), time.Hour) {
					t.Fatalf("the redelivery did not commit everything: %s", tr)
				}
				cancel()
				<-done
				if batches, arrays := h.reused(); arrays >= batches {
					t.Fatalf("%d batches in %d arrays: no slice was reused", batches, arrays)
				}
				if got := r.passed(); got != n {
					t.Fatalf("%d passed, one clean pass gives %d", got, n)
				}
			})
		})
	}
}

// After a commit failed, the loop still waits for the pending batches' CommitDelay and checks them
// with Verify (recording offsets as about to be committed) although queue refuses them: nothing
// later may be committed, and the loop must still end. The time from the failure to the return and
// the Verify calls after it are logged (a smell: wasted time in a rebalance, and with
// redis.wait_replicas a WAIT that cannot lead to a commit).
func TestFailedCommitWithPendingBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newCommitsRig(t, 2, 1, 2*time.Second)
		tr := r.tr
		c := newCommitsCommitter(tr)
		c.fail[1] = errors.New("illegal generation")
		in := make(chan kafka.Message, 4)
		done := r.run(t.Context(), t.Context(), c, in)
		msgs := commitsLive(4)
		in <- msgs[0]
		in <- msgs[1]
		<-tr.seen("published 2")
		time.Sleep(1500 * time.Millisecond)
		in <- msgs[2] // pending, not ready, when the first commit fails
		<-tr.seen("published 3")
		if !within(tr.seen("commit failed 2"), time.Hour) {
			t.Fatalf("the first commit was not tried: %s", tr)
		}
		failedAt := time.Now()
		if !within(done, time.Hour) {
			t.Fatalf("the loop did not end after a failed commit: %s", tr)
		}
		calls, _ := c.made()
		if len(calls) != 1 {
			t.Fatalf("commits after the failed one: %v (%s)", calls, tr)
		}
		after := 0
		for _, e := range tr.events[tr.index("commit failed 2")+1:] {
			if strings.HasPrefix(e, "verify") {
				after++
			}
		}
		t.Logf("returned %v after the failed commit, with %d Verify calls after it: %s", time.Since(failedAt), after, tr)
	})
}
