package alert

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const changedRules = "rules:\n" +
	"- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n" +
	"- {name: badge-high, kind: threshold, source: badge, window: 24h, value: 0.1, min_scored: 20}\n" +
	"- {name: silent, kind: not_measured_for, duration: 2h}\n"

// An evaluation looks at the subjects whose snapshot changed and those with a record, not at every
// subject: a rate condition false at its last evaluation cannot turn true until a new snapshot,
// and a true one has a record. Nothing is missed: a changed aggregate fires at the next
// evaluation (its live subject and its badge), records resolve on time alone when their windows
// go stale, not_measured_for fires on subjects never changed since once per evaluation interval,
// and the changes an evaluation that failed half-way had taken are evaluated at the next one.
func TestEvaluationFollowsChangedSubjects(t *testing.T) {
	store, am, clk := newAlertTest(t)
	fail := &failLoads{}
	store.rdb.AddHook(fail)
	e := newTestEvaluator(t, store, changedRules, []Sink{am}, clk)
	put := func(corr string, v int64, confirmed int64, at time.Time) {
		s := snap("live", v, [2]int64{confirmed, 100}, [2]int64{confirmed, 100}, at)
		s.Aggregate.CorrectionID = corr
		e.Apply(Update{Snapshot: s})
	}
	fired := func() map[string]int {
		out := map[string]int{}
		for _, n := range am.sent {
			if n.Kind == "firing" {
				out[n.Alert.Rule+" "+n.Alert.Fields["correction_id"]]++
			}
		}
		return out
	}
	put("a", 1, 30, t0)
	put("b", 1, 5, t0)
	put("c", 1, 5, t0)
	evaluateAndDeliver(t, e, clk, am, t0)
	if got := fired(); len(got) != 2 || got["high a"] != 1 || got["badge-high a"] != 1 {
		t.Fatalf("fired %v: want high and badge-high on a", got)
	}
	// b changes; the evaluation that takes the change fails half-way (reading the records): the
	// change is taken again by the next one.
	put("b", 2, 40, t0.Add(time.Minute))
	fail.loads.Store(1)
	if err := e.Evaluate(context.Background(), t0.Add(time.Minute)); err == nil {
		t.Fatal("the evaluation whose records could not be read succeeded")
	}
	evaluateAndDeliver(t, e, clk, am, t0.Add(2*time.Minute))
	if got := fired(); len(got) != 4 || got["high b"] != 1 || got["badge-high b"] != 1 {
		t.Fatalf("fired %v after b changed: want high and badge-high on b too", got)
	}
	// A day later, no snapshot since: the windows are stale, every alert resolves; c, b and a
	// have been silent 2 h and more, and not_measured_for fires on each, c never changed since.
	evaluateAndDeliver(t, e, clk, am, t0.Add(25*time.Hour))
	resolved := 0
	for _, n := range am.sent {
		if n.Kind == "resolved" {
			resolved++
		}
	}
	if got := fired(); resolved != 4 || got["silent a"] != 1 || got["silent b"] != 1 || got["silent c"] != 1 {
		t.Fatalf("a day later: fired %v, %d resolved: want the 4 resolved and silent on a, b and c", got, resolved)
	}
}

// failLoads fails the next loads.Load() pipelines that read records (HGETALL).
type failLoads struct{ loads atomic.Int64 }

func (f *failLoads) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f *failLoads) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f *failLoads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "hgetall" && f.loads.Add(-1) >= 0 {
			return errors.New("injected: records unreadable")
		}
		return next(ctx, cmds)
	}
}

// A rule whose source changes from badge to live (same name) resolves its badge alert: the record
// is of a subject the rule no longer selects, which no evaluation of changed subjects reaches.
func TestRuleSourceChangeResolvesTheOtherSubjectKind(t *testing.T) {
	store, am, clk := newAlertTest(t)
	first := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, source: badge, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{am}, clk)
	first.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	evaluateAndDeliver(t, first, clk, am, t0)
	second := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, source: live, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{am}, clk)
	second.Apply(Update{Snapshot: snap("live", 2, [2]int64{31, 101}, [2]int64{31, 101}, t0.Add(time.Minute))})
	for i := 1; i <= 3; i++ {
		evaluateAndDeliver(t, second, clk, am, t0.Add(time.Duration(i)*time.Minute))
	}
	var got []string
	for _, n := range am.sent {
		if n.Kind != "resend" {
			got = append(got, n.Kind+" "+n.Alert.Subject[:1])
		}
	}
	if len(got) != 3 || got[0] != "firing b" || !slices.Contains(got, "resolved b") || !slices.Contains(got, "firing a") {
		t.Fatalf("notifications %v: want the badge alert fired and resolved, the live one fired", got)
	}
}

// not_measured_for looks at every subject at least once per evaluation interval even when the
// clock's evaluations drift: one run half a second late does not push the next scan a whole
// interval away.
func TestSilenceScanKeepsItsIntervalWhenATickIsLate(t *testing.T) {
	store, am, clk := newAlertTest(t)
	e := newTestEvaluator(t, store, "rules:\n- {name: silent, kind: not_measured_for, duration: 2h}\n", []Sink{am}, clk)
	// Scored last two hours before t0 + 10 s.
	e.Apply(Update{Snapshot: snap("live", 1, [2]int64{1, 100}, [2]int64{1, 100}, t0.Add(-2*time.Hour+10*time.Second))})
	evaluateAndDeliver(t, e, clk, am, t0.Add(500*time.Millisecond)) // the tick of t0, half a second late
	evaluateAndDeliver(t, e, clk, am, t0.Add(30*time.Second))       // the next, on time
	if got := am.kinds(); len(got) != 1 || got[0] != "firing" {
		t.Fatalf("notifications %v at the tick after the silence reached 2 h: want it firing", got)
	}
}

// A clock set back looks at every subject: a window the later time found left holds data at the
// earlier one, and a condition false then may be true now.
func TestClockSetBackEvaluatesEverySubject(t *testing.T) {
	store, am, clk := newAlertTest(t)
	e := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{am}, clk)
	e.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	evaluateAndDeliver(t, e, clk, am, t0.Add(25*time.Hour)) // a clock a day ahead: the window has left
	evaluateAndDeliver(t, e, clk, am, t0.Add(time.Minute))  // set right
	if got := am.kinds(); len(got) != 1 || got[0] != "firing" {
		t.Fatalf("notifications %v once the clock was set right: want the firing (30 of 100 in the window)", got)
	}
}
