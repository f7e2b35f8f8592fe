package suite

import (
	"math"
	"testing"
)

func TestPassAtKVectors(t *testing.T) {
	near := func(a, b float64) bool { return math.Abs(a-b) < 5e-7 }
	tests := []struct {
		name    string
		n, c, k int
		f       func(n, c, k int) float64
		want    float64
	}{
		// The reference vectors (GPassK's definitions).
		{"pass@4 of 8/16", 16, 8, 4, PassAtK, 0.961538},
		{"mG-Pass@4 of 8/16", 16, 8, 4, MGPassAtK, 0.161538},
		{"pass@5 of 3/10", 10, 3, 5, PassAtK, 0.916667},
		{"G-Pass@5 tau .5 of 3/10", 10, 3, 5, func(n, c, k int) float64 { return GPassAtK(n, c, k, 0.5) }, 0.083333},
		// All passing: everything is 1.
		{"pass@k all pass", 10, 10, 5, PassAtK, 1},
		{"mG-Pass@k all pass", 10, 10, 4, MGPassAtK, 1},
		// The reference code sums i = ⌈k/2⌉+1..k, so for odd k an all-pass case gets (k−1)/k.
		{"mG-Pass@5 all pass, odd k", 10, 10, 5, MGPassAtK, 0.8},
		{"G-Pass@k tau 1 all pass", 10, 10, 5, func(n, c, k int) float64 { return GPassAtK(n, c, k, 1) }, 1},
		// None passing: everything is 0.
		{"pass@k none", 10, 0, 5, PassAtK, 0},
		{"mG-Pass@k none", 10, 0, 5, MGPassAtK, 0},
		{"G-Pass@k tau 0 none", 10, 0, 5, func(n, c, k int) float64 { return GPassAtK(n, c, k, 0) }, 0},
		// pass@1 is the pass fraction.
		{"pass@1", 7, 3, 1, PassAtK, 3.0 / 7},
	}
	for _, tc := range tests {
		if got := tc.f(tc.n, tc.c, tc.k); !near(got, tc.want) {
			t.Errorf("%s: got %.6f, want %.6f", tc.name, got, tc.want)
		}
	}
	// G-Pass@k at tau 0 is pass@k, and the product form agrees with the binomial form everywhere.
	for n := 1; n <= 40; n++ {
		for c := 0; c <= n; c++ {
			for k := 1; k <= n; k++ {
				direct := 1 - math.Exp(logChoose(n-c, k)-logChoose(n, k))
				if p := PassAtK(n, c, k); math.Abs(p-direct) > 1e-9 || math.Abs(GPassAtK(n, c, k, 0)-p) > 1e-9 {
					t.Fatalf("n=%d c=%d k=%d: product %v, binomial %v, G-Pass@k(0) %v", n, c, k, p, direct, GPassAtK(n, c, k, 0))
				}
			}
		}
	}
	// Large n stays finite.
	if p := PassAtK(100000, 3, 10); math.IsNaN(p) || p <= 0 || p >= 1 {
		t.Fatalf("pass@10 of 3/100000 = %v", p)
	}
}
