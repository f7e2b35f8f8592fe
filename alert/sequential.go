package alert

import (
	"context"
	"fmt"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// alphaPerSubject is what one subject's test spends of the rule's alpha.
func (r *Rule) alphaPerSubject() float64 { return r.Alpha / float64(max(r.Subjects, 1)) }

// detectorInputOf is what snap gives r's detector: its baseline window's counts, whose growth
// within an hour is the new outcomes, and the upper confidence bound of the baseline (the
// baseline window less the recent one) when that holds min_scored.
func detectorInputOf(r *Rule, snap *schemas.Snapshot) detectorInput {
	long, w := window(snap, r.Baseline), window(snap, r.Window)
	in := detectorInput{source: snap.Aggregate.Source + "/" + r.Baseline, version: snap.Version, observed: snap.ObservedAt,
		confirmed: long.ConfirmedRepeats, scored: long.Scored}
	base := Counts{Confirmed: long.ConfirmedRepeats - w.ConfirmedRepeats, Scored: long.Scored - w.Scored}
	if base.Scored >= r.MinScored && base.valid() {
		_, in.p0 = ConfidenceSequence(base, detectorBaselineAlpha(r.alphaPerSubject(), r.Epoch(), r.Horizon))
		in.hasP0 = in.p0 < 1
	}
	return in
}

// sequentialCondition is a sequential change rule's verdict on subject s: active while the
// detector is in alarm and consumed a snapshot observed within the rule's recent window (an
// aggregate gone quiet resolves as the window rule's does).
// The evidence keeps the windows and their test for reading, and adds the detector's figures.
func sequentialCondition(r *Rule, s Subject, snap *schemas.Snapshot, d *Detector, now time.Time) Condition {
	c := rateCondition(r, s, snap, now)
	h := detectorThreshold(r.alphaPerSubject(), r.Horizon)
	stat := d.Statistic()
	c.Evidence.Test.Method = DetectorMethod
	c.Evidence.Test.Detector = &schemas.AlertDetector{Statistic: stat, Threshold: h, BaselineHigh: d.P0, Scored: d.Judged}
	c.Active = d.Alarm && !windowLeft(r.Window, time.Unix(d.Observed, 0), now)
	return c
}

// cachedDetector is a detector as this evaluator last read or wrote it, with its encoding.
type cachedDetector struct {
	d   Detector
	enc string
}

// sequential evaluates a change rule with method sequential. Each subject's detector lives in
// Redis, shared by every evaluator: a subject whose snapshot is newer than the detector this
// evaluator last knew is read and stepped by compare-and-set (another evaluator may step it
// first: then it is read again, and a snapshot that is not newer than the one it consumed
// changes nothing, so each snapshot's outcomes are judged once however many evaluators run). A
// subject with a record is read whatever this evaluator knew, so that every evaluator decides
// on the same state; others are decided on the detector as last known, without a round trip.
// subs are the subjects to evaluate (changedSubjects); recorded maps subject keys with a record to
// their record keys.
func (e *Evaluator) sequential(ctx context.Context, r *Rule, subs []subjectSnapshot, recorded map[string]string, now time.Time) ([]Condition, error) {
	p := newDetectorParams(r)
	ttl := windowLength(r.Baseline) + 24*time.Hour
	type item struct {
		key string
		in  detectorInput
		cur cachedDetector
	}
	items := make([]item, len(subs))
	var read []int
	for i, c := range subs {
		k := e.store.detectorKey(r.Name, c.subject.Key)
		items[i] = item{key: k, in: detectorInputOf(r, c.snap)}
		was, ok := e.detectors[k]
		items[i].cur = was
		stale := !ok || was.d.Source != items[i].in.source || was.d.Version < items[i].in.version
		if _, ok := recorded[c.subject.Key]; stale || ok {
			read = append(read, i)
		}
	}
	for attempt := 0; len(read) > 0; attempt++ {
		if attempt == 5 {
			return nil, fmt.Errorf("alert %s: detectors keep changing under compare-and-set", r.Name)
		}
		keys := make([]string, len(read))
		for j, i := range read {
			keys[j] = items[i].key
		}
		vals, err := e.store.LoadDetectors(ctx, keys)
		if err != nil {
			return nil, err
		}
		var swaps []detectorSwap
		var swapped []int
		for j, i := range read {
			it := &items[i]
			it.cur = cachedDetector{d: decodeDetector(vals[j]), enc: vals[j]}
			next := it.cur.d
			if next.step(it.in, p) {
				swaps = append(swaps, detectorSwap{Key: it.key, Old: vals[j], New: next.encode(), TTL: ttl})
				swapped = append(swapped, i)
			}
		}
		done, err := e.store.SwapDetectors(ctx, swaps)
		if err != nil {
			return nil, err
		}
		read = read[:0]
		for j, i := range swapped {
			if done[j] {
				items[i].cur = cachedDetector{d: decodeDetector(swaps[j].New), enc: swaps[j].New}
				continue
			}
			e.metrics.conflicts.Inc()
			read = append(read, i)
		}
	}
	var out []Condition
	for i, c := range subs {
		e.detectors[items[i].key] = items[i].cur
		// The evidence only for what is written: an alarm, or a record's.
		if _, ok := recorded[c.subject.Key]; ok || items[i].cur.d.Alarm {
			out = append(out, sequentialCondition(r, c.subject, c.snap, &items[i].cur.d, now))
		}
	}
	return out, nil
}

// windowLength is how far back a window reaches (all: the default identity retention).
func windowLength(name string) time.Duration {
	if bucket, n, ok := windowSpan(name); ok {
		return bucket * time.Duration(n)
	}
	return 30 * 24 * time.Hour
}
