package alert

import (
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// Table holds the latest snapshot of everything a subscriber has seen: repeat-rate snapshots by
// aggregate (the greatest version wins), suite snapshots by key (the latest observation wins) and
// the revived cases announced as regressions. It is not safe for concurrent use: one evaluator
// owns it.
type Table struct {
	rates   map[string]*rateEntry
	disc    map[string]*schemas.SuiteDiscrimination
	stab    map[string]*schemas.SuiteStability
	revived map[string]*schemas.CaseRevived
	// dirty holds the aggregates whose snapshot changed since the last TakeDirty: the subjects of
	// rate rules whose condition may have changed (time alone only takes a rate condition from
	// true to false, and a subject with a condition true has a record, evaluated every time).
	dirty map[string]struct{}
	// ids are the aggregate ids in order, and entries their entries in the same order; nil once
	// an aggregate is added, until asked for.
	ids     []string
	entries []*rateEntry
}

// rateEntry is an aggregate's latest snapshot and when a scored opportunity was last seen arrive.
type rateEntry struct {
	snap schemas.Snapshot
	// subject is the aggregate's subject, made once: its fields never change. Shared: read only.
	subject Subject
	// firstSeen is the first snapshot's observation time; lastScoredAt the observation time of
	// the latest snapshot whose all-time scored count rose above the one before (or of the first
	// one seen, when it had anything scored).
	firstSeen, lastScoredAt time.Time
	// changed is set once a snapshot's all-time scored count rose above the one before. Until
	// then the silence is timed from the first snapshot seen, which is only an upper bound of
	// when it began (the compacted topic keeps the latest snapshot, not the one that scored last).
	changed bool
}

// silentSince is when the aggregate's silence began, as far as the table knows.
func (e *rateEntry) silentSince() time.Time {
	if e.lastScoredAt.IsZero() {
		return e.firstSeen
	}
	return e.lastScoredAt
}

// RestoreSilence takes an earlier start of aggregate id's silence, recorded (in Redis) by an
// evaluator that saw more snapshots, when this table has seen no change of the all-time scored
// count since its first snapshot and that count is still scored: nothing was scored between.
// It reports whether the silence now starts earlier.
func (t *Table) RestoreSilence(id string, scored int64, since time.Time) bool {
	e, ok := t.rates[id]
	if !ok || e.changed || since.IsZero() || e.snap.Windows.All.Scored != scored || !since.Before(e.silentSince()) {
		return false
	}
	if e.lastScoredAt.IsZero() {
		e.firstSeen = since
	} else {
		e.lastScoredAt = since
	}
	return true
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{rates: map[string]*rateEntry{}, disc: map[string]*schemas.SuiteDiscrimination{},
		stab: map[string]*schemas.SuiteStability{}, revived: map[string]*schemas.CaseRevived{}, dirty: map[string]struct{}{}}
}

// TakeDirty returns the aggregates whose snapshot changed since it was last called, and forgets
// them; an evaluation that fails gives them back (Redirty).
func (t *Table) TakeDirty() map[string]struct{} {
	d := t.dirty
	t.dirty = map[string]struct{}{}
	return d
}

// Redirty marks the aggregates of d changed again.
func (t *Table) Redirty(d map[string]struct{}) {
	for id := range d {
		t.dirty[id] = struct{}{}
	}
}

// DirtyAll marks every aggregate changed.
func (t *Table) DirtyAll() {
	for id := range t.rates {
		t.dirty[id] = struct{}{}
	}
}

// aggregates returns the aggregate ids in order and their entries, sorted again only after one
// was added.
func (t *Table) aggregates() ([]string, []*rateEntry) {
	if t.ids == nil {
		t.ids = sortedKeys(t.rates)
		t.entries = make([]*rateEntry, len(t.ids))
		for i, id := range t.ids {
			t.entries[i] = t.rates[id]
		}
	}
	return t.ids, t.entries
}

// PutSnapshot records a repeat-rate snapshot and reports whether it was newer than the held one.
func (t *Table) PutSnapshot(s *schemas.Snapshot) bool {
	id := s.Aggregate.ID()
	e, ok := t.rates[id]
	if !ok {
		e = &rateEntry{firstSeen: s.ObservedAt}
		if s.Windows.All.Scored > 0 {
			e.lastScoredAt = s.ObservedAt
		}
		e.snap = *s
		e.subject = aggregateSubject(&e.snap.Aggregate)
		t.rates[id] = e
		t.ids = nil
		t.dirty[id] = struct{}{}
		return true
	}
	if s.Version <= e.snap.Version {
		return false
	}
	t.dirty[id] = struct{}{}
	// Only a rise is something scored: a fall is a re-assessment to unscored or an expiry, and
	// must not restart a silence (not_measured_for would resolve and fire again).
	if s.Windows.All.Scored > e.snap.Windows.All.Scored && s.ObservedAt.After(e.lastScoredAt) {
		e.lastScoredAt, e.changed = s.ObservedAt, true
	}
	e.snap = *s
	return true
}

// suiteNewer reports whether a suite snapshot of version v observed at is newer than the held one
// (hv, hat): by snapshot version when both carry one, which follows Redis's order of changes
// whatever the processors' clocks, then by observation time (a snapshot of the same runs observed
// later has its missing runs matured further); by observation time alone for events published
// before versions.
func suiteNewer(v int64, at time.Time, hv int64, hat time.Time) bool {
	if v > 0 && hv > 0 && v != hv {
		return v > hv
	}
	return at.After(hat)
}

// PutDiscrimination records a suite discrimination snapshot unless a later one is held.
func (t *Table) PutDiscrimination(d *schemas.SuiteDiscrimination) bool {
	k := "d|" + schemas.JoinEscaped(d.Workspace, d.Suite)
	if h, ok := t.disc[k]; ok && !suiteNewer(d.SnapshotVersion, d.ObservedAt, h.SnapshotVersion, h.ObservedAt) {
		return false
	}
	c := *d
	t.disc[k] = &c
	return true
}

// PutStability records a suite stability snapshot unless a later one is held.
func (t *Table) PutStability(s *schemas.SuiteStability) bool {
	k := "s|" + schemas.JoinEscaped(s.Workspace, s.Suite, s.Version)
	if h, ok := t.stab[k]; ok && !suiteNewer(s.SnapshotVersion, s.ObservedAt, h.SnapshotVersion, h.ObservedAt) {
		return false
	}
	c := *s
	t.stab[k] = &c
	return true
}

// PutRevived records a revived case; only regressions (pass → fail) are kept.
func (t *Table) PutRevived(r *schemas.CaseRevived) bool {
	if !r.Regression {
		return false
	}
	k := "c|" + schemas.JoinEscaped(r.Workspace, r.Suite, r.CaseID)
	if h, ok := t.revived[k]; ok && *h == *r {
		return false
	}
	c := *r
	t.revived[k] = &c
	return true
}

// Gone reports whether the table holds evidence that the subject of key, whose fields are fields,
// no longer exists: evidence every evaluator reads the same way once it has read as far. A subject
// the table does not hold is not gone (another evaluator may hold it: lag, a partition read later,
// an event expired from a delete-retention topic before this one started), except a revived case
// whose suite's latest discrimination snapshot, held here, lists its revived cases in full without
// it. held reports whether the table holds the subject at all.
func (t *Table) Gone(key string, fields map[string]string) (gone, held bool) {
	switch {
	case strings.HasPrefix(key, "a|"):
		_, held = t.rates[key[2:]]
	case strings.HasPrefix(key, "b|"):
		if a, ok := badgeAggregate(key); ok {
			_, held = t.badgeOf(a)
		}
	case strings.HasPrefix(key, "d|"):
		_, held = t.disc[key]
	case strings.HasPrefix(key, "s|"):
		_, held = t.stab[key]
	case strings.HasPrefix(key, "c|"):
		if _, held = t.revived[key]; held {
			break
		}
		d, ok := t.disc["d|"+schemas.JoinEscaped(fields["workspace"], fields["suite"])]
		if ok && d.RevivedTotal <= len(d.Revived) && !slices.Contains(d.Revived, fields["case_id"]) {
			return true, false
		}
	}
	return false, held
}

// badgeOf is the badge subject of a's scope and correction with the snapshot it reads: live when
// live is measured over all time (or is all there is), else evaluation, as badgeSubjects chooses.
func (t *Table) badgeOf(a schemas.Aggregate) (subjectSnapshot, bool) {
	live, eval := a, a
	live.Source, eval.Source = SourceLive, SourceEvaluation
	le, lok := t.rates[live.ID()]
	ee, eok := t.rates[eval.ID()]
	var e *rateEntry
	switch {
	case lok && (le.snap.Windows.All.Scored > 0 || !eok):
		e = le
	case eok:
		e = ee
	default:
		return subjectSnapshot{}, false
	}
	s := aggregateSubject(&e.snap.Aggregate)
	s.Key = badgeKey(&a)
	delete(s.Fields, "source")
	return subjectSnapshot{subject: s, snap: &e.snap}, true
}

// badgeKey is the subject key of a's scope and correction.
func badgeKey(a *schemas.Aggregate) string {
	return "b|" + schemas.JoinEscaped(a.Workspace, a.Model, a.Run, a.Checkpoint, a.Artifact, a.CorrectionID)
}

// badgeAggregate is the scope and correction of a badge subject key.
func badgeAggregate(key string) (schemas.Aggregate, bool) {
	p, err := schemas.SplitEscaped(strings.TrimPrefix(key, "b|"))
	if err != nil || len(p) != 6 {
		return schemas.Aggregate{}, false
	}
	return schemas.Aggregate{Workspace: p[0], Model: p[1], Run: p[2], Checkpoint: p[3], Artifact: p[4], CorrectionID: p[5]}, true
}

// Len is the number of subjects held.
func (t *Table) Len() int { return len(t.rates) + len(t.disc) + len(t.stab) + len(t.revived) }

// sortedKeys returns m's keys in order, so evaluations are deterministic.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
