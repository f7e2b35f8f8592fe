package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
)

// Review of "a batch past its linger keeps filling while the batch before it still waits for the
// apply stage" (collect waits for the apply stage's taken signal): the batch grows only while the
// one before it is ahead of the apply stage (decoding, or decoded and waiting), closes promptly once that one is taken, stops at its
// bounds, is handled as before when the generation, the process or the pipeline ends, costs no
// CPU worth the name, and leaves latency under light load and every commit rule as they were.

// growthPoll is how late a growing batch may close after the batch before it was taken (collect
// polled every millisecond when these tests were written; it is now told at once).
const growthPoll = time.Millisecond

// growthKey is a message's partition and offset.
type growthKey [2]int64

// growthMsg is a live attempt on partition part at offset off (event ids distinct across
// partitions), opportunity opp.
func growthMsg(part int, off int64, opp string) kafka.Message {
	m := liveMessage(int64(part)*1000+off, opp, "passed")
	m.Partition, m.Offset = part, off
	return m
}

// growthStore is the model behind gates (gateStore), with an outage (transient errors, retried by
// the processor), an apply delay, and per-batch failures (the apply returns the error sent).
type growthStore struct {
	*gateStore
	delay time.Duration
	fails map[string]chan error

	// verifyGate, when set, holds every Verify before a commit until it is closed.
	verifyGate chan struct{}

	mu      sync.Mutex
	down    bool
	refused int // applies refused while down
}

func (s *growthStore) Verify(ctx context.Context, upTo int64, commit aggregator.Offsets) error {
	if s.verifyGate != nil && upTo > 0 {
		s.tr.add("verify waits")
		select {
		case <-s.verifyGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.gateStore.Verify(ctx, upTo, commit)
}

func (s *growthStore) setDown(down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = down
}

func (s *growthStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	b := obs[0].OpportunityID
	if ch, ok := s.fails[b]; ok {
		s.tr.add("apply %s", b)
		select {
		case err := <-ch:
			return aggregator.Applied{}, err
		case <-ctx.Done():
			return aggregator.Applied{}, ctx.Err()
		}
	}
	s.mu.Lock()
	down := s.down
	if down {
		s.refused++
	}
	s.mu.Unlock()
	if down {
		return aggregator.Applied{}, errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return aggregator.Applied{}, ctx.Err()
		}
	}
	return s.gateStore.Apply(ctx, obs, at)
}

// growthBatch is a prepared batch: its messages and when it was closed (Prepare called).
type growthBatch struct {
	msgs []growthKey
	at   time.Time
}

// growthHandler records every batch prepared and every message published, and audits commits.
type growthHandler struct {
	traceHandler
	t *testing.T

	mu        sync.Mutex
	batches   []growthBatch
	prepared  map[growthKey]int
	published map[growthKey]time.Time
}

func (h *growthHandler) Prepare(msgs []kafka.Message) (*Batch, error) {
	b := growthBatch{at: time.Now()}
	for _, m := range msgs {
		b.msgs = append(b.msgs, growthKey{int64(m.Partition), m.Offset})
	}
	h.mu.Lock()
	h.batches = append(h.batches, b)
	for _, k := range b.msgs {
		h.prepared[k]++
	}
	h.mu.Unlock()
	return h.traceHandler.Prepare(msgs)
}

func (h *growthHandler) Publish(ctx context.Context, b *Batch) error {
	if err := h.Processor.Publish(ctx, b); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range b.Messages() {
		h.published[growthKey{int64(m.Partition), m.Offset}] = time.Now()
	}
	return nil
}

// snapshot returns the batches prepared so far.
func (h *growthHandler) snapshot() []growthBatch {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.batches)
}

// growthCommitter is the generation's committer: every commit may cover only published messages,
// and a partition's committed offset never goes back.
type growthCommitter struct {
	t    *testing.T
	tr   *trace
	h    *growthHandler
	mu   sync.Mutex
	last map[int]int64
	n    int
	want map[int]int64 // all committed once last reaches want: all is closed
	all  chan struct{}
}

func (c *growthCommitter) CommitOffsets(offsets map[string]map[int]int64) error {
	c.h.mu.Lock()
	for p, next := range offsets["in"] {
		for off := int64(0); off < next; off++ {
			if _, ok := c.h.published[growthKey{int64(p), off}]; !ok {
				c.t.Errorf("commit of partition %d up to %d although offset %d was not published", p, next, off)
			}
		}
	}
	c.h.mu.Unlock()
	c.mu.Lock()
	c.n++
	done := true
	for p, next := range offsets["in"] {
		if next < c.last[p] {
			c.t.Errorf("partition %d committed %d after %d", p, next, c.last[p])
		}
		c.last[p] = max(c.last[p], next)
	}
	for p, w := range c.want {
		if c.last[p] < w {
			done = false
		}
	}
	if done && len(c.want) > 0 {
		select {
		case <-c.all:
		default:
			close(c.all)
		}
	}
	c.mu.Unlock()
	if next, ok := offsets["in"][0]; ok {
		c.tr.add("commit %d", next)
	}
	return nil
}

func (c *growthCommitter) commits() (n int, last map[int]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	last = make(map[int]int64, len(c.last))
	for p, o := range c.last {
		last[p] = o
	}
	return c.n, last
}

type growthRig struct {
	t      *testing.T
	tr     *trace
	store  *growthStore
	h      *growthHandler
	commit *growthCommitter
	group  *Group
	fatal  error
}

// growthNewRig is a batch loop over an in-memory model: MaxInFlight places, batches of up to
// maxBatch messages closed Linger after their first; the apply of a batch whose first
// opportunity has a gate waits for it.
func growthNewRig(t *testing.T, maxInFlight, maxBatch int, linger time.Duration, gates map[string]chan struct{}) *growthRig {
	t.Helper()
	tr := &trace{}
	store := &growthStore{gateStore: &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour), gates: gates}, fails: map[string]chan error{}}
	cfg := ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Suite: suite.Config{MinHistory: 1}}
	p, err := NewProcessor(cfg, newTestDecoder(t), store, announceTrace{suite.NewMemory(cfg.Suite), tr},
		&gatePublisher{tr: tr}, &recordingDLQ{}, func() time.Time { return now }, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	h := &growthHandler{traceHandler: traceHandler{p, tr}, t: t, prepared: map[growthKey]int{}, published: map[growthKey]time.Time{}}
	r := &growthRig{t: t, tr: tr, store: store, h: h,
		commit: &growthCommitter{t: t, tr: tr, h: h, last: map[int]int64{}, all: make(chan struct{})}}
	r.group, err = NewGroup(GroupConfig{Brokers: []string{"unused"}, GroupID: "g", Topics: []string{"in"}, MaxBatch: maxBatch,
		Linger: linger, MaxInFlight: maxInFlight, DrainTimeout: 10 * time.Minute}, h, zap.NewNop(), NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	r.group.fatal = func(err error) { r.fatal = err }
	return r
}

// run runs one generation's batch loop over in; the channel closes when it returned.
func (r *growthRig) run(ctx, gctx context.Context, in <-chan kafka.Message) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.group.batches(ctx, gctx, 1, r.commit, in)
	}()
	return done
}

// passed is how many attempts the model counted for the test aggregate.
func (r *growthRig) passed() int64 {
	return r.store.model.Tally(deepKey, now).Snapshot(deepKey, now).Windows.All.Passed
}

// growthOffsets lists the partition-0 offsets of b.
func growthOffsets(b growthBatch) []int64 {
	var offs []int64
	for _, k := range b.msgs {
		offs = append(offs, k[1])
	}
	return offs
}

func growthShape(bs []growthBatch) [][]int64 {
	var s [][]int64
	for _, b := range bs {
		s = append(s, growthOffsets(b))
	}
	return s
}

// growthKeys lists the messages of each batch.
func growthKeys(bs []growthBatch) [][]growthKey {
	var s [][]growthKey
	for _, b := range bs {
		s = append(s, b.msgs)
	}
	return s
}

// growthFeeder sends messages into an unbuffered channel and records when each was taken (the
// send returns when collect received it).
type growthFeeder struct {
	in    chan kafka.Message
	mu    sync.Mutex
	taken map[int64]time.Time
}

func newGrowthFeeder() *growthFeeder {
	return &growthFeeder{in: make(chan kafka.Message), taken: map[int64]time.Time{}}
}

// send reports false when the message was not taken within a minute.
func (f *growthFeeder) send(m kafka.Message) bool {
	select {
	case f.in <- m:
	case <-time.After(time.Minute):
		return false
	}
	f.mu.Lock()
	f.taken[m.Offset] = time.Now()
	f.mu.Unlock()
	return true
}

// sendPaced sends messages 0..n-1 of partition 0 (opportunity "o<offset>"), message i at start +
// i·gap or, when an earlier one was taken late, as soon as that one was taken; it stops at the
// first one not taken.
func (f *growthFeeder) sendPaced(start time.Time, gap time.Duration, n int) {
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * gap)))
		if !f.send(growthMsg(0, int64(i), fmt.Sprint("o", i))) {
			return
		}
	}
}

func (f *growthFeeder) takenAt(off int64) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.taken[off]
}

// Batch 0 applies behind a gate, batch 1 (a lone message) waits for the apply stage, and
// messages 2..5 arrive 20 ms apart, each past the 10 ms linger: they make one batch, which
// closes within growthPoll of the apply stage taking batch 1, not a linger later and not at
// MaxBatch. Batch 1 itself, with batch 0 applying but nothing waiting, closes exactly at its
// linger. Everything is committed once, in order, and only once published.
func TestBatchGrowsUntilTheOneBeforeIsTaken(t *testing.T) {
	for _, maxInFlight := range []int{3, DefaultMaxInFlight, 8} {
		t.Run(fmt.Sprint(maxInFlight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const linger = 10 * time.Millisecond
				gate := make(chan struct{})
				r := growthNewRig(t, maxInFlight, 100, linger, map[string]chan struct{}{"a": gate})
				r.commit.want = map[int]int64{0: 6}
				f := newGrowthFeeder()
				ctx, cancel := context.WithCancel(t.Context())
				done := r.run(ctx, ctx, f.in)
				defer func() { cancel(); <-done }() // nothing left running, even after a failure

				if !f.send(growthMsg(0, 0, "a")) {
					t.Fatal("message 0 not taken")
				}
				if !within(r.tr.seen("apply a"), time.Minute) {
					t.Fatalf("batch 0 not applied: %s", r.tr)
				}
				if !f.send(growthMsg(0, 1, "b")) {
					t.Fatal("message 1 not taken")
				}
				if !within(r.tr.seen("prepared 1"), time.Minute) {
					t.Fatalf("batch 1, a lone message with nothing waiting before it, never closed: %s", r.tr)
				}
				if got := r.h.snapshot()[1].at.Sub(f.takenAt(1)); got != linger {
					t.Errorf("batch 1 closed %v after its message (batch 0 applying, none waiting), want the linger %v", got, linger)
				}
				for i := int64(2); i < 6; i++ {
					time.Sleep(20 * time.Millisecond)
					if !f.send(growthMsg(0, i, fmt.Sprint("c", i))) {
						t.Fatalf("message %d not taken within a minute: batches %v", i, growthShape(r.h.snapshot()))
					}
				}
				time.Sleep(time.Second)
				if bs := r.h.snapshot(); len(bs) != 2 {
					t.Fatalf("batches %v while batch 1 still waits for the apply stage: batch 2 should keep growing", growthShape(bs))
				}
				opened := time.Now()
				close(gate)
				if !within(r.tr.seen("prepared 2"), time.Minute) {
					t.Fatalf("batch 2 never closed after batch 1 was taken: %s", r.tr)
				}
				bs := r.h.snapshot()
				if got := bs[2].at.Sub(opened); got > 2*growthPoll {
					t.Errorf("batch 2 closed %v after the apply stage was free to take batch 1, want at most %v", got, 2*growthPoll)
				}
				if !slices.Equal(growthOffsets(bs[2]), []int64{2, 3, 4, 5}) {
					t.Errorf("batch 2 holds %v, want messages 2..5", growthOffsets(bs[2]))
				}
				if !within(r.commit.all, time.Minute) {
					t.Fatalf("not all committed: %s (fatal %v)", r.tr, r.fatal)
				}
				cancel()
				<-done
				if r.fatal != nil {
					t.Fatal(r.fatal)
				}
				if got := growthShape(r.h.snapshot()); !slices.EqualFunc(got, [][]int64{{0}, {1}, {2, 3, 4, 5}}, slices.Equal) {
					t.Errorf("batches %v, want [0] [1] [2 3 4 5]", got)
				}
				for k, n := range r.h.prepared {
					if n != 1 {
						t.Errorf("message %v prepared %d times", k, n)
					}
				}
				if got := r.passed(); got != 6 {
					t.Errorf("model counted %d attempts, want 6", got)
				}
			})
		})
	}
}

// Under light load nothing waits in the prepared queue, so every batch closes exactly Linger
// after its first message, as before: lone messages 100 ms apart with any MaxInFlight; and, with
// MaxInFlight 1 and 2 (where the batch before is never left waiting in the prepared queue while
// the next one is collected), a busy stream behind a slow apply too.
func TestLingerUnchangedWhenNothingWaits(t *testing.T) {
	type tc struct {
		maxInFlight int
		gap, apply  time.Duration
		n           int
	}
	var cases []tc
	for _, m := range []int{1, 2, DefaultMaxInFlight} {
		cases = append(cases, tc{m, 100 * time.Millisecond, 0, 8})
	}
	for _, m := range []int{1, 2} {
		cases = append(cases, tc{m, 5 * time.Millisecond, 50 * time.Millisecond, 40})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%d/gap%v/apply%v", c.maxInFlight, c.gap, c.apply), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const linger = 20 * time.Millisecond
				r := growthNewRig(t, c.maxInFlight, 1000, linger, nil)
				r.store.delay = c.apply
				r.commit.want = map[int]int64{0: int64(c.n)}
				f := newGrowthFeeder()
				ctx, cancel := context.WithCancel(t.Context())
				done := r.run(ctx, ctx, f.in)
				defer func() { cancel(); <-done }() // nothing left running, even after a failure
				go f.sendPaced(time.Now(), c.gap, c.n)
				if !within(r.commit.all, 10*time.Second) {
					t.Fatalf("not all committed: %s (fatal %v)", r.tr, r.fatal)
				}
				cancel()
				<-done
				bs := r.h.snapshot()
				multi := 0
				for i, b := range bs {
					first := b.msgs[0][1]
					if got := b.at.Sub(f.takenAt(first)); got != linger {
						t.Errorf("batch %d %v closed %v after its first message, want the linger %v", i, growthOffsets(b), got, linger)
					}
					if len(b.msgs) > 1 {
						multi++
					}
					if c.maxInFlight == 1 && i > 0 {
						// The batch before was published, so it left the prepared queue, before
						// this one's first message was taken.
						r.h.mu.Lock()
						prev := bs[i-1].msgs[len(bs[i-1].msgs)-1]
						pub, ok := r.h.published[prev]
						r.h.mu.Unlock()
						if !ok || pub.After(f.takenAt(first)) {
							t.Errorf("MaxInFlight 1: batch %d began at %v, before batch %d was published (%v, %v)", i, f.takenAt(first), i-1, pub, ok)
						}
					}
				}
				if c.apply == 0 && multi > 0 {
					t.Errorf("batches %v: lone messages 100 ms apart should each make a batch", growthShape(bs))
				}
				if c.apply > 0 && multi == 0 {
					t.Errorf("batches %v: a busy stream made no batch of more than one message; the test tests nothing", growthShape(bs))
				}
				if got := r.passed(); got != int64(c.n) {
					t.Errorf("model counted %d attempts, want %d", got, c.n)
				}
			})
		})
	}
}

// A published batch's place comes back before the next apply begins: taken back after it, the
// place was held through that whole apply, and the batch after next could not begin, so that
// the fetchers waited. A steady stream (a message a millisecond) behind applies of 100 ms with
// the default places in flight: after the first second, no message waits more than 2 ms to be
// taken into a batch; everything is counted once.
func TestPlacesComeBackBeforeTheNextApply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			linger = 10 * time.Millisecond
			gap    = time.Millisecond
			n      = 3000
		)
		r := growthNewRig(t, DefaultMaxInFlight, 1000, linger, nil)
		r.store.delay = 100 * time.Millisecond
		r.commit.want = map[int]int64{0: n}
		f := newGrowthFeeder()
		ctx, cancel := context.WithCancel(t.Context())
		done := r.run(ctx, ctx, f.in)
		defer func() { cancel(); <-done }()
		start := time.Now()
		go f.sendPaced(start, gap, n)
		if !within(r.commit.all, time.Minute) {
			t.Fatalf("not all committed: %s (fatal %v)", r.tr, r.fatal)
		}
		cancel()
		<-done
		var worst time.Duration
		worstAt := int64(0)
		for i := int64(time.Second / gap); i < n; i++ {
			if late := f.takenAt(i).Sub(start.Add(time.Duration(i) * gap)); late > worst {
				worst, worstAt = late, i
			}
		}
		if worst > 2*time.Millisecond {
			t.Errorf("message %d waited %v to be taken into a batch, want at most 2ms: batches %v", worstAt, worst, len(r.h.snapshot()))
		}
		if got := r.passed(); got != n {
			t.Errorf("model counted %d attempts, want %d", got, n)
		}
	})
}

// With MaxInFlight 2 the batch before is left waiting in the prepared queue only while the
// applying goroutine commits (Verify, which may wait for replicas, then CommitOffsets): batch 1
// waits there while batch 0's commit is held, so batch 2 grows past its linger, and closes
// within growthPoll of the commit returning. This is the one case where MaxInFlight 2 batches
// differ from before the change; nothing is committed early and everything is committed in order.
func TestTwoInFlightGrowOnlyBehindASlowCommit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const linger = 10 * time.Millisecond
		r := growthNewRig(t, 2, 100, linger, nil)
		r.store.verifyGate = make(chan struct{})
		r.commit.want = map[int]int64{0: 5}
		in := make(chan kafka.Message, 8)
		ctx, cancel := context.WithCancel(t.Context())
		done := r.run(ctx, ctx, in)
		defer func() { cancel(); <-done }() // nothing left running, even after a failure
		in <- growthMsg(0, 0, "a")
		if !within(r.tr.seen("verify waits"), time.Minute) {
			t.Fatalf("batch 0's commit never began: %s", r.tr)
		}
		for i := int64(1); i < 5; i++ {
			time.Sleep(20 * time.Millisecond)
			in <- growthMsg(0, i, fmt.Sprint("o", i))
		}
		time.Sleep(205 * time.Millisecond) // off the linger's beat
		if got := growthShape(r.h.snapshot()); !slices.EqualFunc(got, [][]int64{{0}, {1}}, slices.Equal) {
			t.Fatalf("batches %v while batch 0's commit is held, want [0] [1] and batch 2 growing", got)
		}
		if n, _ := r.commit.commits(); n != 0 {
			t.Fatalf("%d commits before Verify returned", n)
		}
		released := time.Now()
		close(r.store.verifyGate)
		if !within(r.tr.seen("prepared 2"), time.Minute) {
			t.Fatalf("batch 2 never closed: %s", r.tr)
		}
		bs := r.h.snapshot()
		if got := bs[2].at.Sub(released); got > 2*growthPoll {
			t.Errorf("batch 2 closed %v after the commit returned, want at most %v", got, 2*growthPoll)
		}
		if !slices.Equal(growthOffsets(bs[2]), []int64{2, 3, 4}) {
			t.Errorf("batch 2 holds %v, want 2..4", growthOffsets(bs[2]))
		}
		if !within(r.commit.all, time.Minute) {
			t.Fatalf("not all committed: %s (fatal %v)", r.tr, r.fatal)
		}
		if got := r.passed(); got != 5 {
			t.Errorf("model counted %d attempts, want 5", got)
		}
	})
}

// Redis is down (every apply fails and is retried) while the batch before waits: the growing
// batch stops at MaxBatch, or at MaxBatchBytes, and whatever arrives after stays in the input
// channel (back-pressure, so the fetchers wait). Once Redis is back, every message of both
// partitions is applied once, in order, and committed only after it was published.
func TestStalledApplyKeepsTheBatchBounds(t *testing.T) {
	for _, bound := range []string{"messages", "bytes"} {
		t.Run(bound, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const n = 20
				var msgs []kafka.Message
				for i := range n {
					msgs = append(msgs, growthMsg(i%2, int64(i/2), fmt.Sprint("o", i)))
				}
				maxBatch, want := 4, 4
				r := growthNewRig(t, 3, 100, 10*time.Millisecond, nil)
				if bound == "messages" {
					r.group.cfg.MaxBatch = maxBatch
				} else {
					want = 3
					r.group.cfg.MaxBatchBytes = len(msgs[2].Value) + len(msgs[3].Value) + len(msgs[4].Value)
				}
				r.commit.want = map[int]int64{0: n / 2, 1: n / 2}
				r.store.setDown(true)
				in := make(chan kafka.Message, n)
				ctx, cancel := context.WithCancel(t.Context())
				done := r.run(ctx, ctx, in)
				defer func() { cancel(); <-done }() // nothing left running, even after a failure
				go func() {
					for _, m := range msgs {
						in <- m
						time.Sleep(20 * time.Millisecond)
					}
				}()
				time.Sleep(3 * time.Second)
				r.store.mu.Lock()
				refused := r.store.refused
				r.store.mu.Unlock()
				if refused < 5 {
					t.Fatalf("%d applies refused: Redis was not down long; the test tests nothing", refused)
				}
				bs := r.h.snapshot()
				if len(bs) != 3 || len(bs[0].msgs) != 1 || len(bs[1].msgs) != 1 || len(bs[2].msgs) != want {
					t.Fatalf("while Redis is down: batches %v, want one message, one message, then %d (the growing batch stops at its bound)", growthKeys(bs), want)
				}
				if !slices.Equal(bs[2].msgs, []growthKey{{0, 1}, {1, 1}, {0, 2}, {1, 2}}[:want]) {
					t.Errorf("batch 2 holds %v", bs[2].msgs)
				}
				if got := len(in); got != n-2-want {
					t.Errorf("%d messages left in the input channel, want %d: past the bound, messages wait for a place", got, n-2-want)
				}
				r.store.setDown(false)
				if !within(r.commit.all, time.Minute) {
					_, last := r.commit.commits()
					t.Fatalf("not all committed once Redis came back: committed %v, batches %v (fatal %v)", last, growthKeys(r.h.snapshot()), r.fatal)
				}
				cancel()
				<-done
				if r.fatal != nil {
					t.Fatal(r.fatal)
				}
				var order []growthKey
				for i, b := range r.h.snapshot() {
					if len(b.msgs) > want {
						t.Errorf("batch %d holds %d messages, past the bound %d", i, len(b.msgs), want)
					}
					order = append(order, b.msgs...)
				}
				var sent []growthKey
				for _, m := range msgs {
					sent = append(sent, growthKey{int64(m.Partition), m.Offset})
				}
				if !slices.Equal(order, sent) {
					t.Errorf("prepared in order %v, want %v (each once)", order, sent)
				}
				if got := r.passed(); got != n {
					t.Errorf("model counted %d attempts, want %d", got, n)
				}
			})
		})
	}
}

// The generation ends, the process shuts down, the drain times out, or an earlier batch's apply
// fails while a batch grows past its linger: a growing batch is still prepared and handled when
// the generation or the process ends (and committed under it), later messages stay unread,
// nothing is committed past what was published, nothing is left running, and the loop ends in
// bounded time.
func TestGenerationEndsWhileABatchGrows(t *testing.T) {
	for _, end := range []string{"rebalance", "shutdown", "drain_timeout", "apply_fails"} {
		t.Run(end, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const drain = 10 * time.Second
				gate := make(chan struct{})
				r := growthNewRig(t, 3, 100, 10*time.Millisecond, map[string]chan struct{}{"a": gate})
				r.group.cfg.DrainTimeout = drain
				fail := make(chan error, 1)
				if end == "apply_fails" {
					r.store.fails["a"] = fail
				}
				in := make(chan kafka.Message, 16)
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				gctx, gcancel := context.WithCancel(ctx)
				defer gcancel()
				done := r.run(ctx, gctx, in)
				defer func() { cancel(); <-done }() // nothing left running, even after a failure

				in <- growthMsg(0, 0, "a")
				if !within(r.tr.seen("apply a"), time.Minute) {
					t.Fatalf("batch 0 not applied: %s", r.tr)
				}
				in <- growthMsg(0, 1, "b")
				if !within(r.tr.seen("prepared 1"), time.Minute) {
					t.Fatalf("batch 1 not prepared: %s", r.tr)
				}
				for i := int64(2); i < 5; i++ {
					time.Sleep(20 * time.Millisecond)
					in <- growthMsg(0, i, fmt.Sprint("c", i))
				}
				time.Sleep(100 * time.Millisecond)
				if bs := r.h.snapshot(); len(bs) != 2 {
					t.Fatalf("batches %v: batch 2 should still be growing past its linger; the test tests nothing", growthShape(bs))
				}
				ended := time.Now()
				switch end {
				case "rebalance", "drain_timeout":
					gcancel()
				case "shutdown":
					cancel()
				case "apply_fails":
					fail <- fmt.Errorf("%w: injected", aggregator.ErrWritesLost)
				}
				late := 0
				switch end {
				case "rebalance", "shutdown":
					if !within(r.tr.seen("prepared 2"), time.Second) {
						t.Fatalf("the growing batch was not prepared when the generation ended: %s", r.tr)
					}
					in <- growthMsg(0, 5, "late") // after the end: never read
					late = 1
					if got := growthOffsets(r.h.snapshot()[2]); !slices.Equal(got, []int64{2, 3, 4}) {
						t.Errorf("the growing batch closed with %v, want 2..4", got)
					}
					close(gate)
					if !within(done, drain) {
						t.Fatalf("the loop did not end within the drain: %s", r.tr)
					}
					if n, last := r.commit.commits(); n == 0 || last[0] != 5 {
						t.Errorf("committed up to %v (%d commits) under the ending generation, want 5: the growing batch is drained and committed", last, n)
					}
				case "drain_timeout":
					if !within(r.tr.seen("prepared 2"), time.Second) {
						t.Fatalf("the growing batch was not prepared when the generation ended: %s", r.tr)
					}
					in <- growthMsg(0, 5, "late") // after the end: never read
					late = 1
					if !within(done, drain+time.Second) {
						t.Fatalf("the loop did not end within DrainTimeout of the generation's end: %s", r.tr)
					}
					if waited := time.Since(ended); waited > drain {
						t.Errorf("the loop ended %v after the generation, past DrainTimeout %v", waited, drain)
					}
					if n, last := r.commit.commits(); n != 0 {
						t.Errorf("committed %v although batch 0 was never applied", last)
					}
				case "apply_fails":
					if !within(done, time.Second) {
						t.Fatalf("the loop did not end after batch 0's apply failed: %s", r.tr)
					}
					if n, last := r.commit.commits(); n != 0 {
						t.Errorf("committed %v although batch 0 failed", last)
					}
					if r.tr.index("apply begins 1") >= 0 || r.tr.index("apply begins 2") >= 0 {
						t.Errorf("a batch after the failed one was applied: %s", r.tr)
					}
				}
				if got := len(in); got != late {
					t.Errorf("%d messages left in the input channel, want %d: none is read after the end", got, late)
				}
				if r.fatal != nil {
					t.Errorf("fatal %v", r.fatal)
				}
				// synctest.Test fails if any goroutine of the loop is left blocked.
			})
		})
	}
}

// In real time: a batch past its linger waiting for the one before it to be taken must cost little
// CPU (no spinning, no busy polling), and nothing runs once the pipeline is idle.
func TestBatchGrowthWaitingIsCheap(t *testing.T) {
	gate := make(chan struct{})
	r := growthNewRig(t, 3, 1000, 5*time.Millisecond, map[string]chan struct{}{"a": gate})
	r.commit.want = map[int]int64{0: 3}
	in := make(chan kafka.Message, 4)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := r.run(ctx, ctx, in)
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: %s", what, r.tr)
		}
	}
	in <- growthMsg(0, 0, "a")
	wait(r.tr.seen("apply a"), "batch 0 not applied")
	in <- growthMsg(0, 1, "b")
	wait(r.tr.seen("prepared 1"), "batch 1 not prepared")
	in <- growthMsg(0, 2, "c")
	time.Sleep(50 * time.Millisecond)
	if bs := r.h.snapshot(); len(bs) != 2 {
		t.Fatalf("batches %v: batch 2 should be waiting past its linger; the test tests nothing", growthShape(bs))
	}
	measure := func(d time.Duration) float64 {
		c0, w0 := testenv.OwnCPU(t), time.Now()
		time.Sleep(d)
		return float64(testenv.OwnCPU(t)-c0) / float64(time.Since(w0))
	}
	waiting := measure(600 * time.Millisecond)
	close(gate)
	wait(r.commit.all, "not all committed")
	time.Sleep(50 * time.Millisecond)
	idle := measure(300 * time.Millisecond)
	cancel()
	<-done
	t.Logf("CPU while batch 2 waits: %.1f%% of a core; idle: %.1f%%", 100*waiting, 100*idle)
	if waiting > 0.3 {
		t.Errorf("the process used %.0f%% of a core while a batch waited past its linger: the poll spins", 100*waiting)
	}
	if idle > 0.15 {
		t.Errorf("the process used %.0f%% of a core while idle", 100*idle)
	}
}

// growthSlowStore is a Store (no encoder: Apply is what the processor calls) whose applies take a
// while, so that batches queue behind it.
type growthSlowStore struct {
	Store
	delay time.Duration
}

func (s growthSlowStore) Apply(ctx context.Context, obs []aggregator.Observation, at time.Time) (aggregator.Applied, error) {
	time.Sleep(s.delay)
	return s.Store.Apply(ctx, obs, at)
}

// On real Kafka and Redis, with a slow Redis and a stream that trickles in faster than it is
// applied: batches grow behind the one waiting, yet every message is applied and committed once,
// commits cover only published batches, Redis holds the counts of one clean pass, and the last
// (partial) batch closes by itself.
func TestGrowingBatchesOnKafkaAndRedis(t *testing.T) {
	brokers := testenv.KafkaBrokers(t)
	client := testenv.Redis(t)
	ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
	defer cancel()
	name := testenv.Name(t, "grow8")
	testenv.CleanPrefix(t, client, name)
	createTopic(ctx, t, brokers, name, 1)
	msgs := repeatedLive(0, 303, 43, 5) // 260 opportunities, every fourth confirmed, 43 sent again
	cfg := aggregator.RedisConfig{Prefix: name, Retention: 30 * 24 * time.Hour, Group: name}
	rates, suites := redisStores(t, client, cfg)
	metrics := NewMetrics(prometheus.NewRegistry())
	p, err := NewProcessor(ProcessorConfig{RetryMin: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond}, newTestDecoder(t),
		growthSlowStore{Store: rates, delay: 40 * time.Millisecond}, suites, &lockedPublisher{}, &recordingDLQ{},
		func() time.Time { return now }, zap.NewNop(), metrics)
	if err != nil {
		t.Fatal(err)
	}
	h := &auditHandler{Processor: p, t: t, prepared: map[int64]int{}, published: map[int64]bool{}}
	sizes := &growthSizes{auditHandler: h}
	g, err := NewGroup(GroupConfig{Brokers: brokers, GroupID: name, Topics: []string{name}, MaxBatch: 1000, Linger: 5 * time.Millisecond,
		DrainTimeout: 10 * time.Second, MaxInFlight: DefaultMaxInFlight, SessionTimeout: 6 * time.Second}, sizes, zap.NewNop(), metrics)
	if err != nil {
		t.Fatal(err)
	}
	ran, stop := runGroup(ctx, t, g)
	defer stop()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: name, RequiredAcks: kafka.RequireOne, BatchTimeout: time.Millisecond}
	defer w.Close()
	writeAll(ctx, t, w, msgs[:1]) // the topic is ready
	for i := 1; i < len(msgs); i += 3 {
		if err := w.WriteMessages(ctx, msgs[i:min(i+3, len(msgs))]...); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for {
		committed, failures, _ := h.state()
		if committed == int64(len(msgs)) {
			if failures != 0 {
				t.Errorf("%d publish failures", failures)
			}
			break
		}
		select {
		case err := <-ran:
			t.Fatalf("group stopped: %v", err)
		case <-ctx.Done():
			t.Fatalf("committed up to %d of %d; batches %v", committed, len(msgs), sizes.get())
		case <-time.After(20 * time.Millisecond):
		}
	}
	_, _, prepared := h.state()
	for off := range int64(len(msgs)) {
		if prepared[off] != 1 {
			t.Errorf("offset %d prepared %d times, want once", off, prepared[off])
		}
	}
	tally, err := rates.Tally(ctx, deepKey, now)
	if err != nil {
		t.Fatal(err)
	}
	if w := tally.Snapshot(deepKey, now).Windows.All; w.Passed != 195 || w.ConfirmedRepeats != 65 {
		t.Errorf("redis holds %d passed and %d confirmed; one clean pass gives 195 and 65", w.Passed, w.ConfirmedRepeats)
	}
	t.Logf("batch sizes: %v", sizes.get())
}

// growthSizes records the size of every batch prepared.
type growthSizes struct {
	*auditHandler
	mu    sync.Mutex
	sizes []int
}

func (s *growthSizes) Prepare(msgs []kafka.Message) (*Batch, error) {
	s.mu.Lock()
	s.sizes = append(s.sizes, len(msgs))
	s.mu.Unlock()
	return s.auditHandler.Prepare(msgs)
}

func (s *growthSizes) get() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sizes)
}
