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
//     its recent window) at level α_b per hour epoch, α_b = (α/2)·hour/horizon: by the union bound
//     over epochs, the probability that p0 is below the true rate at any look of the horizon is at
//     most α/2.
//   - For each odds ratio r_k of detectorGrid, θ_k is the rate whose odds are r_k times p0's (at
//     least p0 + min_increase), and S_k is a CUSUM of the log-likelihood ratio of θ_k against p0:
//     S_k ← max(S_k, 0) at the first update of each minute, then S_k += x·log(θ_k/p0) +
//     (n−x)·log((1−θ_k)/(1−p0)) for x repeats among n new scored outcomes.
//   - It alarms once L = log(Σ_k e^{S_k}/K) reaches h = log(2·B/α), B the minutes in the horizon,
//     and until L falls under h − detectorHysteresis.
//
// When p0 is at least the true rate, each e^{S_k} is at most the largest of the likelihood-ratio
// supermartingales started at the minutes' first updates, so Σ_k e^{S_k}/K is at most the
// Shiryaev–Roberts sum of the mixture supermartingales started there, which grows by at most one
// per start in expectation: by optional stopping, the probability that it reaches 2·B/α within B
// starts is at most α/2. Both parts together: at most α per subject per horizon, however often
// the detector is looked at.

// detectorGrid are the post-change odds ratios the detector mixes over, with equal weights.
var detectorGrid = [...]float64{1.2, 1.8, 2.7, 4, 6, 9, 13.5, 20, 30, 45}

const detectorK = len(detectorGrid)

// detectorHeadroom caps the statistic at h + detectorHeadroom (nats) by lowering every S_k by
// the same amount: a long episode leaves no statistic that takes days to come down once the rate
// is back, while the alternatives keep their order (those far from the episode's rate, which
// would fall slowly, stay far below), and a run of passes within an episode does not take the
// statistic under h (at 15 % against 2 %, about 70 passes in a row). Lowering the CUSUMs never
// raises a later statistic, so the guarantee is kept.
const detectorHeadroom = 4.0

// detectorHysteresis is how far under h the statistic must fall to end an alarm: right after
// it first reaches h the statistic hovers there, and each pass would end the alarm and each
// repeat raise it again.
const detectorHysteresis = 8.0

// DetectorMethod names the sequential test in an alert's evidence.
const DetectorMethod = "mixture CUSUM against the baseline's upper confidence bound"

// Detector is one subject's detector state: what it has consumed of the snapshots and its
// CUSUMs. It is O(1) per subject; the evaluators share it in Redis (Redis.StepDetectors).
type Detector struct {
	// Source is the source of the snapshot it consumed (a badge subject may switch between live
	// and evaluation: the counts of one are no increment of the other's).
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
	// S are the CUSUMs, in nats, one per grid point.
	S [detectorK]float64
}

// detectorThreshold is h = log(2·B/alpha) for a subject's alpha over horizon in minutes.
func detectorThreshold(alpha float64, horizon time.Duration) float64 {
	b := math.Max(1, math.Ceil(horizon.Minutes()))
	return math.Log(2 * b / alpha)
}

// detectorBaselineAlpha is the level of p0's confidence sequence per epoch of the baseline (the
// recent window's bucket: an hour, or a minute for a 1h window).
func detectorBaselineAlpha(alpha float64, epoch, horizon time.Duration) float64 {
	return alpha / 2 * float64(epoch) / float64(horizon)
}

// Statistic is L = log(Σ_k e^{S_k}/K).
func (d *Detector) Statistic() float64 {
	m := math.Inf(-1)
	for _, s := range d.S {
		m = math.Max(m, s)
	}
	sum := 0.0
	for _, s := range d.S {
		sum += math.Exp(s - m)
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

// advance consumes x repeats among n new scored outcomes seen in minute, lowers every CUSUM alike
// so that the statistic is at most h + detectorHeadroom, and sets or clears the alarm against
// the threshold h. The first update of a minute starts a new run (S_k ← max(S_k, 0)).
func (d *Detector) advance(st *detectorStep, x, n, minute int64, h float64) {
	if minute > d.Minute {
		for k := range d.S {
			d.S[k] = math.Max(d.S[k], 0)
		}
		d.Minute = minute
	}
	xf, pf := float64(x), float64(n-x)
	for k := range d.S {
		d.S[k] += xf*st.repeat[k] + pf*st.pass[k]
	}
	stat := d.Statistic()
	if over := stat - (h + detectorHeadroom); over > 0 {
		for k := range d.S {
			d.S[k] -= over
		}
	}
	switch {
	case stat >= h:
		d.Alarm = true
	case stat < h-detectorHysteresis:
		d.Alarm = false
	}
}

// detectorInput is what one snapshot gives the detector.
type detectorInput struct {
	source            string
	version           int64
	observed          time.Time
	confirmed, scored int64 // the baseline window's counts
	p0                float64
	hasP0             bool
}

// step moves d to the snapshot in, and reports whether it changed. A snapshot not newer than the
// one consumed changes nothing. The first snapshot, one of another source, and the first of a new
// hour are taken as the new reference without judging anything (their increment over the last
// one is not known: the window dropped an hour's bucket); increments are judged only against a
// baseline bound (hasP0). A fall of the counts (a re-assessment to unscored) is no outcome.
func (d *Detector) step(in detectorInput, minIncrease, h float64) bool {
	if d.Source == in.source && in.version <= d.Version {
		return false
	}
	obs := in.observed.Unix()
	dx, dn := in.confirmed-d.Confirmed, in.scored-d.Scored
	same := d.Source == in.source && floorDiv(obs, 3600) == floorDiv(d.Observed, 3600)
	d.Source, d.Version, d.Observed, d.Confirmed, d.Scored = in.source, in.version, obs, in.confirmed, in.scored
	if !same || dn <= 0 || !in.hasP0 {
		return true
	}
	st, ok := newDetectorStep(in.p0, minIncrease)
	if !ok {
		return true
	}
	d.advance(&st, min(max(dx, 0), dn), dn, floorDiv(obs, 60), h)
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
	fmt.Fprintf(&b, "1 %s %d %d %d %d %d %d %s %d", d.Source, d.Version, d.Observed, d.Confirmed, d.Scored, d.Minute,
		d.Judged, strconv.FormatFloat(d.P0, 'g', -1, 64), alarm)
	for _, s := range d.S {
		b.WriteByte(' ')
		b.WriteString(strconv.FormatFloat(s, 'g', 7, 64))
	}
	return b.String()
}

// decodeDetector reads encode's form; an empty or unreadable value is a new detector.
func decodeDetector(v string) Detector {
	var d Detector
	f := strings.Fields(v)
	const head = 10
	if len(f) != head+detectorK || f[0] != "1" {
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
	for k := range d.S {
		s, err := strconv.ParseFloat(f[head+k], 64)
		if err != nil || math.IsNaN(s) {
			return Detector{}
		}
		d.S[k] = s
	}
	return d
}
