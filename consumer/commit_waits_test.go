package consumer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
)

// laggingStore is a gateStore whose replicas stay behind until a time: every Verify that commits
// something reports ErrReplicasBehind after taking cost (Redis WAIT blocks for its timeout), until
// then or until maxBehind such answers were given.
type laggingStore struct {
	*gateStore
	mu        sync.Mutex
	until     time.Time
	cost      time.Duration
	maxBehind int
	behindN   int
}

func (s *laggingStore) Verify(ctx context.Context, upTo int64, commit aggregator.Offsets) error {
	s.mu.Lock()
	lagging := upTo > 0 && time.Now().Before(s.until) && s.behindN < s.maxBehind
	if lagging {
		s.behindN++
	}
	s.mu.Unlock()
	if lagging {
		time.Sleep(s.cost)
		return fmt.Errorf("%w: 0 of 1 replicas", aggregator.ErrReplicasBehind)
	}
	return s.gateStore.Verify(ctx, upTo, commit)
}

func (s *laggingStore) behind() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.behindN
}

func newLaggingRig(t *testing.T, store *laggingStore) *pipelineRig {
	t.Helper()
	tr := store.tr
	cfg := ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Suite: suite.Config{MinHistory: 1}}
	pub := &gatePublisher{tr: tr}
	p, err := NewProcessor(cfg, newTestDecoder(t), store, announceTrace{suite.NewMemory(cfg.Suite), tr},
		pub, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r := &pipelineRig{tr: tr, store: store.gateStore, pub: pub, commit: &commitLog{tr: tr}}
	r.group, err = NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: 1,
		Linger: time.Millisecond, MaxInFlight: 3, DrainTimeout: 10 * time.Minute, CommitDelay: 2 * time.Second}, traceHandler{p, tr}, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.group.fatal = func(err error) { r.fatal = err }
	return r
}

// While a primary's replica is down, commits wait ("publishing goes on, the batches stay pending"):
// the apply loop must keep its pace. Each try of a commit blocks that loop for the WAIT timeout,
// so tried again at once, after every batch and every time the oldest pending batch is due, it
// leaves the loop one batch per timeout: 200 one-message batches sent over 10 s took over 200 s of
// (fake) time to publish here, with a replica merely down.
func TestApplyKeepsItsPaceWhileCommitsWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		const n = 200
		store := &laggingStore{gateStore: &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)},
			until: time.Now().Add(time.Hour), cost: time.Second, maxBehind: 1 << 30}
		r := newLaggingRig(t, store)
		ctx, cancel := context.WithCancel(t.Context())
		msgs := make([]kafka.Message, n)
		for i := range msgs {
			msgs[i] = liveMessage(int64(i), fmt.Sprint("b", i), "passed")
		}
		// One message every 50 ms, 10 s of input, as a steady producer sends them.
		in := make(chan kafka.Message)
		go func() {
			for _, m := range msgs {
				select {
				case in <- m:
				case <-ctx.Done():
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		begin := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(ctx, ctx, 1, r.commit, in)
		}()
		if !within(tr.seen(fmt.Sprintf("published %d", n)), time.Hour) {
			t.Fatalf("never published the last batch: fatal %v", r.fatal)
		}
		took := time.Since(begin)
		cancel()
		<-done
		if r.fatal != nil {
			t.Fatal(r.fatal)
		}
		t.Logf("%d batches published in %v while commits waited (%d tries)", n, took, store.behind())
		if took > 20*time.Second {
			t.Errorf("%d batches took %v while commits waited for a replica: the commit tries starve the apply loop", n, took)
		}
	})
}

// A "not yet" that comes back at once (a slot moved under the WAIT, replicas that answer fast)
// must not be tried again in a tight loop: the oldest pending batch stays due, so the loop would
// call Verify, a handful of Redis round trips each, as fast as it can until the replicas catch up.
func TestNotYetIsNotRetriedInATightLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &laggingStore{gateStore: &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)},
			until: time.Now().Add(10 * time.Second), cost: 0, maxBehind: 100000}
		r := newLaggingRig(t, store)
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
		// 10 s of replicas behind; a try every 100 ms would be 100.
		if got := store.behind(); got > 100 {
			t.Errorf("%d tries of the commit in 10 s of replicas behind (the bound is %d answers): tried again in a tight loop", got, store.maxBehind)
		}
	})
}
