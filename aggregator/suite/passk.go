package suite

import "math"

// PassAtK is the unbiased pass@k estimate 1 − C(n−c, k)/C(n, k) for c passes in n runs, in the
// product form 1 − Π_{i=n−c+1}^{n} (1 − k/i), which never forms a large binomial. It is 1 when
// n − c < k, which includes every k above n: that is OpenCompass's compute_pass_at_k for any
// k ≥ 1 (the default mode asks only k ≤ n of it; the opencompass mode asks any k).
func PassAtK(n, c, k int) float64 {
	if n-c < k {
		return 1
	}
	p := 1.0
	for i := n - c + 1; i <= n; i++ {
		p *= 1 - float64(k)/float64(i)
	}
	return 1 - p
}

// logChoose is log C(n, r) through log-gamma, exact enough for the tail sums below.
func logChoose(n, r int) float64 {
	if r < 0 || r > n {
		return math.Inf(-1)
	}
	a, _ := math.Lgamma(float64(n + 1))
	b, _ := math.Lgamma(float64(r + 1))
	c, _ := math.Lgamma(float64(n - r + 1))
	return a - b - c
}

// hypergeomTail is the probability that at least m of k runs drawn without replacement from n
// runs, c of them passing, pass (m ≥ 1, k ≤ n).
func hypergeomTail(n, c, k, m int) float64 {
	total := logChoose(n, k)
	sum := 0.0
	for j := m; j <= min(c, k); j++ {
		sum += math.Exp(logChoose(c, j) + logChoose(n-c, k-j) - total)
	}
	return math.Min(1, sum)
}

// GPassAtK is G-Pass@k at threshold tau: the probability that at least ⌈tau·k⌉ of k runs drawn
// without replacement from n (c passing) pass — a hypergeometric tail. tau = 0 means at least one,
// so G-Pass@k at 0 equals pass@k. It requires 0 < k ≤ n.
func GPassAtK(n, c, k int, tau float64) float64 {
	return hypergeomTail(n, c, k, max(1, int(math.Ceil(tau*float64(k)-1e-9))))
}

// MGPassAtK is mG-Pass@k: 2/k · Σ_{i=⌈k/2⌉+1}^{k} G-Pass@k at i/k, the mean strict-consistency
// over thresholds above one half.
func MGPassAtK(n, c, k int) float64 {
	sum := 0.0
	for i := (k+1)/2 + 1; i <= k; i++ {
		sum += GPassAtK(n, c, k, float64(i)/float64(k))
	}
	return 2 * sum / float64(k)
}

// ocGPassAtLeast is OpenCompass's _compute_g_pass_at_k (opencompass/openicl/icl_evaluator/
// icl_base_evaluator.py): the probability that at least m of k runs drawn from n (c passing) pass,
// and 0 whenever k > n or m > min(c, k).
func ocGPassAtLeast(n, c, k, m int) float64 {
	if m > min(c, k) || k > n || c < 0 || n <= 0 || m < 0 {
		return 0
	}
	return hypergeomTail(n, c, k, max(m, 1))
}

// OCGPassAtK is G-Pass@k as OpenCompass's compute_g_pass_at_k computes it: at least
// max(⌈k·tau⌉, 1) passes, with the ceiling of the floating-point product as Python takes it (so
// k = 10, tau = 0.7 asks 8: 10 × 0.7 is 7.000000000000001), and 0 when k > n. For k ≤ n and the
// default thresholds (0, .25, .5, .75, 1, whose products are exact) it equals GPassAtK.
func OCGPassAtK(n, c, k int, tau float64) float64 {
	return ocGPassAtLeast(n, c, k, max(int(math.Ceil(float64(k)*tau)), 1))
}

// OCMGPassAtK is OpenCompass's compute_mg_pass_at_k: 2/k · Σ_{m=⌈k/2⌉+1}^{k} of the probability
// of at least m passes in k draws; 0 when k > n.
func OCMGPassAtK(n, c, k int) float64 {
	sum := 0.0
	for m := (k+1)/2 + 1; m <= k; m++ {
		sum += ocGPassAtLeast(n, c, k, m)
	}
	return 2 * sum / float64(k)
}
