package aggregator

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestInParallelCallsEachOnceAndWaits holds what computeCalls relies on when it computes a chunk's
// calls side by side: every index is computed exactly once, whether the calls hold fewer records
// than the threshold (one goroutine) or more, and inParallel returns only once every computation
// has.
func TestInParallelCallsEachOnceAndWaits(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 17, 300} {
		for _, records := range []int{0, 255, 256, 10_000} {
			counts := make([]atomic.Int32, n)
			inParallel(n, records, minParallelRecords, func(i int) { counts[i].Add(1) })
			for i := range counts {
				if c := counts[i].Load(); c != 1 {
					t.Fatalf("n %d, records %d: index %d computed %d times", n, records, i, c)
				}
			}
		}
	}

	// One computation held back: inParallel must not return before it does.
	release, returned := make(chan struct{}), make(chan struct{})
	var others atomic.Int32
	const n = 40
	go func() {
		defer close(returned)
		inParallel(n, 1000, minParallelRecords, func(i int) {
			if i == 0 {
				<-release
				return
			}
			others.Add(1)
		})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for others.Load() < n-1 {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("%d of the other %d computations done in 30 s", others.Load(), n-1)
		}
		runtime.Gosched()
	}
	select {
	case <-returned:
		t.Fatal("inParallel returned before its held-back computation did")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	<-returned
}

// TestInParallelComputesSideBySide holds that calls past the threshold are computed on more than
// one goroutine where there is more than one core: the first waits until the second has begun,
// which one goroutine computing them in turn would never do.
func TestInParallelComputesSideBySide(t *testing.T) {
	if runtime.GOMAXPROCS(0) < 2 {
		t.Skip("one core: inParallel computes in turn")
	}
	second := make(chan struct{})
	failed := make(chan string, 1)
	inParallel(2, minParallelRecords, minParallelRecords, func(i int) {
		if i == 1 {
			close(second)
			return
		}
		select {
		case <-second:
		case <-time.After(30 * time.Second):
			failed <- "the second computation had not begun 30 s after the first"
		}
	})
	select {
	case msg := <-failed:
		t.Fatal(msg)
	default:
	}
}
