package aggregator

import (
	"fmt"
	"testing"
)

// TestBatchChunksCoverItsCallsOnceInOrder: a batch's chunks hold every one of its aggregates once,
// in the batch's order, at most maxChunks of them and each of at least the fewest calls asked
// (a batch with fewer is one chunk), and share its observations.
func TestBatchChunksCoverItsCallsOnceInOrder(t *testing.T) {
	for _, minCalls := range []int{1, 2, 3, 64} {
		for calls := 0; calls <= 300; calls++ {
			e := &Encoded{obs: make([]Observation, 1), groups: map[Key][]int{}}
			for i := range calls {
				e.keys = append(e.keys, Key{CorrectionID: fmt.Sprint(i)})
			}
			chunks := e.chunks(minCalls)
			if len(chunks) > maxChunks || len(chunks) == 0 {
				t.Fatalf("%d calls, chunks of %d: %d chunks", calls, minCalls, len(chunks))
			}
			if want := min(maxChunks, max(1, calls/minCalls)); len(chunks) != want {
				t.Fatalf("%d calls, chunks of %d: %d chunks, want %d", calls, minCalls, len(chunks), want)
			}
			var all []Key
			for _, ch := range chunks {
				if len(chunks) > 1 && len(ch.keys) < minCalls {
					t.Fatalf("%d calls, chunks of %d: a chunk of %d", calls, minCalls, len(ch.keys))
				}
				if &ch.obs[0] != &e.obs[0] {
					t.Fatalf("%d calls: a chunk holds observations of its own", calls)
				}
				all = append(all, ch.keys...)
			}
			if len(all) != calls {
				t.Fatalf("%d calls, chunks of %d: the chunks hold %d", calls, minCalls, len(all))
			}
			for i, k := range all {
				if k != e.keys[i] {
					t.Fatalf("%d calls, chunks of %d: call %d is %v, want %v", calls, minCalls, i, k, e.keys[i])
				}
			}
		}
	}
}
