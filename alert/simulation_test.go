package alert

import (
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// simConfig shapes generated streams: scored opportunities arriving evenly through each hour,
// evaluated looksPerHour times an hour, with a rate that may step at stepHour.
type simConfig struct {
	streams      int
	days         int     // days evaluated, after 7 days of history
	perHour      int     // scored opportunities per hour
	looksPerHour int     // evaluations per hour
	rate, after  float64 // rate before and after stepHour (equal for the null)
	stepHour     int     // hour of the step, counted from the first evaluated hour
	alpha        float64
	minIncrease  float64
	minScored    int64
}

// simResult holds, per stream, when each test first alarmed (hours after the step, -1 for never).
type simResult struct {
	changeFirst, naiveFirst []float64
}

// simulate generates cfg.streams streams of Bernoulli outcomes in hour buckets and evaluates the
// change rule (24h against the 6 days before, hour epochs, 30-day horizon) and the naive one-sided
// z-test at every look, as an evaluator does: the current hour's bucket fills up between looks,
// the windows move at every hour. A look that sees the same counts as the one before decides as
// it did, so only looks after an arrival or an hour change are computed.
func simulate(cfg simConfig, seed uint64) simResult {
	rng := rand.New(rand.NewPCG(seed, 42))
	const history = 7 * 24
	hours := history + cfg.days*24
	zCrit := NormalQuantile(1 - cfg.alpha)
	horizon := 30 * 24 * time.Hour
	var res simResult
	conf := make([]int64, hours) // confirmed per hour
	scored := make([]int64, hours)
	for range cfg.streams {
		clear(conf)
		clear(scored)
		var recent, week Counts // running sums of the last 24 and 168 hours
		changeAt, naiveAt := -1.0, -1.0
		for h := range hours {
			if h >= 24 {
				recent.Confirmed -= conf[h-24]
				recent.Scored -= scored[h-24]
			}
			if h >= 168 {
				week.Confirmed -= conf[h-168]
				week.Scored -= scored[h-168]
			}
			p := cfg.rate
			if h >= history+cfg.stepHour {
				p = cfg.after
			}
			arrived := 0
			changed := true // the windows moved
			for l := range cfg.looksPerHour {
				// Opportunity i of the hour arrives in look i·looks/perHour.
				for ; arrived < cfg.perHour && arrived*cfg.looksPerHour/cfg.perHour <= l; arrived++ {
					c := int64(0)
					if rng.Float64() < p {
						c = 1
					}
					conf[h] += c
					scored[h]++
					recent.Confirmed += c
					recent.Scored++
					week.Confirmed += c
					week.Scored++
					changed = true
				}
				if h < history || !changed || (changeAt >= 0 && naiveAt >= 0) {
					continue
				}
				changed = false
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
				if changeAt < 0 && recent.Rate() > base.Rate() && ChangeTest(recent, base, cfg.alpha, time.Hour, horizon, cfg.minIncrease).Fires {
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
// throughout — evaluated every 10 minutes for 30 days (BenchmarkChangeSimulation looks every minute), and requires the share of streams with any
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

// simulateParallel runs simulate over workers goroutines, each on its share of the streams and
// its own seed.
func simulateParallel(cfg simConfig, seed uint64, workers int) simResult {
	var out simResult
	for _, p := range splitStreams(cfg.streams, seed, workers, func(n int, seed uint64) simResult {
		c := cfg
		c.streams = n
		return simulate(c, seed)
	}) {
		out.changeFirst = append(out.changeFirst, p.changeFirst...)
		out.naiveFirst = append(out.naiveFirst, p.naiveFirst...)
	}
	return out
}

// splitStreams runs run over workers goroutines, each on its share of n streams and its own
// seed, and returns their results in worker order.
func splitStreams[R any](n int, seed uint64, workers int, run func(streams int, seed uint64) R) []R {
	parts := make([]R, workers)
	var wg sync.WaitGroup
	for w := range workers {
		share := n / workers
		if w < n%workers {
			share++
		}
		wg.Go(func() { parts[w] = run(share, seed*1000+uint64(w)) })
	}
	wg.Wait()
	return parts
}

// quantile is the q-quantile of the alarm delays, counting a stream that never alarmed as +∞
// (reported as -1 when the quantile falls on one).
func quantile(first []float64, q float64) float64 {
	s := slices.Clone(first)
	for i, f := range s {
		if f < 0 {
			s[i] = 1e18
		}
	}
	slices.Sort(s)
	v := s[min(len(s)-1, int(q*float64(len(s))))]
	if v == 1e18 {
		return -1
	}
	return v
}

// BenchmarkChangeSimulation is the alerting figures of BENCHMARKS.md ("Alerting"): the change rule
// as deploy/alert-rules.example.yaml has it (24h against the 6 days before, alpha 0.05 over 30
// days, min_scored 20) evaluated every minute, against the naive one-sided z-test at α = 0.05
// re-run at each look on the same streams.
//
//   - null: REPEATRATE_SIM_STREAMS (default 1 000) streams at a constant 2 % for 30 days after 7
//     days of history, min_increase 0 (the most permissive): the share of streams with any alarm;
//   - detection: 200 streams per volume whose rate steps from 2 % to 15 % after 7 days, with the
//     example's min_increase 0.05: the median and 90th percentile of the delay to the first alarm.
//
// Run it once: go test -run '^$' -bench ChangeSimulation -benchtime 1x ./alert
func BenchmarkChangeSimulation(b *testing.B) {
	workers := runtime.GOMAXPROCS(0)
	for range b.N {
		null := simConfig{streams: simStreams(1000), days: 30, perHour: 42, looksPerHour: 60, rate: 0.02, after: 0.02,
			alpha: 0.05, minScored: 20}
		res := simulateParallel(null, 1, workers)
		b.ReportMetric(share(res.changeFirst), "change_false_alarm_share")
		b.ReportMetric(share(res.naiveFirst), "naive_false_alarm_share")
		b.Logf("null: %d streams at 2 %%, %d scored/h, evaluated every minute for 30 days: change rule alarmed on %d (%.3f), naive z-test on %d (%.3f); alpha 0.05",
			null.streams, null.perHour, int(share(res.changeFirst)*float64(null.streams)+0.5), share(res.changeFirst),
			int(share(res.naiveFirst)*float64(null.streams)+0.5), share(res.naiveFirst))
		for _, perHour := range []int{10, 42, 420} {
			step := simConfig{streams: 200, days: 4, perHour: perHour, looksPerHour: 60, rate: 0.02, after: 0.15,
				alpha: 0.05, minIncrease: 0.05, minScored: 20}
			res := simulateParallel(step, 2, workers)
			b.ReportMetric(quantile(res.changeFirst, 0.5), fmt.Sprintf("change_median_delay_h_%d/h", perHour))
			b.Logf("step 2 %% → 15 %% at %d scored/h (%d a day): change rule detected %.2f of streams within 4 days, delay median %.1f h, p90 %.1f h; naive z-test median %.1f h",
				perHour, perHour*24, share(res.changeFirst), quantile(res.changeFirst, 0.5), quantile(res.changeFirst, 0.9), quantile(res.naiveFirst, 0.5))
		}
	}
}
