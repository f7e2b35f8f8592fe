package alert

import (
	"slices"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// Subject is what one rule alerts on: an aggregate, a scope and correction (for the badge's
// source), a suite, a suite version or a revived case.
type Subject struct {
	// Key is unique among the subjects of a rule: a kind letter and the escaped parts.
	Key string
	// Fields are the parts, by the names matchers use.
	Fields map[string]string
}

// Condition is a rule's verdict on one subject at one evaluation.
type Condition struct {
	Subject  Subject
	Active   bool
	Evidence schemas.AlertEvidence
	// silence is, for not_measured_for, where the silence was timed from; the record keeps it so
	// that a restarted evaluator resumes the silence instead of timing it from the latest snapshot.
	silence *silence
}

// silence is when an aggregate's silence began and its all-time scored count then.
type silence struct {
	aggregate string
	since     time.Time
	scored    int64
}

// silenceCondition evaluates a not_measured_for rule on the aggregate id of the table.
func silenceCondition(r *Rule, id string, e *rateEntry, now time.Time) Condition {
	since := e.silentSince()
	silent := now.Sub(since)
	ev := schemas.AlertEvidence{EvaluatedAt: now, ObservedAt: timePtr(e.snap.ObservedAt), Source: r.Source,
		Value: floatPtr(silent.Seconds()), Threshold: floatPtr(r.Duration.Seconds()),
		Windows: []schemas.AlertWindow{snapshotWindow(WindowAll, e.snap.Windows.All)}}
	if !e.lastScoredAt.IsZero() {
		ev.LastScoredAt = timePtr(e.lastScoredAt)
	}
	return Condition{Subject: aggregateSubject(&e.snap.Aggregate), Active: silent >= r.Duration, Evidence: ev,
		silence: &silence{aggregate: id, since: since, scored: e.snap.Windows.All.Scored}}
}

// Evaluate decides r's condition at now for every subject of t its matchers select. Subjects
// without enough data (a window below min_scored, a suite with nothing judged) are inactive.
func Evaluate(r *Rule, t *Table, now time.Time) []Condition {
	var out []Condition
	switch r.Kind {
	case KindThreshold, KindChange:
		ids, _ := t.aggregates()
		every := make(map[string]struct{}, len(ids))
		for _, id := range ids {
			every[id] = struct{}{}
		}
		for _, c := range changedSubjects(r, t, every, nil) {
			out = append(out, rateCondition(r, c.subject, c.snap, now))
		}
	case KindNotMeasuredFor:
		for _, id := range sortedKeys(t.rates) {
			e := t.rates[id]
			if e.snap.Aggregate.Source == r.Source && matchAll(r.Matchers, aggregateSubject(&e.snap.Aggregate).Fields) {
				out = append(out, silenceCondition(r, id, e, now))
			}
		}
	case KindRevivedRegression:
		for _, k := range sortedKeys(t.revived) {
			c := t.revived[k]
			s := Subject{Key: k, Fields: map[string]string{"workspace": c.Workspace, "suite": c.Suite, "case_id": c.CaseID, "version": c.Version}}
			if !matchAll(r.Matchers, s.Fields) {
				continue
			}
			// Still revived while the suite's latest discrimination lists it (or cut its list).
			active := true
			if d, ok := t.disc["d|"+schemas.JoinEscaped(c.Workspace, c.Suite)]; ok && d.RevivedTotal <= len(d.Revived) {
				active = false
				for _, id := range d.Revived {
					active = active || id == c.CaseID
				}
			}
			out = append(out, Condition{Subject: s, Active: active, Evidence: schemas.AlertEvidence{EvaluatedAt: now}})
		}
	case KindAchievableRangeBelow:
		for _, k := range sortedKeys(t.disc) {
			d := t.disc[k]
			s := Subject{Key: k, Fields: map[string]string{"workspace": d.Workspace, "suite": d.Suite}}
			if !matchAll(r.Matchers, s.Fields) {
				continue
			}
			ev := schemas.AlertEvidence{EvaluatedAt: now, ObservedAt: timePtr(d.ObservedAt), Value: d.AchievableRange, Threshold: floatPtr(r.Value)}
			out = append(out, Condition{Subject: s, Active: d.AchievableRange != nil && *d.AchievableRange < r.Value, Evidence: ev})
		}
	case KindAbnormalShareAbove, KindMissingRunsAbove:
		for _, k := range sortedKeys(t.stab) {
			st := t.stab[k]
			s := Subject{Key: k, Fields: map[string]string{"workspace": st.Workspace, "suite": st.Suite, "version": st.Version}}
			if !matchAll(r.Matchers, s.Fields) {
				continue
			}
			ev := schemas.AlertEvidence{EvaluatedAt: now, ObservedAt: timePtr(st.ObservedAt), Threshold: floatPtr(r.Value)}
			var active bool
			if r.Kind == KindMissingRunsAbove {
				ev.Value = floatPtr(float64(st.MissingRunsTotal))
				active = float64(st.MissingRunsTotal) > r.Value
			} else if n := st.ReplyLength.Count; n > 0 {
				ev.Value = floatPtr(float64(st.AbnormalSamples) / float64(n))
				active = int64(n) >= r.MinScored && *ev.Value > r.Value
			}
			out = append(out, Condition{Subject: s, Active: active, Evidence: ev})
		}
	}
	return out
}

// changedSubjects lists the subjects of threshold or change rule r that its matchers select among
// those of the aggregates in dirty and those with a record (recorded: subject key → record key),
// each once, in key order, with the snapshot each reads. A record of a subject of another kind
// (the rule's source changed to or from badge) is not among them: it steps as no longer selected.
func changedSubjects(r *Rule, t *Table, dirty map[string]struct{}, recorded map[string]string) []subjectSnapshot {
	seen := map[string]bool{}
	var out []subjectSnapshot
	add := func(c subjectSnapshot) {
		if !seen[c.subject.Key] && matchAll(r.Matchers, c.subject.Fields) {
			seen[c.subject.Key] = true
			out = append(out, c)
		}
	}
	take := func(e *rateEntry) {
		if r.Source == SourceBadge {
			if c, ok := t.badgeOf(e.snap.Aggregate); ok {
				add(c)
			}
		} else if e.snap.Aggregate.Source == r.Source {
			add(subjectSnapshot{subject: e.subject, snap: &e.snap})
		}
	}
	for id := range dirty {
		if e, ok := t.rates[id]; ok {
			take(e)
		}
	}
	for k := range recorded {
		if id, ok := strings.CutPrefix(k, "a|"); ok {
			if e, ok := t.rates[id]; ok {
				take(e)
			}
		} else if a, ok := badgeAggregate(k); ok && strings.HasPrefix(k, "b|") && r.Source == SourceBadge {
			if c, ok := t.badgeOf(a); ok {
				add(c)
			}
		}
	}
	slices.SortFunc(out, func(a, b subjectSnapshot) int { return strings.Compare(a.subject.Key, b.subject.Key) })
	return out
}

// silentSubjects evaluates not_measured_for rule r on the subjects of the aggregates in dirty
// and those with a record (recorded: subject key → record key) and, when all is set, on every
// subject whose silence has lasted the rule's duration; the others, whose condition is false,
// cost a comparison each.
func silentSubjects(r *Rule, t *Table, dirty map[string]struct{}, recorded map[string]string, all bool, now time.Time) []Condition {
	var out []Condition
	take := func(id string, e *rateEntry) {
		if e.snap.Aggregate.Source == r.Source && matchAll(r.Matchers, e.subject.Fields) {
			out = append(out, silenceCondition(r, id, e, now))
		}
	}
	if all {
		ids, entries := t.aggregates()
		for i, e := range entries {
			if _, ok := recorded[e.subject.Key]; ok || now.Sub(e.silentSince()) >= r.Duration {
				take(ids[i], e)
			}
		}
		return out
	}
	seen := map[string]bool{}
	for id := range dirty {
		if e, ok := t.rates[id]; ok {
			seen[id] = true
			take(id, e)
		}
	}
	for k := range recorded {
		if id, ok := strings.CutPrefix(k, "a|"); ok && !seen[id] {
			if e, ok := t.rates[id]; ok {
				take(id, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b Condition) int { return strings.Compare(a.Subject.Key, b.Subject.Key) })
	return out
}

// rateCondition evaluates a threshold or change rule on one snapshot.
func rateCondition(r *Rule, s Subject, snap *schemas.Snapshot, now time.Time) Condition {
	ev := schemas.AlertEvidence{EvaluatedAt: now, ObservedAt: timePtr(snap.ObservedAt), Source: snap.Aggregate.Source}
	w := windowAt(snap, r.Window, now)
	if r.Kind == KindThreshold {
		ev.Windows = []schemas.AlertWindow{snapshotWindow(r.Window, w)}
		ev.Threshold = floatPtr(r.Value)
		ev.Value = w.Rate
		return Condition{Subject: s, Active: thresholdActive(r, w), Evidence: ev}
	}
	recent, base := changeCounts(r, snap, w, now)
	epoch := r.Epoch()
	perSubject := r.alphaPerSubject()
	ch := ChangeTest(recent, base, perSubject, epoch, r.Horizon, r.MinIncrease)
	_, rh := ConfidenceSequence(recent, ch.AlphaPerEpoch/2)
	bl, _ := ConfidenceSequence(base, ch.AlphaPerEpoch/2)
	ev.Windows = []schemas.AlertWindow{
		countsWindow(r.Window, recent, &schemas.Interval{Low: ch.RecentLow, High: rh}),
		countsWindow(r.Baseline+"-"+r.Window, base, &schemas.Interval{Low: bl, High: ch.BaselineHigh}),
	}
	if recent.Scored > 0 && base.Scored > 0 {
		ev.Value = floatPtr(recent.Rate() - base.Rate())
	}
	ev.Threshold = floatPtr(r.MinIncrease)
	ev.Test = &schemas.AlertTest{Method: ChangeMethod, Alpha: r.Alpha, Subjects: max(r.Subjects, 1), AlphaPerSubject: perSubject,
		Horizon: r.Horizon.String(), Epoch: epoch.String(), AlphaPerEpoch: ch.AlphaPerEpoch, MinIncrease: r.MinIncrease, LowerDifference: ch.LowerDifference, FisherPOneLook: FisherGreater(recent, base)}
	active := recent.Scored >= r.MinScored && base.Scored >= r.MinScored && ch.Fires
	return Condition{Subject: s, Active: active, Evidence: ev}
}

// rateActive is rateCondition's verdict without its evidence, at a fraction of its cost: the
// change test's bounds are computed only when both windows hold min_scored and the recent rate is
// above the baseline's (the bounds cannot part otherwise).
func rateActive(r *Rule, snap *schemas.Snapshot, now time.Time) bool {
	w := windowAt(snap, r.Window, now)
	if r.Kind == KindThreshold {
		return thresholdActive(r, w)
	}
	recent, base := changeCounts(r, snap, w, now)
	if recent.Scored < r.MinScored || base.Scored < r.MinScored || recent.Rate() <= base.Rate() {
		return false
	}
	return ChangeTest(recent, base, r.alphaPerSubject(), r.Epoch(), r.Horizon, r.MinIncrease).Fires
}

// thresholdActive is a threshold rule's verdict on its window w.
func thresholdActive(r *Rule, w schemas.Window) bool {
	return w.Scored >= r.MinScored && w.Rate != nil && ((r.Above && *w.Rate > r.Value) || (!r.Above && *w.Rate < r.Value))
}

// changeCounts are a change rule's recent counts (its window w as it stands at now) and baseline
// counts (its baseline window less the recent one).
func changeCounts(r *Rule, snap *schemas.Snapshot, w schemas.Window, now time.Time) (recent, base Counts) {
	long := windowAt(snap, r.Baseline, now)
	recent = Counts{Confirmed: w.ConfirmedRepeats, Scored: w.Scored}
	base = Counts{Confirmed: long.ConfirmedRepeats - w.ConfirmedRepeats, Scored: long.Scored - w.Scored}
	return recent, base
}

// Epoch is the change rule's epoch: the bucket of its windows (a minute for a 1h window, whose
// buckets are minutes; an hour otherwise). Within one epoch both windows keep their buckets.
func (r *Rule) Epoch() time.Duration {
	if r.Window == Window1h {
		return time.Minute
	}
	return time.Hour
}

// windowAt is the snapshot's window name as it stands at now. A snapshot is published only when
// its aggregate receives events, so one that is older than a rolling window's length holds
// nothing of that window any more: the window is empty (not measured), and an alert on it must
// not keep firing on data that left it — an aggregate gone silent, or dropped as idle, whose last
// snapshot stays in the compacted topic. A window the clock has only partly moved past keeps the
// snapshot's counts (an upper bound of what it still holds).
func windowAt(s *schemas.Snapshot, name string, now time.Time) schemas.Window {
	if windowLeft(name, s.ObservedAt, now) {
		return schemas.Window{Status: schemas.StatusNotMeasured}
	}
	return window(s, name)
}

// windowLeft reports whether the rolling window name observed at obs holds nothing any more at
// now: the bucket of now is a whole window length after the bucket of obs. all is never left.
func windowLeft(name string, obs, now time.Time) bool {
	bucket, n, ok := windowSpan(name)
	if !ok {
		return false
	}
	return floorDiv(now.UnixMicro(), bucket.Microseconds())-floorDiv(obs.UnixMicro(), bucket.Microseconds()) >= n
}

// windowSpan is a rolling window's bucket and number of buckets; ok is false for all.
func windowSpan(name string) (bucket time.Duration, n int64, ok bool) {
	switch name {
	case Window1h:
		return time.Minute, 60, true
	case Window24h:
		return time.Hour, 24, true
	case Window7d:
		return time.Hour, 168, true
	}
	return 0, 0, false
}

// floorDiv is a / b rounded toward negative infinity (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

func window(s *schemas.Snapshot, name string) schemas.Window {
	switch name {
	case Window1h:
		return s.Windows.Hour
	case Window24h:
		return s.Windows.Day
	case Window7d:
		return s.Windows.Week
	}
	return s.Windows.All
}

func snapshotWindow(name string, w schemas.Window) schemas.AlertWindow {
	return schemas.AlertWindow{Name: name, ConfirmedRepeats: w.ConfirmedRepeats, Scored: w.Scored, Rate: w.Rate,
		Interval: w.CI95, IntervalKind: "wilson95"}
}

func countsWindow(name string, c Counts, ci *schemas.Interval) schemas.AlertWindow {
	w := schemas.AlertWindow{Name: name, ConfirmedRepeats: c.Confirmed, Scored: c.Scored, IntervalKind: "confidence_sequence"}
	if c.Scored > 0 {
		w.Rate, w.Interval = floatPtr(c.Rate()), ci
	}
	return w
}

// selects reports whether rule r could evaluate subject s at all: s is of the kind of subject r's
// kind evaluates (and of its source) and r's matchers select its fields. A record whose subject
// its rule no longer selects (the rules file changed) is stepped inactive whether or not the
// table holds the subject.
func (r *Rule) selects(s Subject) bool {
	prefix, _, _ := strings.Cut(s.Key, "|")
	var want string
	switch r.Kind {
	case KindThreshold, KindChange, KindNotMeasuredFor:
		want = "a"
		if r.Source == SourceBadge {
			want = "b"
		} else if s.Fields["source"] != r.Source {
			return false
		}
	case KindRevivedRegression:
		want = "c"
	case KindAchievableRangeBelow:
		want = "d"
	case KindAbnormalShareAbove, KindMissingRunsAbove:
		want = "s"
	}
	return prefix == want && matchAll(r.Matchers, s.Fields)
}

func aggregateSubject(a *schemas.Aggregate) Subject {
	return Subject{Key: "a|" + a.ID(), Fields: map[string]string{"workspace": a.Workspace, "model": a.Model, "run": a.Run,
		"checkpoint": a.Checkpoint, "artifact": a.Artifact, "correction_id": a.CorrectionID, "source": a.Source}}
}

// subjectSnapshot is a rate rule's subject with the snapshot it reads.
type subjectSnapshot struct {
	subject Subject
	snap    *schemas.Snapshot
}

func timePtr(t time.Time) *time.Time { return &t }
func floatPtr(f float64) *float64    { return &f }
