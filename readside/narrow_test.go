package readside

import (
	"testing"

	"github.com/repeatrate/repeatrate/aggregator"
)

// TestNarrowness: which measured windows the pages draw as resting on thin evidence, at the edges
// of fewScored (20) and wideInterval (20 points).
func TestNarrowness(t *testing.T) {
	for _, tc := range []struct {
		name              string
		confirmed, passed int64
		unscored          int64
		want              string
	}{
		{"not measured", 0, 0, 5, ""},
		{"one scored", 0, 1, 0, "few scored"},
		{"19 scored", 0, 19, 0, "few scored"},
		{"20 scored, none confirmed: 0–16.1 %", 0, 20, 0, ""},
		{"seed example 4/20: 8.1–41.6 %", 4, 16, 0, "wide interval"},
		{"3/30: 3.5–25.6 %", 3, 27, 0, "wide interval"},
		{"10/40: 14.2–40.2 %", 10, 30, 0, "wide interval"},
		{"20/100: 13.3–28.9 %", 20, 80, 0, ""},
		{"10/400: 1.4–4.5 %", 10, 390, 0, ""},
		{"half of 100: 40.4–59.6 %", 50, 50, 0, ""},
		{"half of 90: 39.9–60.1 %", 45, 45, 0, "wide interval"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := aggregator.Counts{Confirmed: tc.confirmed, Passed: tc.passed, Unscored: tc.unscored}.Window()
			if got := narrowness(w); got != tc.want {
				t.Fatalf("narrowness(%d/%d) = %q, want %q (interval %+v)", tc.confirmed, tc.confirmed+tc.passed, got, tc.want, w.CI95)
			}
		})
	}
}
