package alert

import (
	"math"
	"testing"
	"time"
)

// Expected values were computed independently with Python's exact integer binomials (math.comb)
// and a bisection on the same mixture in math.lgamma.
func TestFisherGreater(t *testing.T) {
	tests := []struct {
		name         string
		recent, base Counts
		want         float64
	}{
		// The known value: 9/40 against 2/40, one-sided.
		{"9/40 over 2/40", Counts{9, 40}, Counts{2, 40}, 0.02381},
		// No difference at all: most of the mass is at or above the observed count.
		{"equal", Counts{5, 50}, Counts{5, 50}, 0.62967},
		// Nothing scored on one side: no evidence.
		{"empty baseline", Counts{3, 5}, Counts{0, 0}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := FisherGreater(tc.recent, tc.base); math.Abs(got-tc.want) > 5e-4 {
				t.Errorf("p = %.5f, want %.5f", got, tc.want)
			}
		})
	}
}

func TestConfidenceSequence(t *testing.T) {
	tests := []struct {
		name      string
		c         Counts
		alpha     float64
		low, high float64 // expected bounds, ±1e-3
	}{
		// Nothing scored: every rate is possible.
		{"empty", Counts{0, 0}, 0.05, 0, 1},
		// 0 of 5: the lower end is 0; the upper solves (1/6)/(1−p)^5 = 20, p = 1 − 120^(−1/5).
		{"0/5", Counts{0, 5}, 0.05, 0, 0.6161},
		// 20 of 1000 at alpha 0.05: wider than Wilson's [0.0130, 0.0307], as a sequence must be.
		{"20/1000", Counts{20, 1000}, 0.05, 0.0073, 0.0421},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lo, hi := ConfidenceSequence(tc.c, tc.alpha)
			if math.Abs(lo-tc.low) > 1e-3 || math.Abs(hi-tc.high) > 1e-3 {
				t.Errorf("[%.4f, %.4f], want [%.4f, %.4f]", lo, hi, tc.low, tc.high)
			}
			if tc.c.Scored > 0 && (lo > tc.c.Rate() || hi < tc.c.Rate()) {
				t.Errorf("[%.4f, %.4f] excludes the estimate %.4f", lo, hi, tc.c.Rate())
			}
			// At the ends the mixture equals the bound: 1/alpha.
			for _, b := range []float64{lo, hi} {
				if b > 0 && b < 1 && math.Abs(logMixture(tc.c.Confirmed, tc.c.Scored, b)-math.Log(1/tc.alpha)) > 1e-6 {
					t.Errorf("log M at %.4f = %.6f, want log(1/alpha)", b, logMixture(tc.c.Confirmed, tc.c.Scored, b))
				}
			}
		})
	}
}

func TestChangeTest(t *testing.T) {
	day, month := time.Hour, 30*24*time.Hour
	tests := []struct {
		name         string
		recent, base Counts
		minIncrease  float64
		fires        bool
	}{
		// 3 of 5 after 0 of 5: a big rate on tiny samples proves nothing.
		{"3/5 after 0/5", Counts{3, 5}, Counts{0, 5}, 0, false},
		// Fisher's 9/40 against 2/40 is p ≈ 0.024 at one look, far from α/720 per epoch.
		{"9/40 over 2/40", Counts{9, 40}, Counts{2, 40}, 0, false},
		// 15 % of 1000 after 2 % of 6000: fires.
		{"step 2% to 15%", Counts{150, 1000}, Counts{120, 6000}, 0.05, true},
		// The same step with a minimum increase larger than what the bounds can show.
		{"step below min_increase", Counts{150, 1000}, Counts{120, 6000}, 0.12, false},
		// Equal rates on large samples: no alarm.
		{"equal rates", Counts{200, 10000}, Counts{1200, 60000}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ch := ChangeTest(tc.recent, tc.base, 0.05, day, month, tc.minIncrease)
			if ch.Fires != tc.fires {
				t.Errorf("fires = %v, want %v (lower difference %.4f, alpha/epoch %.2g)", ch.Fires, tc.fires, ch.LowerDifference, ch.AlphaPerEpoch)
			}
			if math.Abs(ch.AlphaPerEpoch-0.05/720) > 1e-12 {
				t.Errorf("alpha per epoch %g, want %g", ch.AlphaPerEpoch, 0.05/720)
			}
		})
	}
}

func TestNormalQuantile(t *testing.T) {
	for q, want := range map[float64]float64{0.95: 1.6449, 0.975: 1.9600, 0.5: 0} {
		if got := NormalQuantile(q); math.Abs(got-want) > 1e-4 {
			t.Errorf("NormalQuantile(%v) = %.4f, want %.4f", q, got, want)
		}
	}
}
