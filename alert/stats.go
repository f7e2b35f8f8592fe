package alert

import (
	"math"
	"time"
)

// Counts are the scored opportunities of one window: confirmed repeats among scored.
type Counts struct {
	Confirmed int64 `json:"confirmed_repeats"`
	Scored    int64 `json:"scored"`
}

// valid reports whether the counts are possible: 0 ≤ Confirmed ≤ Scored. Windows computed from a
// malformed snapshot (or a baseline window smaller than the recent one) are not.
func (c Counts) valid() bool { return c.Confirmed >= 0 && c.Confirmed <= c.Scored }

// Rate is Confirmed/Scored; 0 when nothing was scored.
func (c Counts) Rate() float64 {
	if c.Scored == 0 {
		return 0
	}
	return float64(c.Confirmed) / float64(c.Scored)
}

// logMixture is the log of the beta-binomial mixture likelihood ratio of x successes in n trials
// against the rate p, with a uniform Beta(1, 1) mixing prior:
//
//	M_n(p) = ∫ θ^x (1−θ)^(n−x) dθ / (p^x (1−p)^(n−x)) = B(x+1, n−x+1) / (p^x (1−p)^(n−x)).
//
// Under i.i.d. Bernoulli(p) observations M_n(p) is a nonnegative martingale with M_0 = 1 (Robbins
// 1970), so by Ville's inequality P(∃n: M_n(p) ≥ 1/α) ≤ α: {p : M_n(p) < 1/α} is a confidence
// sequence, valid at every n at once however often it is looked at.
func logMixture(x, n int64, p float64) float64 {
	return logMixtureAt(logBetaMix(x, n), x, n, p)
}

// logBetaMix is log B(x+1, n−x+1), the part of logMixture that does not depend on p.
func logBetaMix(x, n int64) float64 {
	xf, nf := float64(x), float64(n)
	la, _ := math.Lgamma(xf + 1)
	lb, _ := math.Lgamma(nf - xf + 1)
	lc, _ := math.Lgamma(nf + 2)
	return la + lb - lc
}

// logMixtureAt is logMixture given lm = logBetaMix(x, n).
func logMixtureAt(lm float64, x, n int64, p float64) float64 {
	xf, nf := float64(x), float64(n)
	if x > 0 {
		lm -= xf * math.Log(p)
	}
	if n > x {
		lm -= (nf - xf) * math.Log1p(-p)
	}
	return lm
}

// ConfidenceSequence returns the beta-binomial mixture confidence sequence at level alpha for the
// rate of c.Confirmed successes in c.Scored trials: the interval of rates p with
// M_n(p) < 1/alpha. With no trials, or impossible counts, it is [0, 1].
func ConfidenceSequence(c Counts, alpha float64) (low, high float64) {
	if c.Scored <= 0 || !c.valid() {
		return 0, 1
	}
	bound := math.Log(1 / alpha)
	p := c.Rate()
	lm := logBetaMix(c.Confirmed, c.Scored)
	// log M is convex in p with its minimum (≤ 0) at the estimate: bisect each side.
	low, high = 0, 1
	if c.Confirmed > 0 {
		lo, hi := 0.0, p
		for range 60 {
			mid := (lo + hi) / 2
			if logMixtureAt(lm, c.Confirmed, c.Scored, mid) >= bound {
				lo = mid
			} else {
				hi = mid
			}
		}
		low = lo
	}
	if c.Confirmed < c.Scored {
		lo, hi := p, 1.0
		for range 60 {
			mid := (lo + hi) / 2
			if logMixtureAt(lm, c.Confirmed, c.Scored, mid) >= bound {
				hi = mid
			} else {
				lo = mid
			}
		}
		high = hi
	}
	return low, high
}

// ChangeMethod names the change rule's test in its evidence.
const ChangeMethod = "beta-binomial mixture confidence sequences, Bonferroni over window epochs"

// Change is the outcome of ChangeTest, the evidence of a change alert.
type Change struct {
	Recent, Baseline Counts
	// RecentLow is the lower end of the recent rate's confidence sequence, BaselineHigh the upper
	// end of the baseline's, each at level AlphaPerEpoch/2.
	RecentLow, BaselineHigh float64
	// LowerDifference = RecentLow − BaselineHigh: with probability at least 1 − AlphaPerEpoch,
	// through the whole epoch, the increase of the rate is at least this.
	LowerDifference float64
	// AlphaPerEpoch is the rule's alpha divided by the epochs in its horizon.
	AlphaPerEpoch float64
	// Fires is LowerDifference > 0 and ≥ the rule's minimum increase.
	Fires bool
}

// ChangeTest tests whether the rate of recent exceeds that of baseline by at least minIncrease,
// looked at any number of times within an epoch, with a false-alarm probability of at most alpha
// per horizon when the two rates are equal (docs/semantics.md#alerting):
//
//   - Within an epoch (the windows' bucket: an hour, or a minute for a 1h window) both windows
//     keep the same buckets, so each only gains observations: a confidence sequence for each rate
//     at level alpha_e/2 holds at every look of the epoch with probability 1 − alpha_e/2, and
//     when both hold and the rates are equal, RecentLow ≤ rate ≤ BaselineHigh: no alarm.
//   - Across epochs the windows move; alpha_e = alpha · epoch / horizon, so by the union bound
//     the expected number of epochs with a false alarm in a horizon is at most alpha.
func ChangeTest(recent, baseline Counts, alpha float64, epoch, horizon time.Duration, minIncrease float64) Change {
	ae := alpha * float64(epoch) / float64(horizon)
	ch := Change{Recent: recent, Baseline: baseline, AlphaPerEpoch: ae}
	ch.RecentLow, _ = ConfidenceSequence(recent, ae/2)
	_, ch.BaselineHigh = ConfidenceSequence(baseline, ae/2)
	ch.LowerDifference = ch.RecentLow - ch.BaselineHigh
	ch.Fires = recent.valid() && baseline.valid() && ch.LowerDifference > 0 && ch.LowerDifference >= minIncrease
	return ch
}

// FisherGreater is the one-sided p-value of Fisher's exact test that the rate of a exceeds that
// of b: the hypergeometric probability of at least a.Confirmed successes in a's trials, given the
// margins. The tail is summed from its largest term with the ratio of consecutive terms and stops
// once the terms no longer change the sum, so it costs a few standard deviations of steps, not
// one per success; past fisherMaxSteps (a spread of more than about 10⁵, windows of billions) it
// is the normal approximation. Impossible counts (negative, more confirmed than scored) give 1.
func FisherGreater(a, b Counts) float64 {
	if !a.valid() || !b.valid() || a.Scored == 0 || b.Scored == 0 {
		return 1
	}
	n1, n2 := float64(a.Scored), float64(b.Scored)
	k := float64(a.Confirmed + b.Confirmed)
	n := n1 + n2
	lo, hi := math.Max(0, k-n2), math.Min(k, n1) // support of x
	x := float64(a.Confirmed)
	if x <= lo {
		return 1
	}
	if x > hi {
		return 0
	}
	mean := k * n1 / n
	sd := math.Sqrt(mean * (n2 / n) * (n - k) / math.Max(1, n-1))
	lch := func(n, r float64) float64 {
		x, _ := math.Lgamma(n + 1)
		y, _ := math.Lgamma(r + 1)
		z, _ := math.Lgamma(n - r + 1)
		return x - y - z
	}
	logTerm := func(x float64) float64 { return lch(n1, x) + lch(n2, k-x) - lch(n, k) }
	// up(x) is term(x+1)/term(x); the terms rise to the mode and fall after it.
	up := func(x float64) float64 { return (n1 - x) * (k - x) / ((x + 1) * (n2 - k + x + 1)) }
	upper := x > mean
	if !upper {
		x-- // sum the lower tail P(X ≤ x−1), downward from x−1, and return its complement
	}
	sum, term := 0.0, math.Exp(logTerm(x))
	for step := 0; ; step++ {
		if step == fisherMaxSteps {
			// Normal approximation with a continuity correction.
			z := (float64(a.Confirmed) - 0.5 - mean) / sd
			return 0.5 * math.Erfc(z/math.Sqrt2)
		}
		sum += term
		if upper {
			if x >= hi {
				break
			}
			term *= up(x)
			x++
		} else {
			if x <= lo {
				break
			}
			term /= up(x - 1)
			x--
		}
		if term <= sum*1e-17 {
			break
		}
	}
	if upper {
		return math.Min(1, sum)
	}
	return math.Max(0, 1-sum)
}

// fisherMaxSteps bounds FisherGreater's exact summation.
const fisherMaxSteps = 4_000_000

// NaiveZ is the pooled two-proportion z statistic of a over b: the fixed-sample test that
// monitoring tools re-run at every evaluation. It is here to be compared with ChangeTest, never to
// decide.
func NaiveZ(a, b Counts) float64 {
	if a.Scored == 0 || b.Scored == 0 {
		return 0
	}
	p := float64(a.Confirmed+b.Confirmed) / float64(a.Scored+b.Scored)
	se := math.Sqrt(p * (1 - p) * (1/float64(a.Scored) + 1/float64(b.Scored)))
	if se == 0 {
		return 0
	}
	return (a.Rate() - b.Rate()) / se
}

// NormalQuantile is the standard normal quantile of q in (0, 1).
func NormalQuantile(q float64) float64 {
	lo, hi := -40.0, 40.0
	for range 100 {
		mid := (lo + hi) / 2
		if 0.5*math.Erfc(-mid/math.Sqrt2) < q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}
