package alert

import (
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// simStream is one generated stream: scored opportunities per look step, in hour buckets, with
// a rate that may step at stepHour.
type simConfig struct {
	streams      int
	days         int     // days evaluated, after 7 days of history
	perHour      int     // scored opportunities per hour
	looksPerHour int     // evaluations per hour
	rate, after  float64 // rate before and after stepHour (equal for the null)
	stepHour     int     // hour of the step, counted from the first evaluated hour
	alpha        float64
	minScored    int64
}

// simResult counts, per stream, whether and when each test first alarmed (hours after the
// step, -1 for never).
type simResult struct {
	changeFirst, naiveFirst []float64
}

// simulate generates cfg.streams streams of Bernoulli outcomes in hour buckets and evaluates the
// change rule (24h against the 6 days before) and the naive one-sided z-test at every look, as
// an evaluator does: the current hour's bucket fills up between looks, the windows move at every
// hour.
func simulate(cfg simConfig, seed uint64) simResult {
	rng := rand.New(rand.NewPCG(seed, 42))
	const history = 7 * 24
	hours := history + cfg.days*24
	zCrit := NormalQuantile(1 - cfg.alpha)
	horizon := 30 * 24 * time.Hour
	var res simResult
	per := cfg.perHour / cfg.looksPerHour
	for range cfg.streams {
		conf := make([]int64, hours) // confirmed per hour
		scored := make([]int64, hours)
		changeAt, naiveAt := -1.0, -1.0
		for h := range hours {
			p := cfg.rate
			if h >= history+cfg.stepHour {
				p = cfg.after
			}
			for l := range cfg.looksPerHour {
				for range per {
					scored[h]++
					if rng.Float64() < p {
						conf[h]++
					}
				}
				if h < history || (changeAt >= 0 && naiveAt >= 0) {
					continue
				}
				var recent, week Counts
				for i := h - 167; i <= h; i++ {
					week.Confirmed += conf[i]
					week.Scored += scored[i]
					if i > h-24 {
						recent.Confirmed += conf[i]
						recent.Scored += scored[i]
					}
				}
				base := Counts{Confirmed: week.Confirmed - recent.Confirmed, Scored: week.Scored - recent.Scored}
				if recent.Scored < cfg.minScored || base.Scored < cfg.minScored {
					continue
				}
				at := float64(h-history-cfg.stepHour) + float64(l+1)/float64(cfg.looksPerHour)
				if naiveAt < 0 && NaiveZ(recent, base) >= zCrit {
					naiveAt = at
				}
				// The confidence bounds cannot cross when the recent estimate is not above the
				// baseline's: skip the bisections.
				if changeAt < 0 && recent.Rate() > base.Rate() && ChangeTest(recent, base, cfg.alpha, time.Hour, horizon, 0).Fires {
					changeAt = at
				}
			}
		}
		res.changeFirst = append(res.changeFirst, changeAt)
		res.naiveFirst = append(res.naiveFirst, naiveAt)
	}
	return res
}

func share(first []float64) float64 {
	n := 0
	for _, f := range first {
		if f >= 0 {
			n++
		}
	}
	return float64(n) / float64(len(first))
}

func median(first []float64) float64 {
	s := slices.Clone(first)
	slices.Sort(s)
	return s[len(s)/2]
}

func simStreams(def int) int {
	if v, err := strconv.Atoi(os.Getenv("REPEATRATE_SIM_STREAMS")); err == nil && v > 0 {
		return v
	}
	return def
}

// TestChangeFalseAlarmsUnderRepeatedLooks runs the change rule at the null — the same true rate
// throughout — evaluated every 10 minutes for 30 days, and requires the share of streams with any
// alarm to stay at or below alpha, while the naive z-test re-run at every look exceeds it.
// REPEATRATE_SIM_STREAMS=1000 runs the full count.
func TestChangeFalseAlarmsUnderRepeatedLooks(t *testing.T) {
	cfg := simConfig{streams: simStreams(100), days: 30, perHour: 42, looksPerHour: 6, rate: 0.02, after: 0.02,
		stepHour: 0, alpha: 0.05, minScored: 20}
	res := simulate(cfg, 1)
	change, naive := share(res.changeFirst), share(res.naiveFirst)
	t.Logf("null, %d streams × 30 days × %d looks/h, %d scored/h at 2%%: change rule alarmed in %.3f of streams, naive z-test in %.3f (alpha %.2f)",
		cfg.streams, cfg.looksPerHour, cfg.perHour, change, naive, cfg.alpha)
	if change > cfg.alpha {
		t.Errorf("change rule false-alarm share %.3f exceeds alpha %.2f", change, cfg.alpha)
	}
	if naive <= cfg.alpha {
		t.Errorf("naive re-testing false-alarm share %.3f does not exceed alpha %.2f: the comparison shows nothing", naive, cfg.alpha)
	}
}

// TestChangeDetectsStep measures the delay from a step of the rate from 2 % to 15 % to the first
// alarm, and requires every stream to alarm within two days.
func TestChangeDetectsStep(t *testing.T) {
	cfg := simConfig{streams: simStreams(100) / 2, days: 2, perHour: 42, looksPerHour: 6, rate: 0.02, after: 0.15,
		stepHour: 0, alpha: 0.05, minScored: 20}
	res := simulate(cfg, 2)
	if s := share(res.changeFirst); s < 1 {
		t.Fatalf("only %.2f of streams alarmed within 2 days of the step", s)
	}
	t.Logf("step 2%% → 15%% at %d scored/h: median delay %.1f h (change rule), %.1f h (naive z-test)",
		cfg.perHour, median(res.changeFirst), median(res.naiveFirst))
}
