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

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
)

// gatedCommitter is a generation's committer whose commits wait for gate (when set) and fail
// with fail (when set), recording each call's offset of partition 0 in the trace.
type gatedCommitter struct {
	tr    *trace
	gate  chan struct{}
	fail  error
	mu    sync.Mutex
	calls []int64
}

func (c *gatedCommitter) CommitOffsets(offsets map[string]map[int]int64) error {
	off := offsets["in"][0]
	c.tr.add("commit begins %d", off)
	if c.gate != nil {
		<-c.gate
	}
	c.mu.Lock()
	c.calls = append(c.calls, off)
	c.mu.Unlock()
	if c.fail != nil {
		return c.fail
	}
	c.tr.add("commit %d", off)
	return nil
}

func (c *gatedCommitter) made() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.calls...)
}

// sixBatches is one live attempt per batch (MaxBatch 1) of opportunities a to f, offsets 0 to 5.
func sixBatches() []kafka.Message {
	var msgs []kafka.Message
	for i, opp := range []string{"a", "b", "c", "d", "e", "f"} {
		msgs = append(msgs, liveMessage(int64(i), opp, "passed"))
	}
	return msgs
}

// A Kafka commit that takes long holds no Apply back (it is sent from a goroutine of its own),
// but the generation's batch loop does not return before it was made, and the commit it makes
// last covers every batch: nothing queued is dropped, nothing is committed before its Verify.
func TestSlowCommitHoldsNoApplyButTheEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		r := newPipelineRig(t, 2, store, &gatePublisher{tr: tr})
		r.group.cfg.CommitDelay = time.Second
		c := &gatedCommitter{tr: tr, gate: make(chan struct{})}
		ctx, cancel := context.WithCancel(t.Context())
		// Batches a and b first; c to f only once the commit of a and b waits for the broker.
		msgs := sixBatches()
		in := make(chan kafka.Message, len(msgs))
		in <- msgs[0]
		in <- msgs[1]
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(ctx, ctx, 1, c, in)
		}()
		if !within(tr.seen("commit begins 2"), time.Hour) {
			t.Fatalf("no commit of batches a and b began: %s", tr)
		}
		for _, m := range msgs[2:] {
			in <- m
		}
		if !within(tr.seen("applied f"), time.Hour) {
			t.Fatalf("batches were not applied while a commit waited for the broker: %s", tr)
		}
		cancel()
		if within(done, time.Hour) {
			t.Fatalf("the batch loop returned while a commit was still being made: %s", tr)
		}
		close(c.gate)
		if !within(done, time.Hour) {
			t.Fatalf("the batch loop did not return once the commit was made: %s", tr)
		}
		if r.fatal != nil {
			t.Fatal(r.fatal)
		}
		calls := c.made()
		if len(calls) == 0 || calls[len(calls)-1] != 6 {
			t.Fatalf("commits %v, want the last to cover every batch (offset 6): %s", calls, tr)
		}
		for i, off := range calls {
			if i > 0 && off <= calls[i-1] {
				t.Errorf("commits %v do not grow", calls)
			}
			v := slices.IndexFunc(tr.events, func(e string) bool {
				var mark, o int64
				n, _ := fmt.Sscanf(e, "verify %d up to offset %d", &mark, &o)
				return n == 2 && o == off
			})
			if v < 0 || v > tr.index(fmt.Sprintf("commit begins %d", off)) {
				t.Errorf("offset %d committed without a Verify of it before: %s", off, tr)
			}
			if tr.index(fmt.Sprintf("commit begins %d", off)) < tr.index(fmt.Sprintf("published %d", off)) {
				t.Errorf("offset %d committed before its batch was published: %s", off, tr)
			}
		}
	})
}

// A failed Kafka commit ends the generation's batch loop, as one made on the apply goroutine did:
// no later offsets are committed (the batches are consumed again), and the group is not stopped.
func TestFailedCommitEndsTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		r := newPipelineRig(t, 2, store, &gatePublisher{tr: tr})
		r.group.cfg.CommitDelay = time.Second
		c := &gatedCommitter{tr: tr, fail: errors.New("rebalance in progress")}
		in := make(chan kafka.Message, 6)
		for _, m := range sixBatches() {
			in <- m
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(t.Context(), t.Context(), 1, c, in)
		}()
		if !within(done, time.Hour) {
			t.Fatalf("the batch loop did not end after a failed commit: %s", tr)
		}
		if r.fatal != nil {
			t.Fatalf("a failed commit stopped the group: %v", r.fatal)
		}
		if calls := c.made(); len(calls) != 1 {
			t.Fatalf("commits tried %v, want only the one that failed: %s", calls, tr)
		}
	})
}
