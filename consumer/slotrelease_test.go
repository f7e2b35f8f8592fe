package consumer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/aggregator"
)

// A full published batch gives its place back at once, not when the goroutine that applies
// batches next looks at it: while Redis holds batch b's apply, batch c is already collected and
// decoded, so that it is ready the moment b's apply returns. Before, a's place stayed taken until
// b's apply returned, and with two places c was not even collected meanwhile. (The rig's batches
// hold one message, MaxBatch: each is full.)
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

// A batch its linger closed (not full: input was not waiting) keeps its place until the applying
// goroutine takes it, as before: with two places, c is not collected while b's apply waits, and
// under light load messages gather in fewer batches.
func TestLingeredBatchKeepsItsPlaceUntilTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &trace{}
		gate := make(chan struct{})
		store := &gateStore{tr: tr, model: aggregator.NewModel(30 * 24 * time.Hour), gates: map[string]chan struct{}{"b": gate}}
		// a's publish waits until b's apply began, so that a is published while b applies.
		pubGate := make(chan struct{})
		pub := &gatePublisher{tr: tr, hold: map[int64]func(context.Context) error{1: func(context.Context) error { <-pubGate; return nil }}}
		r := newPipelineRig(t, 2, store, pub)
		r.group.cfg.MaxBatch = 10
		ctx, cancel := context.WithCancel(t.Context())
		msgs := sixBatches()[:3]
		in := make(chan kafka.Message, len(msgs))
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.group.batches(ctx, ctx, 1, r.commit, in)
		}()
		// One message per linger: each batch closes by its linger, one message of ten.
		for _, m := range msgs {
			in <- m
			time.Sleep(50 * time.Millisecond)
		}
		if !within(tr.seen("apply b"), time.Hour) {
			t.Fatalf("batch b never applied: %s", tr)
		}
		close(pubGate)
		if !within(tr.seen("published 1"), time.Hour) {
			t.Fatalf("batch a never published: %s", tr)
		}
		// A minute of the bubble's time: less than a stage's 10 minutes, which would fail b.
		if within(tr.seen("prepared 2"), time.Minute) {
			t.Fatalf("batch c collected while b's apply waited, with a's place given back early: %s", tr)
		}
		close(gate)
		if !within(tr.seen("applied c"), time.Hour) {
			t.Fatalf("batch c never applied: %s", tr)
		}
		cancel()
		<-done
		if r.fatal != nil {
			t.Fatal(r.fatal)
		}
	})
}
