package consumer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
)

// reuseHandler checks that a batch's messages are still the ones it was prepared with when it is
// applied and published (a slice handed back to collect too early would be filled with later
// messages), and records which backing arrays the batches used.
type reuseHandler struct {
	traceHandler
	t      *testing.T
	mu     sync.Mutex
	seen   map[*Batch][]int64
	arrays map[*kafka.Message]int
}

func offsetsOf(msgs []kafka.Message) []int64 {
	var offs []int64
	for _, m := range msgs {
		offs = append(offs, m.Offset)
	}
	return offs
}

func (h *reuseHandler) Prepare(msgs []kafka.Message) (*Batch, error) {
	b, err := h.traceHandler.Prepare(msgs)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[b] = offsetsOf(msgs)
	h.arrays[&msgs[:1][0]]++
	return b, err
}

func (h *reuseHandler) check(b *Batch, when string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if got := offsetsOf(b.Messages()); !slices.Equal(got, h.seen[b]) {
		h.t.Errorf("%s: batch prepared with offsets %v holds %v", when, h.seen[b], got)
	}
}

func (h *reuseHandler) Apply(ctx context.Context, b *Batch) error {
	h.check(b, "apply")
	return h.traceHandler.Apply(ctx, b)
}

func (h *reuseHandler) Publish(ctx context.Context, b *Batch) error {
	h.check(b, "publish")
	err := h.traceHandler.Publish(ctx, b)
	h.check(b, "published")
	return err
}

// Collect fills the message slices of published batches again, never one still in flight: every
// batch holds the messages it was prepared with until its publish ended, every offset is
// committed, and slices were in fact reused (or the test checks nothing).
func TestBatchSlicesReusedOnlyAfterPublish(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour)}
		r := newPipelineRig(t, 3, store, &gatePublisher{tr: tr})
		h := &reuseHandler{traceHandler: r.group.handler.(traceHandler), t: t, seen: map[*Batch][]int64{}, arrays: map[*kafka.Message]int{}}
		r.group.handler = h
		r.group.cfg.MaxBatch = 4
		const n = 60
		in := make(chan kafka.Message, n)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(ctx, ctx, 1, r.commit, in)
		}()
		// In bursts of uneven size, so batches of different lengths share slices.
		for off := 0; off < n; {
			for k := 0; k < 1+off%7 && off < n; k++ {
				in <- liveMessage(int64(off), fmt.Sprint("o", off), "passed")
				off++
			}
			time.Sleep(time.Millisecond)
		}
		if !within(tr.seen(fmt.Sprint("commit ", n)), time.Hour) {
			t.Fatalf("offset %d not committed: %s", n, tr)
		}
		cancel()
		<-done
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.arrays) >= len(h.seen) {
			t.Fatalf("%d batches in %d slices: none reused", len(h.seen), len(h.arrays))
		}
		var all []int64
		for _, offs := range h.seen {
			all = append(all, offs...)
		}
		slices.Sort(all)
		if len(all) != n || all[0] != 0 || all[n-1] != n-1 {
			t.Fatalf("batches held offsets %v, want 0 to %d once each", all, n-1)
		}
	})
}
