package consumer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/repeatrate/repeatrate/aggregator"
)

// A published batch gives its place back at once, not when the goroutine that applies batches
// next looks at it: while Redis holds batch b's apply, batch c is already collected and decoded,
// so that it is ready the moment b's apply returns. Before, a's place stayed taken until b's
// apply returned, and with two places c was not even collected meanwhile.
func TestPublishedBatchFreesItsPlaceDuringTheNextApply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		gate := make(chan struct{})
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour), gates: map[string]chan struct{}{"b": gate}}
		r := newPipelineRig(t, 2, store, &gatePublisher{tr: tr})
		ctx, cancel := context.WithCancel(t.Context())
		msgs := sixBatches()[:3]
		done := r.run(ctx, msgs)
		if !within(tr.seen("apply b"), time.Hour) {
			t.Fatalf("batch b never applied: %s", tr)
		}
		if !within(tr.seen("prepared 2"), time.Hour) {
			t.Fatalf("batch c not prepared while b's apply waited for Redis, with a published: %s", tr)
		}
		if tr.index("applied b") >= 0 {
			t.Fatalf("b's apply returned before its gate opened: %s", tr)
		}
		close(gate)
		if !within(tr.seen("applied c"), time.Hour) {
			t.Fatalf("batch c never applied: %s", tr)
		}
		// Every batch published, and committed up to its end once published, in order.
		if !within(tr.seen("commit 3"), time.Hour) {
			t.Fatalf("offsets of c never committed: %s", tr)
		}
		cancel()
		<-done
		if r.fatal != nil {
			t.Fatal(r.fatal)
		}
		for i, c := range r.commit.commits {
			if i > 0 && c <= r.commit.commits[i-1] {
				t.Fatalf("commits went back: %v", r.commit.commits)
			}
		}
		if got := len(r.pub.snaps); got < 3 {
			t.Fatalf("%d snapshots published, want one per batch at least: %s", got, tr)
		}
	})
}
