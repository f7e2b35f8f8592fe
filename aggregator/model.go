package aggregator

import (
	"context"
	"time"

	"github.com/repeatrate/repeatrate/schemas"
)

// Class is the classification of one opportunity.
type Class uint8

// The three classes (docs/semantics.md#classes).
const (
	Confirmed Class = iota + 1 // a confirmed repeat of the corrected mistake
	Passed                     // the corrected behaviour held
	Unscored                   // not scored; reported, never part of the rate
)

func (c Class) String() string {
	switch c {
	case Confirmed:
		return "confirmed_repeat"
	case Passed:
		return "passed"
	case Unscored:
		return "unscored"
	}
	return "unknown"
}

// Outcome says what applying one observation did. Each value has its own metric series.
type Outcome uint8

// Outcomes of an apply.
const (
	Counted    Outcome = iota + 1 // a new opportunity was counted
	Reassessed                    // a newer assessment moved an opportunity to its new class and time
	Duplicate                     // the same assessment again: nothing changed
	Stale                         // an older assessment than the one held: nothing changed
	Expired                       // occurred in an hour retention no longer covers (see Model)
)

func (o Outcome) String() string {
	switch o {
	case Counted:
		return "counted"
	case Reassessed:
		return "reassessed"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	case Expired:
		return "expired"
	}
	return "unknown"
}

// Observation is one classified opportunity for one aggregate. Times are microseconds since the
// Unix epoch, the precision every store keeps exactly.
type Observation struct {
	Key           Key
	OpportunityID string
	Class         Class
	Occurred      int64 // µs, event time of the attempt; drives windows
	Assessed      int64 // µs, time of the classification; orders re-assessments
	Seq           int64 // assessment_seq; breaks ties of Assessed
}

// Micros converts t to microseconds since the Unix epoch.
func Micros(t time.Time) int64 { return t.UnixMicro() }

// FromLive maps a live attempt to its observation.
func FromLive(a *schemas.LiveAttempt) Observation {
	cl := Unscored
	switch a.Outcome {
	case schemas.OutcomeConfirmedRepeat:
		cl = Confirmed
	case schemas.OutcomePassed:
		cl = Passed
	}
	return Observation{
		Key:           Key{Scope: a.Scope, CorrectionID: a.CorrectionID, Source: Live},
		OpportunityID: a.OpportunityID, Class: cl,
		Occurred: Micros(a.OccurredAt), Assessed: Micros(a.AssessedAt), Seq: a.AssessmentSeq,
	}
}

// FromEval maps a correction-check eval result to its observation: fail is a confirmed repeat, pass
// is passed, and error (a grader failure, never a repeat) is unscored. ok is false when the result
// is not a correction check.
func FromEval(r *schemas.EvalResult) (o Observation, ok bool) {
	if !r.IsCorrectionCheck() {
		return Observation{}, false
	}
	cl := Unscored
	switch r.Result {
	case schemas.ResultFail:
		cl = Confirmed
	case schemas.ResultPass:
		cl = Passed
	}
	return Observation{
		Key:           Key{Scope: r.Scope, CorrectionID: r.CorrectionID, Source: Evaluation},
		OpportunityID: r.OpportunityID, Class: cl,
		Occurred: Micros(r.OccurredAt), Assessed: Micros(r.AssessedAt), Seq: r.AssessmentSeq,
	}, true
}

// newer reports whether assessment (a, s) strictly follows (b, t).
func newer(a, s, b, t int64) bool { return a > b || (a == b && s > t) }

const (
	minuteUS = int64(time.Minute / time.Microsecond)
	hourUS   = int64(time.Hour / time.Microsecond)
)

// Tally is everything a snapshot needs about one aggregate at one observation time.
type Tally struct {
	All, Hour, Day, Week Counts
	First, Last          int64 // µs; meaningful when any opportunity is retained
	Version              int64
}

// Retained is the number of opportunities the aggregate currently holds.
func (t Tally) Retained() int64 { return t.All.Confirmed + t.All.Passed + t.All.Unscored }

// Snapshot renders the tally of key k as observed at the given time.
func (t Tally) Snapshot(k Key, observed time.Time) schemas.Snapshot {
	s := schemas.Snapshot{
		Aggregate:  k.Aggregate(),
		Windows:    schemas.Windows{All: t.All.Window(), Hour: t.Hour.Window(), Day: t.Day.Window(), Week: t.Week.Window()},
		ObservedAt: observed.UTC(),
		Version:    t.Version,
	}
	if t.Retained() > 0 {
		s.OpportunityWindow = &schemas.Span{First: time.UnixMicro(t.First).UTC(), Last: time.UnixMicro(t.Last).UTC()}
	}
	return s
}

// windowOf reports which rolling windows at observation time at (µs) contain an opportunity that
// occurred at occ (µs): 1h by minute buckets, 24h and 7d by hour buckets, each ending at the bucket
// that holds at.
func windowOf(occ, at int64) (hour, day, week bool) {
	m, mt := occ/minuteUS, at/minuteUS
	h, ht := occ/hourUS, at/hourUS
	return m <= mt && m >= mt-59, h <= ht && h >= ht-23, h <= ht && h >= ht-167
}

// retainedFrom returns the first retained instant when the aggregate's newest occurred_at is w:
// the start of the hour that holds w − retention. Retention is hour-granular so that the Redis
// store can expire a whole hour at once: an opportunity is kept at least retention, and less than
// an hour longer.
func retainedFrom(w, retention int64) int64 { return floorDiv(w-retention, hourUS) * hourUS }

// floorDiv is a / b rounded toward negative infinity (b > 0), as Lua's math.floor(a / b).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// Model is the pure statement of the repeat-rate rules: it holds every retained opportunity in
// memory. The zero value is not usable; call NewModel.
type Model struct {
	retention int64 // µs
	aggs      map[Key]*modelAgg
}

type modelAgg struct {
	opps      map[string]record
	watermark int64 // greatest occurred seen, µs; valid when seen
	seen      bool
	version   int64
	// minOcc is at most the smallest occurred time of any held record, so expiry scans run only
	// when something may have expired.
	minOcc int64
	// cut is the first retained instant (the start of an hour): retainedFrom the watermark, but
	// never moving back, so a retention raised between batches forgets nothing twice and revives
	// nothing (docs/semantics.md#retention).
	cut int64
}

// record is what is held of one opportunity: its winning assessment and its horizon, the greatest
// occurred time of every assessment applied while retained (never below occ). The opportunity
// counts while occ is retained; its identity is kept while horizon is (docs/semantics.md#retention).
type record struct {
	class                       Class
	occ, assessed, seq, horizon int64
}

// NewModel returns an empty model that retains opportunity identities for the given time behind
// each aggregate's newest occurred_at, rounded out to whole hours (see retainedFrom).
func NewModel(retention time.Duration) *Model {
	return &Model{retention: int64(retention / time.Microsecond), aggs: make(map[Key]*modelAgg)}
}

// ApplyBatch applies observations in order and returns each one's outcome. The version of every
// aggregate whose counts or bounds changed grows by exactly one.
func (m *Model) ApplyBatch(obs []Observation) []Outcome { return m.applyBatch(obs, 0) }

// applyBatch is ApplyBatch where a changed aggregate's version becomes the greater of its version
// plus one and at (µs), as one Redis script call per aggregate does: versions then stay above
// every version published before, even after a store lost recent writes (docs/semantics.md#versions).
func (m *Model) applyBatch(obs []Observation, at int64) []Outcome {
	out := make([]Outcome, len(obs))
	changed := make(map[*modelAgg]bool)
	for i := range obs {
		a := m.aggs[obs[i].Key]
		if a == nil {
			a = &modelAgg{opps: make(map[string]record)}
			m.aggs[obs[i].Key] = a
		}
		var ch bool
		out[i], ch = a.apply(&obs[i], m.retention)
		changed[a] = changed[a] || ch
	}
	for a, ch := range changed {
		if ch {
			a.version = max(a.version+1, at)
		}
	}
	return out
}

// advance moves the watermark to occ when it is newer and the cut up to what the watermark and
// retention give (a lowered retention moves it too), and reports whether counted opportunities
// left the retained range. Records whose horizon left it are forgotten.
func (a *modelAgg) advance(occ, retention int64) bool {
	first := !a.seen
	if first || occ > a.watermark {
		a.watermark, a.seen = occ, true
	}
	cut := retainedFrom(a.watermark, retention)
	if first {
		a.minOcc, a.cut = occ, cut
		return false
	}
	old := a.cut
	if cut <= old {
		return false
	}
	a.cut = cut
	if len(a.opps) == 0 || a.minOcc >= cut {
		return false
	}
	changed := false
	a.minOcc = a.watermark
	for id, r := range a.opps {
		if r.occ < cut && r.occ >= old {
			changed = true // its counts leave
		}
		if r.horizon < cut {
			delete(a.opps, id)
			continue
		}
		a.minOcc = min(a.minOcc, r.occ)
	}
	return changed
}

// apply applies one observation (docs/semantics.md#retention) and reports its outcome and whether
// the aggregate's counts or bounds changed.
func (a *modelAgg) apply(o *Observation, retention int64) (Outcome, bool) {
	changed := a.advance(o.Occurred, retention)
	cut := a.cut
	r, held := a.opps[o.OpportunityID]
	win := record{o.Class, o.Occurred, o.Assessed, o.Seq, o.Occurred}
	if o.Occurred < cut {
		// Changes nothing, even when newer than the held winner: whether it arrived before or
		// after the cut passed it must not matter to a redelivery (docs/semantics.md#retention).
		return Expired, changed
	}
	a.minOcc = min(a.minOcc, o.Occurred)
	switch {
	case !held:
		a.opps[o.OpportunityID] = win
		return Counted, true
	case newer(o.Assessed, o.Seq, r.assessed, r.seq):
		win.horizon = max(r.horizon, o.Occurred)
		a.opps[o.OpportunityID] = win
		return Reassessed, true
	}
	r.horizon = max(r.horizon, o.Occurred)
	a.opps[o.OpportunityID] = r
	if o.Assessed == r.assessed && o.Seq == r.seq {
		return Duplicate, changed
	}
	return Stale, changed
}

// Tally returns the state of aggregate k as observed at time at.
func (m *Model) Tally(k Key, at time.Time) Tally {
	a := m.aggs[k]
	if a == nil {
		return Tally{}
	}
	t := Tally{Version: a.version}
	atUS := Micros(at)
	cut := a.cut
	first := true
	for _, r := range a.opps {
		if r.occ < cut {
			continue // held for its identity only
		}
		t.All.add(r.class, 1)
		hour, day, week := windowOf(r.occ, atUS)
		if hour {
			t.Hour.add(r.class, 1)
		}
		if day {
			t.Day.add(r.class, 1)
		}
		if week {
			t.Week.add(r.class, 1)
		}
		if first || r.occ < t.First {
			t.First = r.occ
		}
		if first || r.occ > t.Last {
			t.Last = r.occ
		}
		first = false
	}
	return t
}

// Keys returns every aggregate the model has seen, in no particular order.
func (m *Model) Keys() []Key {
	ks := make([]Key, 0, len(m.aggs))
	for k := range m.aggs {
		ks = append(ks, k)
	}
	return ks
}

// Apply applies a batch and returns outcomes and tallies at time at, in the same shape as the Redis
// store, so the model can stand in for it where no Redis is wanted (replay, unit tests).
func (m *Model) Apply(_ context.Context, obs []Observation, at time.Time) (Applied, error) {
	outs := m.applyBatch(obs, Micros(at))
	_, keys := groupByKey(obs)
	res := Applied{Outcomes: outs, Keys: keys, Tallies: make(map[Key]Tally, len(keys))}
	for _, k := range keys {
		res.Tallies[k] = m.Tally(k, at)
	}
	return res, nil
}

// Seal is a no-op: memory loses nothing it acknowledged.
func (m *Model) Seal(context.Context, Offsets) (int64, error) { return 0, nil }

// Verify is a no-op: memory loses nothing it acknowledged.
func (m *Model) Verify(context.Context, int64, Offsets) error { return nil }

// CheckOffsets is a no-op: memory loses nothing it acknowledged.
func (m *Model) CheckOffsets(context.Context, Offsets) error { return nil }
