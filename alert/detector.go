package alert

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// The sequential change detector (a change rule with method: sequential) is a mixture CUSUM over
// the scored outcomes an aggregate's snapshots add, against the baseline's rate at its upper
// confidence bound (docs/semantics.md#detector):
//
//   - p0 is the upper end of the baseline's confidence sequence (the rule's baseline window less
//     its recent window) at level α_b per epoch, α_b = (α/2)·epoch/horizon: by the union bound
//     over the epochs of any horizon-long period, the probability that p0 is below the true rate
//     at any look of it is at most α/2.
//   - For each odds ratio r_k of detectorGrid, θ_k is the rate whose odds are r_k times p0's (at
//     least p0 + min_increase). Two copies c of the CUSUMs S_c,k of the log-likelihood ratio of
//     θ_k against p0 run side by side, each started afresh (all zero) once per horizon, the
//     second half a horizon after the first: S_c,k ← max(S_c,k, 0) at the first update of each
//     minute, then S_c,k += x·log(θ_k/p0) + (n−x)·log((1−θ_k)/(1−p0)) for x repeats among n new
//     scored outcomes.
//   - L_c = log(Σ_k e^{S_c,k}/K); the alarm is set once max_c L_c reaches h = log(8·B/α), B the
//     minutes in the horizon, and cleared once it falls under h − detectorHysteresis.
//
// When p0 is at least the true rate, each e^{S_c,k} is at most the largest of the likelihood-ratio
// supermartingales started at the minutes' first updates since the copy's last fresh start, so
// Σ_k e^{S_c,k}/K is at most the Shiryaev–Roberts sum of the mixture supermartingales started
// there, which grows by at most one per start in expectation. Within any horizon-long period, a
// copy's statistic rests on starts within the horizon before it and the period itself: at most
// 2B, so by optional stopping it reaches 8B/α there with probability at most α/4, and either
// copy with at most α/2. Both parts together: at most α per subject in any horizon-long period,
// however often the detector is looked at. The second copy keeps an alarm through the first's
// fresh start, and the other way round.

// detectorGrid are the post-change odds ratios the detector mixes over, with equal weights.
var detectorGrid = [...]float64{1.2, 1.8, 2.7, 4, 6, 9, 13.5, 20, 30, 45}

const detectorK = len(detectorGrid)

// detectorHeadroom caps each copy's statistic at h + detectorHeadroom (nats) by lowering its S_k
// by the same amount: a long episode leaves no statistic that takes days to come down once the
// rate is back, while the alternatives keep their order (those far from the episode's rate, which
// would fall slowly, stay far below). Lowering the CUSUMs never raises a later statistic, so the
// guarantee is kept.
const detectorHeadroom = 4.0

// detectorHysteresis is how far under h the statistic must fall to end an alarm: right after it
// first reaches h the statistic hovers there, and each pass would end the alarm and each repeat
// raise it again. From the cap, a run of about 80–100 passes at 15 % against 2 % ends it.
const detectorHysteresis = 8.0

// DetectorMethod names the sequential test in an alert's evidence.
const DetectorMethod = "mixture CUSUM against the baseline's upper confidence bound"

// Detector is one subject's detector state: what it has consumed of the snapshots and its
// CUSUMs. It is O(1) per subject; the evaluators share it in Redis (Redis.SwapDetectors).
type Detector struct {
	// Source is the source and baseline window of the snapshots it consumed ("live/7d"): the
	// counts of another are no increment of these.
	Source string
	// Version and Observed are the consumed snapshot's version and observation time (Unix
	// seconds); Confirmed and Scored its baseline window's counts. Counts are differenced only
	// within one hour of observation, while the window keeps its buckets.
	Version, Observed int64
	Confirmed, Scored int64
	// Minute is the last minute (Unix minutes) that started a new CUSUM run.
	Minute int64
	// Judged counts the scored outcomes judged; P0 is the baseline bound they were last judged
	// against.
	Judged int64
	P0     float64
	// Alarm is set when the statistic reaches the threshold h and cleared when it falls under
	// h − detectorHysteresis.
	Alarm bool
	// S are the two copies' CUSUMs, in nats, one per grid point.
	S [2][detectorK]float64
}

// detectorParams are what a rule fixes of its detectors' steps.
type detectorParams struct {
	minIncrease float64
	// h is the threshold, log(8·period/α).
	h float64
	// period is the horizon in minutes: each copy starts afresh once per period.
	period int64
	// quiet is the recent window: a snapshot observed that long after the last one consumed (the
	// alert resolved meanwhile, its window left) starts the detector afresh.
	quiet time.Duration
}

// newDetectorParams returns the parameters of rule r's detectors.
func newDetectorParams(r *Rule) detectorParams {
	return detectorParams{minIncrease: r.MinIncrease, h: detectorThreshold(r.alphaPerSubject(), r.Horizon),
		period: detectorPeriod(r.Horizon), quiet: windowLength(r.Window)}
}

// detectorPeriod is B, the whole minutes in the horizon (at least one).
func detectorPeriod(horizon time.Duration) int64 { return max(1, int64(math.Ceil(horizon.Minutes()))) }

// detectorThreshold is h = log(8·B/alpha) for a subject's alpha over horizon (B its minutes).
func detectorThreshold(alpha float64, horizon time.Duration) float64 {
	return math.Log(8 * float64(detectorPeriod(horizon)) / alpha)
}

// detectorBaselineAlpha is the level of p0's confidence sequence per epoch of the baseline (the
// recent window's bucket: an hour, or a minute for a 1h window).
func detectorBaselineAlpha(alpha float64, epoch, horizon time.Duration) float64 {
	return alpha / 2 * float64(epoch) / float64(horizon)
}

// Statistic is max_c L_c, L_c = log(Σ_k e^{S_c,k}/K).
func (d *Detector) Statistic() float64 {
	return math.Max(copyStatistic(&d.S[0]), copyStatistic(&d.S[1]))
}

func copyStatistic(s *[detectorK]float64) float64 {
	m := math.Inf(-1)
	for _, v := range s {
		m = math.Max(m, v)
	}
	sum := 0.0
	for _, v := range s {
		sum += math.Exp(v - m)
	}
	return m + math.Log(sum/float64(detectorK))
}

// detectorStep is the log-likelihood ratios of one repeat and of one pass for each grid point
// against p0: computed once per p0, used for every increment judged against it.
type detectorStep struct {
	p0     float64
	repeat [detectorK]float64
	pass   [detectorK]float64
}

// newDetectorStep returns the ratios against p0 in (0, 1) with alternatives at least
// minIncrease above it; ok is false when no alternative below 1 remains.
func newDetectorStep(p0, minIncrease float64) (st detectorStep, ok bool) {
	if !(p0 > 0 && p0 < 1) {
		return st, false
	}
	st.p0 = p0
	odds := p0 / (1 - p0)
	for k, r := range detectorGrid {
		o := odds * r
		theta := math.Max(o/(1+o), p0+minIncrease)
		if theta >= 1 {
			return st, false
		}
		st.repeat[k] = math.Log(theta / p0)
		st.pass[k] = math.Log1p(-theta) - math.Log1p(-p0)
	}
	return st, true
}

// advance consumes x repeats among n new scored outcomes seen in minute. A copy whose period
// changed since the last update starts afresh; the first update of a minute starts a new run
// (S ← max(S, 0)); each copy's statistic is held at most h + detectorHeadroom by lowering its
// CUSUMs alike; the alarm is set or cleared against h.
func (d *Detector) advance(st *detectorStep, x, n, minute int64, p detectorParams) {
	for c := range d.S {
		if detectorEra(d.Minute, c, p.period) != detectorEra(minute, c, p.period) {
			d.S[c] = [detectorK]float64{}
		}
	}
	if minute > d.Minute {
		for c := range d.S {
			for k := range d.S[c] {
				d.S[c][k] = math.Max(d.S[c][k], 0)
			}
		}
		d.Minute = minute
	}
	xf, pf := float64(x), float64(n-x)
	for c := range d.S {
		for k := range d.S[c] {
			d.S[c][k] += xf*st.repeat[k] + pf*st.pass[k]
		}
		if over := copyStatistic(&d.S[c]) - (p.h + detectorHeadroom); over > 0 {
			for k := range d.S[c] {
				d.S[c][k] -= over
			}
		}
	}
	switch stat := d.Statistic(); {
	case stat >= p.h:
		d.Alarm = true
	case stat < p.h-detectorHysteresis:
		d.Alarm = false
	}
}

// detectorEra is which period of copy c minute falls in: copy 1's periods start half a period
// after copy 0's.
func detectorEra(minute int64, c int, period int64) int64 {
	return floorDiv(minute+int64(c)*(period/2), period)
}

// detectorInput is what one snapshot gives the detector.
type detectorInput struct {
	source            string // the snapshot's source and the rule's baseline window
	version           int64
	observed          time.Time
	confirmed, scored int64 // the baseline window's counts
	p0                float64
	hasP0             bool
}

// step moves d to the snapshot in, and reports whether it changed. A snapshot not newer than the
// one consumed changes nothing. The first snapshot, one of another source or baseline, and the
// first of a new hour are taken as the new reference without judging anything (their increment
// over the last one is not known: the window dropped an hour's bucket); one observed a recent
// window after the last (the alert resolved as the window left) also starts the detector
// afresh. Increments are judged only against a baseline bound (hasP0). A fall of the counts (a
// re-assessment to unscored) is no outcome.
func (d *Detector) step(in detectorInput, p detectorParams) bool {
	if d.Source == in.source && in.version <= d.Version {
		return false
	}
	obs := in.observed.Unix()
	if d.Observed != 0 && time.Duration(obs-d.Observed)*time.Second >= p.quiet {
		*d = Detector{}
	}
	dx, dn := in.confirmed-d.Confirmed, in.scored-d.Scored
	same := d.Source == in.source && floorDiv(obs, 3600) == floorDiv(d.Observed, 3600)
	d.Source, d.Version, d.Observed, d.Confirmed, d.Scored = in.source, in.version, obs, in.confirmed, in.scored
	if !same || dn <= 0 || !in.hasP0 {
		return true
	}
	st, ok := newDetectorStep(in.p0, p.minIncrease)
	if !ok {
		return true
	}
	d.advance(&st, min(max(dx, 0), dn), dn, floorDiv(obs, 60), p)
	d.Judged += dn
	d.P0 = in.p0
	return true
}

// encode is the detector as Redis keeps it: space-separated fields, CUSUMs to 7 digits.
func (d *Detector) encode() string {
	var b strings.Builder
	alarm := 0
	if d.Alarm {
		alarm = 1
	}
	fmt.Fprintf(&b, "2 %s %d %d %d %d %d %d %s %d", d.Source, d.Version, d.Observed, d.Confirmed, d.Scored, d.Minute,
		d.Judged, strconv.FormatFloat(d.P0, 'g', 7, 64), alarm)
	for c := range d.S {
		for _, s := range d.S[c] {
			b.WriteByte(' ')
			b.WriteString(strconv.FormatFloat(s, 'g', 7, 64))
		}
	}
	return b.String()
}

// decodeDetector reads encode's form; an empty or unreadable value is a new detector.
func decodeDetector(v string) Detector {
	var d Detector
	f := strings.Fields(v)
	const head = 10
	if len(f) != head+2*detectorK || f[0] != "2" {
		return Detector{}
	}
	d.Source = f[1]
	ints := []*int64{&d.Version, &d.Observed, &d.Confirmed, &d.Scored, &d.Minute, &d.Judged}
	for i, p := range ints {
		n, err := strconv.ParseInt(f[2+i], 10, 64)
		if err != nil {
			return Detector{}
		}
		*p = n
	}
	p0, err := strconv.ParseFloat(f[head-2], 64)
	if err != nil || !(p0 >= 0 && p0 < 1) || (f[head-1] != "0" && f[head-1] != "1") {
		return Detector{}
	}
	d.P0, d.Alarm = p0, f[head-1] == "1"
	for i := range 2 * detectorK {
		s, err := strconv.ParseFloat(f[head+i], 64)
		if err != nil || math.IsNaN(s) || math.IsInf(s, 0) {
			return Detector{}
		}
		d.S[i/detectorK][i%detectorK] = s
	}
	return d
}
