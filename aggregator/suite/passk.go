package suite

import "math"

// PassAtK is the unbiased pass@k estimate 1 − C(n−c, k)/C(n, k) for c passes in n scored runs,
// in the product form 1 − Π_{i=n−c+1}^{n} (1 − k/i), which never forms a large binomial.
// It requires 0 < k ≤ n.
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

// GPassAtK is G-Pass@k at threshold tau: the probability that at least ⌈tau·k⌉ of k runs drawn
// without replacement from n (c passing) pass — a hypergeometric tail. tau = 0 means at least one,
// so G-Pass@k at 0 equals pass@k. It requires 0 < k ≤ n.
func GPassAtK(n, c, k int, tau float64) float64 {
	lo := max(1, int(math.Ceil(tau*float64(k)-1e-9)))
	total := logChoose(n, k)
	sum := 0.0
	for j := lo; j <= min(c, k); j++ {
		sum += math.Exp(logChoose(c, j) + logChoose(n-c, k-j) - total)
	}
	return math.Min(1, sum)
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
