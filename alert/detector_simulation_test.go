package alert

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// detectorSim shapes the streams of the detector's simulation: scored outcomes occurring evenly
// through each hour, a rate that steps from rate to after within the day after stepHour (counted
// from the first evaluated hour, after 7 days of history), snapshots at most once a minute.
type detectorSim struct {
	streams     int
	days        int // days evaluated after the history
	perHour     int // scored outcomes an hour, on average
	rate, after float64
	stepHour    int
	minIncrease float64
	// episodeHours, when above 0, ends the step: the rate is back to rate that many hours after it.
	episodeHours int
	// realistic traffic: 3× the volume by day (08–20 h) as by night, 10 % of outcomes arriving
	// 1–6 h after they occurred, 5 % re-assessed 10 minutes to 2 hours after they arrived.
	realistic bool
}

// detectorSimResult holds, per stream, the hours from the step to the first alarm (−1: none)
// of the detector and of the reference.
type detectorSimResult struct {
	detector, reference []float64
	// alarms counts the detector's rising edges (statistic from below to at least its threshold)
	// per stream; resolved is the hours from the end of the episode to the statistic's last fall
	// under the threshold (−1: still above at the end).
	alarms   []int
	resolved []float64
}

// simEvent is an outcome arriving (from < 0) or re-assessed (from → to) in a minute.
type simEvent struct {
	hour     int32
	from, to int8
}

// detectorSimHorizon is the rules' horizon: alpha 0.05 per 30 days.
const detectorSimHorizon = 30 * 24 * time.Hour

// simulateDetector runs each stream through the production detector as the evaluator would:
// per minute with any event, a snapshot of the 24h and 7d windows (hour buckets by occurrence
// time, so late outcomes land in the hours they occurred in) is stepped into the detector of a
// change rule with method sequential (24h against 7d, alpha 0.05 over 30 days, min_scored 20),
// and its statistic compared with its threshold. Beside it runs the reference: the mixture CUSUM
// over every outcome in arrival order (restarted at each outcome, the same grid and the same
// baseline bound, threshold log(looks in horizon ÷ alpha) for a look every minute), which sees
// each outcome once as first assessed.
func simulateDetector(cfg detectorSim, seed uint64) detectorSimResult {
	rng := rand.New(rand.NewPCG(seed, 7))
	const history = 7 * 24
	hours := history + cfg.days*24
	minutes := hours * 60
	r := &Rule{Kind: KindChange, Sequential: true, Source: SourceLive, Window: Window24h, Baseline: Window7d,
		Alpha: 0.05, Subjects: 1, MinScored: 20, Horizon: detectorSimHorizon, MinIncrease: cfg.minIncrease}
	dp := newDetectorParams(r)
	hRef := math.Log(detectorSimHorizon.Minutes() / r.Alpha)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	events := make([][]simEvent, minutes)
	conf := make([]int64, hours)
	scored := make([]int64, hours)
	var res detectorSimResult
	bern := func(p float64) int8 {
		if rng.Float64() < p {
			return 1
		}
		return 0
	}
	for range cfg.streams {
		// The step falls at a time of day drawn for each stream, so that day and night volumes
		// weigh on the delays as they come.
		stepMin := (history+cfg.stepHour)*60 + rng.IntN(24*60)
		for i := range events {
			events[i] = events[i][:0]
		}
		clear(conf)
		clear(scored)
		for hr := range hours {
			n := cfg.perHour
			if cfg.realistic {
				if hod := hr % 24; hod >= 8 && hod < 20 {
					n = cfg.perHour * 3 / 2
				} else {
					n = cfg.perHour / 2
				}
			}
			for i := range n {
				occ := hr*60 + i*60/n
				p := cfg.rate
				if occ >= stepMin && (cfg.episodeHours == 0 || occ < stepMin+cfg.episodeHours*60) {
					p = cfg.after
				}
				c := bern(p)
				arr := occ
				if cfg.realistic && rng.Float64() < 0.1 {
					arr += 60 + rng.IntN(301)
				}
				if arr < minutes {
					events[arr] = append(events[arr], simEvent{hour: int32(hr), from: -1, to: c})
				}
				if cfg.realistic && rng.Float64() < 0.05 {
					at := arr + 10 + rng.IntN(111)
					if nc := bern(p); at < minutes && nc != c {
						events[at] = append(events[at], simEvent{hour: int32(hr), from: c, to: nc})
					}
				}
			}
		}
		var day, week Counts
		var d Detector
		var ref [detectorK]float64
		detAt, refAt := -1.0, -1.0
		detSeen, refSeen := false, false
		alarms, on, resolved := 0, false, -1.0
		var version int64
		var in detectorInput
		lastBase := Counts{Confirmed: -1}
		var st detectorStep
		stP0, stOK := -1.0, false
		for m := range minutes {
			H := m / 60
			if m%60 == 0 {
				if H >= 24 {
					day.Confirmed -= conf[H-24]
					day.Scored -= scored[H-24]
				}
				if H >= 168 {
					week.Confirmed -= conf[H-168]
					week.Scored -= scored[H-168]
				}
			}
			evs := events[m]
			if len(evs) == 0 {
				continue
			}
			for _, e := range evs {
				dc, ds := int64(e.to), int64(1)
				if e.from >= 0 {
					dc, ds = int64(e.to-e.from), 0
				}
				conf[e.hour] += dc
				scored[e.hour] += ds
				if int(e.hour) >= H-23 {
					day.Confirmed += dc
					day.Scored += ds
				}
				if int(e.hour) >= H-167 {
					week.Confirmed += dc
					week.Scored += ds
				}
			}
			if m < history*60 || (detSeen && refSeen && cfg.episodeHours == 0) {
				continue
			}
			version++
			if base := (Counts{Confirmed: week.Confirmed - day.Confirmed, Scored: week.Scored - day.Scored}); base != lastBase {
				snap := schemas.Snapshot{Aggregate: schemas.Aggregate{Source: SourceLive}, Windows: schemas.Windows{
					Day:  schemas.Window{ConfirmedRepeats: day.Confirmed, Scored: day.Scored},
					Week: schemas.Window{ConfirmedRepeats: week.Confirmed, Scored: week.Scored}}}
				in, lastBase = detectorInputOf(r, &snap), base
			}
			in.version, in.observed = version, t0.Add(time.Duration(m)*time.Minute)
			in.confirmed, in.scored = week.Confirmed, week.Scored
			at := float64(m+1-stepMin) / 60
			d.step(in, dp)
			if now := d.Alarm; now != on {
				on = now
				if on {
					alarms++
					resolved = -1
				} else if cfg.episodeHours > 0 {
					resolved = at - float64(cfg.episodeHours)
				}
			}
			if !detSeen && on {
				detAt, detSeen = at, true
			}
			if refSeen || !in.hasP0 {
				continue
			}
			if in.p0 != stP0 {
				st, stOK = newDetectorStep(in.p0, r.MinIncrease)
				stP0 = in.p0
			}
			if !stOK {
				continue
			}
			for _, e := range evs {
				if e.from >= 0 {
					continue
				}
				for k := range ref {
					if e.to == 1 {
						ref[k] = math.Max(ref[k], 0) + st.repeat[k]
					} else {
						ref[k] = math.Max(ref[k], 0) + st.pass[k]
					}
				}
				if copyStatistic(&ref) >= hRef {
					refAt, refSeen = at, true
					break
				}
			}
		}
		if cfg.after == cfg.rate || cfg.stepHour >= cfg.days*24 {
			// The null: any alarm counts, from the first evaluated minute.
			detAt, refAt = alarmed(detSeen), alarmed(refSeen)
		}
		res.detector = append(res.detector, detAt)
		res.reference = append(res.reference, refAt)
		res.alarms = append(res.alarms, alarms)
		res.resolved = append(res.resolved, resolved)
	}
	return res
}

// alarmed is a null stream's result: 1 if it alarmed at all (its times are before no step), −1
// if not.
func alarmed(seen bool) float64 {
	if seen {
		return 1
	}
	return -1
}

// simulateDetectorParallel runs simulateDetector over GOMAXPROCS goroutines.
func simulateDetectorParallel(cfg detectorSim, seed uint64) detectorSimResult {
	var out detectorSimResult
	for _, p := range splitStreams(cfg.streams, seed, runtime.GOMAXPROCS(0), func(n int, seed uint64) detectorSimResult {
		c := cfg
		c.streams = n
		return simulateDetector(c, seed)
	}) {
		out.detector = append(out.detector, p.detector...)
		out.reference = append(out.reference, p.reference...)
		out.alarms = append(out.alarms, p.alarms...)
		out.resolved = append(out.resolved, p.resolved...)
	}
	return out
}

// TestDetectorFalseAlarms runs the detector at the null, 2 % throughout, 42 scored an hour
// looked at every minute for 30 days, clean and with realistic traffic, and requires the share of
// streams with any alarm to stay at or below alpha. REPEATRATE_SIM_STREAMS sets the streams
// (default 100; BenchmarkDetectorSimulation runs 2 000).
func TestDetectorFalseAlarms(t *testing.T) {
	for _, realistic := range []bool{false, true} {
		cfg := detectorSim{streams: simStreams(100), days: 30, perHour: 42, rate: 0.02, after: 0.02, stepHour: 30 * 24, realistic: realistic}
		res := simulateDetectorParallel(cfg, 11)
		t.Logf("null (realistic %v), %d streams: detector alarmed on %.3f, reference on %.3f (alpha 0.05)", realistic, cfg.streams, share(res.detector), share(res.reference))
		if s := share(res.detector); s > 0.05 {
			t.Errorf("realistic %v: false-alarm share %.3f exceeds alpha 0.05", realistic, s)
		}
	}
}

// TestDetectorDetectsStep requires the detector to see a step from 2 % to 15 % at 42 scored an
// hour in every stream within two days, and no later than 1.5 times the reference's median.
func TestDetectorDetectsStep(t *testing.T) {
	cfg := detectorSim{streams: simStreams(100) / 2, days: 3, perHour: 42, rate: 0.02, after: 0.15, stepHour: 24}
	res := simulateDetectorParallel(cfg, 12)
	if s := share(res.detector); s < 1 {
		t.Fatalf("only %.2f of streams alarmed within 2 days of the step", s)
	}
	det, ref := quantile(res.detector, 0.5), quantile(res.reference, 0.5)
	t.Logf("step 2%% → 15%% at 42 scored/h: median delay %.2f h (detector), %.2f h (reference)", det, ref)
	if det > 1.5*ref {
		t.Errorf("median delay %.2f h is more than 1.5 × the reference's %.2f h", det, ref)
	}
}

// An episode is one alarm: a step from 2 % to 15 % at 42 scored an hour that lasts 12 hours
// sets the detector's alarm in every stream, ends it and sets it again within one episode in at
// most 2 % of streams (about 0.5 % measured: a first alarm raised by a lucky run of repeats,
// followed by a longer run of passes), and ends it within 6 hours (median) of the rate's return.
func TestDetectorEpisodeAlarmsOnceAndEnds(t *testing.T) {
	cfg := detectorSim{streams: simStreams(100), days: 3, perHour: 42, rate: 0.02, after: 0.15, stepHour: 24, episodeHours: 12}
	res := simulateDetectorParallel(cfg, 13)
	split := 0
	for i, n := range res.alarms {
		if n == 0 {
			t.Errorf("stream %d: no alarm in a 12-hour episode", i)
		}
		if n > 1 {
			split++
		}
	}
	if float64(split) > 0.02*float64(cfg.streams) {
		t.Errorf("%d of %d episodes raised more than one alarm, want at most 2 %%", split, cfg.streams)
	}
	if s := share(res.resolved); s < 1 {
		t.Fatalf("the statistic fell under the threshold after the episode in only %.2f of streams", s)
	}
	if m := quantile(res.resolved, 0.5); m > 6 {
		t.Errorf("median %.2f h from the end of the episode to the statistic under its threshold, want at most 6", m)
	}
	t.Logf("12-hour episode 2%% → 15%% at 42/h: alarms per stream %v…, ended after median %.2f h, p90 %.2f h", res.alarms[:5],
		quantile(res.resolved, 0.5), quantile(res.resolved, 0.9))
}

// BenchmarkDetectorSimulation is the sequential detector's table in BENCHMARKS.md (Alerting): per
// scenario, the detector against the reference mixture CUSUM on the same streams.
//
// Run it once: go test -run '^$' -bench DetectorSimulation -benchtime 1x -timeout 60m ./alert
func BenchmarkDetectorSimulation(b *testing.B) {
	type row struct {
		name string
		cfg  detectorSim
	}
	steps := []row{
		{"2 % → 15 %, 10/h", detectorSim{perHour: 10, rate: 0.02, after: 0.15}},
		{"2 % → 15 %, 42/h", detectorSim{perHour: 42, rate: 0.02, after: 0.15}},
		{"2 % → 15 %, 420/h", detectorSim{perHour: 420, rate: 0.02, after: 0.15}},
		{"2 % → 5 %, 420/h", detectorSim{perHour: 420, rate: 0.02, after: 0.05}},
		{"10 % → 20 %, 42/h", detectorSim{perHour: 42, rate: 0.10, after: 0.20}},
		{"2 % → 15 %, 42/h, realistic", detectorSim{perHour: 42, rate: 0.02, after: 0.15, realistic: true}},
	}
	for range b.N {
		for _, realistic := range []bool{false, true} {
			cfg := detectorSim{streams: simStreams(2000), days: 30, perHour: 42, rate: 0.02, after: 0.02, stepHour: 30 * 24, realistic: realistic}
			res := simulateDetectorParallel(cfg, 1)
			b.Logf("| null 2 %%, 42/h, every minute, 30 days%s | %d streams | false alarms %d (%.4f; alpha 0.05) | reference %d (%.4f) |",
				map[bool]string{true: ", realistic"}[realistic], cfg.streams,
				int(share(res.detector)*float64(cfg.streams)+0.5), share(res.detector),
				int(share(res.reference)*float64(cfg.streams)+0.5), share(res.reference))
		}
		for i, s := range steps {
			cfg := s.cfg
			cfg.streams, cfg.days, cfg.stepHour = 200, 5, 24
			res := simulateDetectorParallel(cfg, uint64(2+i))
			det, ref := quantile(res.detector, 0.5), quantile(res.reference, 0.5)
			b.ReportMetric(det/ref, fmt.Sprintf("delay_ratio_%d", i))
			b.Logf("| %s | 200 streams | detected in 4 days %.3f, median %.2f h, p90 %.2f h | reference %.3f, median %.2f h | ratio %.2f |",
				s.name, within(res.detector, 96), det, quantile(res.detector, 0.9), within(res.reference, 96), ref, det/ref)
		}
		ep := detectorSim{streams: 1000, days: 3, perHour: 42, rate: 0.02, after: 0.15, stepHour: 24, episodeHours: 12}
		res := simulateDetectorParallel(ep, 20)
		split := 0
		for _, n := range res.alarms {
			if n > 1 {
				split++
			}
		}
		b.Logf("| 12-hour episode 2 %% → 15 %%, 42/h | 1000 streams | alarmed %.3f, more than one alarm %d | alarm ended after the episode: median %.2f h, p90 %.2f h |",
			share(res.detector), split, quantile(res.resolved, 0.5), quantile(res.resolved, 0.9))
	}
}

// within is the share of streams that alarmed within hours of the step.
func within(first []float64, hours float64) float64 {
	n := 0
	for _, f := range first {
		if f >= 0 && f <= hours {
			n++
		}
	}
	return float64(n) / float64(len(first))
}
