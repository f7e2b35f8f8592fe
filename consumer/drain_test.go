package consumer

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/segmentio/kafka-go"
)

// TestDrainIsBoundedAsAWhole: each stage of a batch has DrainTimeout from its own start, so that
// a batch queued behind slow publishes does not spend its time waiting (the pipeline would rewind
// though no publish took long), but once the generation ends, everything in flight has
// DrainTimeout in all: four publishes of 20 s each, queued when a rebalance begins, must not
// hold the generation for 80 s.
func TestDrainIsBoundedAsAWhole(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxInFlight int
		publish     time.Duration
		want        time.Duration // the drain must end within this after the generation ended
		all         bool          // and must have published every batch in flight
	}{
		{"four in flight, slow publishes", 4, 20 * time.Second, 30 * time.Second, false},
		{"eight in flight, slow publishes", 8, 10 * time.Second, 30 * time.Second, false},
		// Four publishes of a second, then the commit delay (2 s): all of it fits.
		{"four in flight, quick publishes", 4, time.Second, 6 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				msgs := deepMessages(24)
				r := newDeepRig(t, tc.maxInFlight, "", -1, msgs)
				r.publishTime = tc.publish
				r.group.cfg.DrainTimeout = 30 * time.Second
				ctx := t.Context()
				gctx, gcancel := context.WithCancel(ctx)
				r.mu.Lock()
				r.gcancel, r.published = gcancel, map[int64]bool{}
				r.genCommits, r.versions = append(r.genCommits, nil), append(r.versions, nil)
				r.mu.Unlock()
				in := make(chan kafka.Message, len(msgs))
				for _, m := range msgs {
					in <- m
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					r.group.batches(ctx, gctx, 0, deepCommitter{r}, in)
				}()
				// Long enough for every place to fill: the first publish is still running.
				time.Sleep(tc.publish / 2)
				synctest.Wait()
				r.mu.Lock()
				full := r.inFlight
				r.mu.Unlock()
				if full < tc.maxInFlight-1 {
					t.Fatalf("%d batches in flight when the generation ended, want the pipeline full (%d)", full, tc.maxInFlight)
				}
				ended := time.Now()
				gcancel()
				<-done
				if took := time.Since(ended); took > tc.want {
					t.Errorf("the drain took %v after the generation ended, want at most %v (DrainTimeout 30s)", took, tc.want)
				}
				r.mu.Lock()
				defer r.mu.Unlock()
				if tc.all && r.publishOK != len(r.prepared) {
					t.Errorf("the drain published %d of the %d batches prepared", r.publishOK, len(r.prepared))
				}
			})
		})
	}
}
