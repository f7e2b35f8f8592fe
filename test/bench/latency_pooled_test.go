package main

import (
	"math"
	"testing"
)

// TestPooledLatencyWeighsEveryEvent holds what make bench's latency figures promise: a quantile
// over several runs is the one over all their events together, so one slow run moves the p99 by
// its share of the events, and the spread names each run's own quantile.
func TestPooledLatencyWeighsEveryEvent(t *testing.T) {
	run := func(lo, n int) latencies { // n events of lo, lo+1, … ms
		l := make(latencies, n)
		for i := range l {
			l[i] = float64(lo + i)
		}
		return l
	}
	fast1, fast2, slow := run(0, 100), run(0, 100), run(1000, 100)
	all := pooled([]latencies{fast1, slow, fast2})
	if len(all) != 300 {
		t.Fatalf("pooled %d events, want 300", len(all))
	}
	// 300 events: ranks 0–199 are the fast runs' (0–99 twice), 200–299 the slow run's.
	for _, tc := range []struct{ q, want float64 }{{0, 0}, {0.5, 75}, {0.66, 99}, {0.67, 1001}, {0.99, 1097}} {
		if got := all.at(tc.q); got != tc.want {
			t.Errorf("pooled at(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := fast1.at(0.99); got != 99 {
		t.Errorf("one run's p99 = %v, want 99", got)
	}
	if got := spread([]latencies{fast1, slow, fast2}, 0.99); got != "99.0–1099.0" {
		t.Errorf("spread of p99 = %q, want 99.0–1099.0", got)
	}
	if !math.IsNaN(latencies(nil).at(0.5)) {
		t.Error("an empty run has no quantile")
	}
}
