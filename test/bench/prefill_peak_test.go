package main

import (
	"testing"
	"time"
)

// TestPrefillPeakIsTheLargestReading: the prefill's Redis peak is the largest of the readings taken
// while it ran (one at the start, one at each tick, one when it stops), and stopping again returns
// it again.
func TestPrefillPeakIsTheLargestReading(t *testing.T) {
	for _, tc := range []struct {
		name     string
		readings []float64 // at the start, at each tick, and when stopped
		want     float64
	}{
		{"rising, the last largest", []float64{1, 2, 3, 9}, 9},
		{"a peak in the middle", []float64{5, 40, 7, 6}, 40},
		{"the first largest", []float64{50, 1, 1, 1}, 50},
		{"no tick", []float64{3, 8}, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			taken := make(chan struct{})
			n := 0
			read := func() float64 {
				v := tc.readings[n]
				n++
				taken <- struct{}{}
				return v
			}
			tick := make(chan time.Time)
			stop := samplePeak(read, tick)
			<-taken // the first reading
			for range len(tc.readings) - 2 {
				tick <- time.Now()
				<-taken
			}
			go func() { <-taken }() // the reading stop takes
			if got := stop(); got != tc.want {
				t.Fatalf("peak %v, want %v", got, tc.want)
			}
			if got := stop(); got != tc.want {
				t.Fatalf("stopped again: peak %v, want %v", got, tc.want)
			}
		})
	}
}
