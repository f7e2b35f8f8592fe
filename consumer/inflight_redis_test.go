package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// aheadStore closes ahead once n batches were applied.
type aheadStore struct {
	Store
	mu      sync.Mutex
	applies int
	n       int
	ahead   chan struct{}
}

func (s *aheadStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	a, err := s.Store.Apply(ctx, obs, at)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.applies++; s.applies == s.n {
		close(s.ahead)
	}
	return a, err
}

// lockedPublisher records acknowledged snapshots, each with the run of publishes it belongs to
// (a new run begins after each failure: a rewind publishes older versions again).
type lockedPublisher struct {
	mu    sync.Mutex
	run   int
	snaps []schemas.Snapshot
	runs  []int
}

func (p *lockedPublisher) Publish(_ context.Context, snaps []schemas.Snapshot) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range snaps {
		p.snaps, p.runs = append(p.snaps, s), append(p.runs, p.run)
	}
	return nil
}

func (p *lockedPublisher) PublishSuites(context.Context, suite.Output, time.Time) error { return nil }

// deepAudit is auditHandler (every commit checked against what was published) with a publish of
// the first batch that fails for good once MaxInFlight batches were applied.
type deepAudit struct {
	auditHandler
	store  *aheadStore
	locked *lockedPublisher
	broken bool // under auditHandler.mu
}

func (h *deepAudit) Publish(ctx context.Context, b *Batch) error {
	h.mu.Lock()
	broken := h.broken
	h.mu.Unlock()
	if broken {
		// Every other place in the pipeline is taken by an applied batch before this one fails.
		select {
		case <-h.store.ahead:
		case <-ctx.Done():
			return ctx.Err()
		}
		h.mu.Lock()
		h.broken = false
		h.failures++
		h.mu.Unlock()
		h.locked.mu.Lock()
		h.locked.run++
		h.locked.mu.Unlock()
		return errors.New("broker not available")
	}
	if err := h.Processor.Publish(ctx, b); err != nil {
		return err
	}
	h.markPublished(b)
	return nil
}

// On real Kafka and Redis, with four (the default) and eight batches in flight: the first
// batch's publish fails for good once every other place in the pipeline holds an applied batch.
// Nothing of them is committed; all are consumed again and the counts are those of one clean pass.
func TestDeepPipelineRewindsOnKafkaAndRedis(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	client := testenv.Redis(t)
	for _, maxInFlight := range []int{DefaultMaxInFlight, 8} {
		t.Run(fmt.Sprint(maxInFlight), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			name := testenv.Name(t, "deep")
			testenv.CleanPrefix(t, client, name)
			createTopic(ctx, t, brokers, name, 1)
			// 100 opportunities, every fourth a confirmed repeat, and 20 of them sent again.
			msgs := repeatedLive(0, 120, 20, 5)
			w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: name, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
			defer w.Close()
			writeAll(ctx, t, w, msgs)
			cfg := aggregator.RedisConfig{Prefix: name, Retention: 30 * 24 * time.Hour, Group: name}
			rates, suites := redisStores(t, client, cfg)
			store := &aheadStore{Store: rates, n: maxInFlight, ahead: make(chan struct{})}
			pub := &lockedPublisher{}
			metrics := NewMetrics(prometheus.NewRegistry())
			p, err := NewProcessor(ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}, newTestDecoder(t), store, suites,
				pub, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), metrics)
			if err != nil {
				t.Fatal(err)
			}
			h := &deepAudit{auditHandler: auditHandler{Processor: p, t: t, prepared: map[int64]int{}, published: map[int64]bool{}},
				store: store, locked: pub, broken: true}
			g, err := NewGroup(GroupConfig{Brokers: brokers, GroupID: name, Topics: []string{name}, MaxBatch: 10, Linger: 200 * time.Millisecond,
				DrainTimeout: 5 * time.Second, MaxInFlight: maxInFlight, SessionTimeout: 6 * time.Second}, h, zap.NewNop(), metrics)
			if err != nil {
				t.Fatal(err)
			}
			ran, stop := runGroup(ctx, t, g)
			defer stop()
			for {
				h.mu.Lock()
				committed, failures := h.committed, h.failures
				h.mu.Unlock()
				if committed == int64(len(msgs)) && failures > 0 {
					break
				}
				select {
				case err := <-ran:
					t.Fatalf("group stopped: %v", err)
				case <-ctx.Done():
					t.Fatalf("committed up to %d of %d, %d publish failures", committed, len(msgs), failures)
				case <-time.After(50 * time.Millisecond):
				}
			}
			h.mu.Lock()
			again := 0 // messages consumed again: the failed batch and every batch in flight with it
			for _, n := range h.prepared {
				if n >= 2 {
					again++
				}
			}
			first, last := h.prepared[0], h.prepared[int64(len(msgs)-1)]
			h.mu.Unlock()
			if first != 2 || last != 1 {
				t.Errorf("offset 0 prepared %d times, the last %d: want batch 0 consumed again after the failure, the last batch once", first, last)
			}
			if again < 10*maxInFlight {
				t.Errorf("%d messages consumed again, want at least the %d batches in flight (MaxBatch 10)", again, maxInFlight)
			}
			tally, err := rates.Tally(ctx, deepKey, now)
			if err != nil {
				t.Fatal(err)
			}
			if w := tally.Snapshot(deepKey, now).Windows.All; w.Passed != 75 || w.ConfirmedRepeats != 25 {
				t.Errorf("redis holds %d passed and %d confirmed; one clean pass gives 75 and 25", w.Passed, w.ConfirmedRepeats)
			}
			pub.mu.Lock()
			defer pub.mu.Unlock()
			last0 := pub.snaps[len(pub.snaps)-1].Windows.All
			if last0.Passed != 75 || last0.ConfirmedRepeats != 25 {
				t.Errorf("last snapshot published: %d passed, %d confirmed; want 75 and 25", last0.Passed, last0.ConfirmedRepeats)
			}
			// Within the generation that finished the work, snapshots are in version order.
			for i := 1; i < len(pub.snaps); i++ {
				if pub.snaps[i].Version < pub.snaps[i-1].Version && pub.runs[i] == pub.runs[i-1] {
					t.Errorf("snapshot %d has version %d after %d in the same run of publishes", i, pub.snaps[i].Version, pub.snaps[i-1].Version)
				}
			}
		})
	}
}

// slowShared is one publisher for both members of a group: acknowledgements take a while, so
// the pipeline is full when a rebalance comes, and it records every snapshot in order.
type slowShared struct {
	mu    sync.Mutex
	delay time.Duration
	snaps []schemas.Snapshot
}

func (p *slowShared) Publish(ctx context.Context, snaps []schemas.Snapshot) error {
	select {
	case <-time.After(p.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.snaps = append(p.snaps, snaps...)
	return nil
}

func (p *slowShared) PublishSuites(context.Context, suite.Output, time.Time) error { return nil }

// memberAudit checks every commit of either member against what either published.
type memberAudit struct {
	*Processor
	t         *testing.T
	mu        *sync.Mutex
	published map[[2]int64]bool // (partition, offset) published
	committed map[int]int64     // partition → offset committed last
	verifies  *int              // Verify calls of both members
	mine      int               // Verify calls of this member
}

func (h *memberAudit) Publish(ctx context.Context, b *Batch) error {
	if err := h.Processor.Publish(ctx, b); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range b.Messages() {
		h.published[[2]int64{int64(m.Partition), m.Offset}] = true
	}
	return nil
}

func (h *memberAudit) Verify(ctx context.Context, mark int64, offsets map[string]map[int]int64) error {
	h.mu.Lock()
	*h.verifies++
	h.mine++
	for _, parts := range offsets {
		for p, next := range parts {
			for off := int64(0); off < next; off++ {
				if !h.published[[2]int64{int64(p), off}] {
					h.t.Errorf("about to commit partition %d up to %d although offset %d was never published", p, next, off)
				}
			}
		}
	}
	h.mu.Unlock()
	if err := h.Processor.Verify(ctx, mark, offsets); err != nil {
		return err
	}
	h.mu.Lock()
	for _, parts := range offsets {
		for p, next := range parts {
			h.committed[p] = max(h.committed[p], next)
		}
	}
	h.mu.Unlock()
	return nil
}

// On real Kafka and Redis, with four and eight batches in flight: a second member joins while
// the first has a full pipeline. The first drains its batches under the generation that fetched
// them before the second gets their partition, so each aggregate's snapshots still reach Kafka in
// version order across the two members, commits cover only published batches, and the counts are
// those of one clean pass.
func TestDeepPipelineRebalanceOnKafkaAndRedis(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	client := testenv.Redis(t)
	for _, maxInFlight := range []int{DefaultMaxInFlight, 8} {
		t.Run(fmt.Sprint(maxInFlight), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			name := testenv.Name(t, "deeprebal")
			testenv.CleanPrefix(t, client, name)
			createTopic(ctx, t, brokers, name, 2)
			// Two aggregates (runs r0 and r1), one per partition: 100 messages each, 80
			// opportunities, every fourth a confirmed repeat, 20 sent again.
			const perPartition = 100
			var msgs []kafka.Message
			for part := range 2 {
				for _, m := range repeatedLive(int64(part*perPartition), perPartition, 20, 4) {
					v := strings.Replace(string(m.Value), `"run":"r"`, fmt.Sprintf(`"run":"r%d"`, part), 1)
					msgs = append(msgs, kafka.Message{Key: []byte{byte('0' + part)}, Value: []byte(v)})
				}
			}
			w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: name, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
				Balancer: kafka.BalancerFunc(func(m kafka.Message, partitions ...int) int { return partitions[int(m.Key[0]-'0')] })}
			defer w.Close()
			writeAll(ctx, t, w, msgs)
			cfg := aggregator.RedisConfig{Prefix: name, Retention: 30 * 24 * time.Hour, Group: name}
			pub := &slowShared{delay: 150 * time.Millisecond}
			var mu sync.Mutex
			verifies := 0
			published, committed := map[[2]int64]bool{}, map[int]int64{}
			var rates *aggregator.Redis
			var members []*memberAudit
			member := func() (*Group, error) {
				r, err := aggregator.NewRedis(client, cfg) // each process has its own marks
				if err != nil {
					return nil, err
				}
				rates = r
				suites, err := suite.NewRedis(client, cfg, suite.Config{})
				if err != nil {
					return nil, err
				}
				metrics := NewMetrics(prometheus.NewRegistry())
				p, err := NewProcessor(ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}, newTestDecoder(t), r, suites,
					pub, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), metrics)
				if err != nil {
					return nil, err
				}
				h := &memberAudit{Processor: p, t: t, mu: &mu, published: published, committed: committed, verifies: &verifies}
				members = append(members, h)
				return NewGroup(GroupConfig{Brokers: brokers, GroupID: name, Topics: []string{name}, MaxBatch: 5, Linger: 50 * time.Millisecond,
					DrainTimeout: 20 * time.Second, MaxInFlight: maxInFlight, SessionTimeout: 6 * time.Second, HeartbeatInterval: 300 * time.Millisecond},
					h, zap.NewNop(), metrics)
			}
			runCtx, stop := context.WithCancel(ctx)
			defer stop()
			var wg sync.WaitGroup
			start := func() {
				g, err := member()
				if err != nil {
					t.Fatal(err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := g.Run(runCtx); err != nil {
						t.Errorf("member: %v", err)
					}
				}()
			}
			start()
			done := func() (int64, int64) {
				mu.Lock()
				defer mu.Unlock()
				return committed[0], committed[1]
			}
			// The second member joins once the first is well under way, its pipeline full.
			for c0, c1 := done(); c0+c1 < 40; c0, c1 = done() {
				select {
				case <-ctx.Done():
					t.Fatalf("first member committed %d and %d", c0, c1)
				case <-time.After(20 * time.Millisecond):
				}
			}
			start()
			for c0, c1 := done(); c0 < perPartition || c1 < perPartition; c0, c1 = done() {
				select {
				case <-ctx.Done():
					t.Fatalf("committed %d and %d of %d each", c0, c1, perPartition)
				case <-time.After(50 * time.Millisecond):
				}
			}
			stop()
			wg.Wait()

			mu.Lock()
			firstCommits, secondCommits := members[0].mine, members[1].mine
			mu.Unlock()
			if secondCommits == 0 || firstCommits == 0 {
				t.Errorf("commits: first member %d, second %d: no rebalance was tested", firstCommits, secondCommits)
			}
			byRun := map[string][]int64{}
			pub.mu.Lock()
			for _, s := range pub.snaps {
				byRun[s.Aggregate.Run] = append(byRun[s.Aggregate.Run], s.Version)
			}
			last := map[string]schemas.Snapshot{}
			for _, s := range pub.snaps {
				last[s.Aggregate.Run] = s
			}
			pub.mu.Unlock()
			for run, vs := range byRun {
				for i := 1; i < len(vs); i++ {
					if vs[i] < vs[i-1] {
						t.Errorf("aggregate %s: snapshot version %d acknowledged after %d (the %dth of %d)", run, vs[i], vs[i-1], i, len(vs))
						break
					}
				}
			}
			for part := range 2 {
				run := fmt.Sprintf("r%d", part)
				k := deepKey
				k.Scope.Run = run
				tally, err := rates.Tally(ctx, k, now)
				if err != nil {
					t.Fatal(err)
				}
				if w := tally.Snapshot(k, now).Windows.All; w.Passed != 60 || w.ConfirmedRepeats != 20 {
					t.Errorf("aggregate %s: redis holds %d passed and %d confirmed; one clean pass gives 60 and 20", run, w.Passed, w.ConfirmedRepeats)
				}
				if w := last[run].Windows.All; w.Passed != 60 || w.ConfirmedRepeats != 20 {
					t.Errorf("aggregate %s: last snapshot %d passed, %d confirmed; want 60 and 20", run, w.Passed, w.ConfirmedRepeats)
				}
			}
			t.Logf("%d snapshots (%d and %d for the two aggregates), %d and %d commits by the members", len(pub.snaps), len(byRun["r0"]), len(byRun["r1"]), firstCommits, secondCommits)
		})
	}
}
