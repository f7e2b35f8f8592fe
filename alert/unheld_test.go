package alert

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// Two evaluators that see the world at different moments share the lifecycles in Redis: B has
// not read what A has (lag, a partition it has not listed, a case-revived event that expired from
// the alerts topic before B started). B must not take "not held" for "gone": one unbroken
// condition gives one firing and no resolution, however the two interleave, and the alert
// resolves once a record both read the same way says so.
func TestEvaluatorsThatHoldDifferentSubjectsDoNotFlap(t *testing.T) {
	revived := &schemas.CaseRevived{Workspace: "acme", Suite: "s", CaseID: "c1", Version: "v9", Regression: true}
	listing := func(cases ...string) *schemas.SuiteDiscrimination {
		return &schemas.SuiteDiscrimination{Workspace: "acme", Suite: "s", Revived: cases, RevivedTotal: len(cases), ObservedAt: t0}
	}
	tests := []struct {
		name  string
		rules string
		// a is what evaluator A holds; b what B holds; end is the record, read by both, after
		// which the alert must resolve (nil: it keeps firing).
		a, b []Update
		end  []Update
	}{
		{
			name:  "an aggregate B has not read yet",
			rules: "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n",
			a:     []Update{{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)}},
			end:   []Update{{Snapshot: snap("live", 2, [2]int64{1, 100}, [2]int64{1, 100}, t0.Add(time.Minute))}},
		},
		{
			name:  "a revived case whose event B never read, its suite still listing it",
			rules: "rules:\n- {name: back, kind: revived_regression}\n",
			a:     []Update{{Revived: revived}, {Discrimination: listing("c1")}},
			b:     []Update{{Discrimination: listing("c1")}},
			end:   []Update{{Discrimination: &schemas.SuiteDiscrimination{Workspace: "acme", Suite: "s", Revived: []string{}, ObservedAt: t0.Add(time.Minute)}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rdb := testenv.Redis(t)
			prefix := testenv.Name(t, "alert")
			testenv.CleanPrefix(t, rdb, prefix)
			am := &recordingSink{name: "am"}
			clk := &clock{t: t0}
			store, _ := NewRedis(rdb, prefix, []string{"am"})
			a := newTestEvaluator(t, store, tc.rules, []Sink{am}, clk)
			b := newTestEvaluator(t, store, tc.rules, []Sink{am}, clk)
			for _, u := range tc.a {
				a.Apply(u)
			}
			for _, u := range tc.b {
				b.Apply(u)
			}
			step := func(e *Evaluator, at time.Time) { evaluateAndDeliver(t, e, clk, am, at) }
			for i, e := range []*Evaluator{a, b, b, a, b, a, a, b} {
				step(e, t0.Add(time.Duration(i)*20*time.Second))
			}
			if got := firingResolved(am.kinds()); len(got) != 1 || got[0] != "firing" {
				t.Fatalf("notifications %v while A holds the subject and B does not: want one firing", got)
			}
			for _, e := range []*Evaluator{a, b} {
				for _, u := range tc.end {
					e.Apply(u)
				}
			}
			step(b, t0.Add(5*time.Minute))
			step(a, t0.Add(5*time.Minute+20*time.Second))
			if got := firingResolved(am.kinds()); len(got) != 2 || got[1] != "resolved" {
				t.Fatalf("notifications %v after the record both read: want [firing resolved]", got)
			}
		})
	}
}

// firingResolved drops resends from kinds.
func firingResolved(kinds []string) []string {
	var out []string
	for _, k := range kinds {
		if k != "resend" {
			out = append(out, k)
		}
	}
	return out
}

// A firing alert whose rule no longer selects its subject (a matcher now excludes it, or the
// rule's kind changed) resolves even on evaluators that do not hold the subject: the rules are
// evidence every evaluator reads alike. Here the case-revived event expired before the
// evaluators restarted with the new rules, while the suite still lists the case.
func TestRuleThatNoLongerSelectsAnUnheldSubjectResolvesIt(t *testing.T) {
	for _, newRules := range []string{
		"rules:\n- {name: back, kind: revived_regression, matchers: ['workspace=\"other\"']}\n",
		"rules:\n- {name: back, kind: achievable_range_below, value: 0.5}\n",
	} {
		t.Run(newRules, func(t *testing.T) {
			rdb := testenv.Redis(t)
			prefix := testenv.Name(t, "alert")
			testenv.CleanPrefix(t, rdb, prefix)
			am := &recordingSink{name: "am"}
			clk := &clock{t: t0}
			store, _ := NewRedis(rdb, prefix, []string{"am"})
			disc := &schemas.SuiteDiscrimination{Workspace: "acme", Suite: "s", Revived: []string{"c1"}, RevivedTotal: 1, ObservedAt: t0}
			a := newTestEvaluator(t, store, "rules:\n- {name: back, kind: revived_regression}\n", []Sink{am}, clk)
			a.Apply(Update{Revived: &schemas.CaseRevived{Workspace: "acme", Suite: "s", CaseID: "c1", Version: "v9", Regression: true}})
			a.Apply(Update{Discrimination: disc})
			step := func(e *Evaluator, at time.Time) { evaluateAndDeliver(t, e, clk, am, at) }
			step(a, t0)
			b := newTestEvaluator(t, store, newRules, []Sink{am}, clk)
			b.Apply(Update{Discrimination: disc})
			step(b, t0.Add(time.Hour))
			if got := firingResolved(am.kinds()); len(got) != 2 || got[1] != "resolved" {
				t.Fatalf("notifications %v: the rule no longer selects the case, want [firing resolved]", got)
			}
			if k := am.sent[len(am.sent)-1].Alert.Kind; k != "revived_regression" {
				t.Errorf("resolved with kind %q, fired with revived_regression", k)
			}
		})
	}
}

// The read side's /v1/alerts lists a workspace's current alerts from the store every evaluator
// writes: a firing alert with the kind and labels it fired with, nothing of another workspace,
// and a resolved one, delivered and at rest, for the day its record lingers.
func TestCurrentAlertsOfAWorkspace(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	am := &recordingSink{name: "am"}
	clk := &clock{t: t0}
	store, _ := NewRedis(rdb, prefix, []string{"am"})
	ev := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20, labels: {severity: page}}\n", []Sink{am}, clk)
	ev.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	if err := ev.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	reader, _ := NewRedis(rdb, prefix, []string{"read"})
	got, err := reader.CurrentAlerts(ctx, "acme", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].State != "firing" || got[0].Kind != "threshold" || got[0].Labels["severity"] != "page" ||
		got[0].FiredAt == nil || !got[0].FiredAt.Equal(t0) || got[0].Fields["correction_id"] != "fix" {
		t.Fatalf("current alerts of acme: %+v", got)
	}
	// With the evidence it fired on, as its firing notification carried it (pages show it).
	if e := got[0].Evidence; e == nil || len(e.Windows) != 1 || e.Windows[0].ConfirmedRepeats != 30 || e.Windows[0].Scored != 100 ||
		e.Threshold == nil || *e.Threshold != 0.1 || !e.EvaluatedAt.Equal(t0) {
		t.Fatalf("current alert's evidence: %+v", got[0].Evidence)
	}
	if other, err := reader.CurrentAlerts(ctx, "beta", 10); err != nil || len(other) != 0 {
		t.Fatalf("current alerts of beta: %+v %v", other, err)
	}
	ev.Apply(Update{Snapshot: snap("live", 2, [2]int64{1, 100}, [2]int64{1, 100}, t0.Add(time.Hour))})
	clk.set(t0.Add(time.Hour))
	if err := ev.Evaluate(ctx, clk.now()); err != nil {
		t.Fatal(err)
	}
	if err := ev.Deliver(ctx, am); err != nil {
		t.Fatal(err)
	}
	// Delivered and at rest, the resolved alert stays listed for the day its record lingers.
	reader.now = clk.now
	got, err = reader.CurrentAlerts(ctx, "acme", 10)
	if err != nil || len(got) != 1 || got[0].State != "resolved" || got[0].ResolvedAt == nil || !got[0].ResolvedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("after the resolution was delivered: %+v %v", got, err)
	}
	clk.set(t0.Add(26 * time.Hour))
	if got, err := reader.CurrentAlerts(ctx, "acme", 10); err != nil || len(got) != 0 {
		t.Fatalf("a day after the resolution: %+v %v", got, err)
	}
}

// evaluateAndDeliver sets the clock to at, evaluates e and delivers its outbox to am.
func evaluateAndDeliver(t *testing.T, e *Evaluator, clk *clock, am Sink, at time.Time) {
	t.Helper()
	clk.set(at)
	if err := e.Evaluate(context.Background(), at); err != nil {
		t.Fatal(err)
	}
	if err := e.Deliver(context.Background(), am); err != nil {
		t.Fatal(err)
	}
}

// hgetalls counts the records a client reads (HGETALL, alone or in pipelines).
type hgetalls struct{ n atomic.Int64 }

func (h *hgetalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *hgetalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hgetall" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *hgetalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "hgetall" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A workspace's current alerts cost the read side its own records only: with many alerts firing
// in acme (workspace names chosen to need escaping), listing beta's reads none of them, and
// listing acme's reads each of acme's once. The read side charges a token's reads by the Redis
// commands they send, so another tenant's alerts must not be read on its behalf.
func TestCurrentAlertsReadOnlyTheirWorkspace(t *testing.T) {
	rdb := testenv.OwnRedis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	store, _ := NewRedis(rdb, prefix, []string{"am"})
	clk := &clock{t: t0}
	ev := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{&recordingSink{name: "am"}}, clk)
	for i := range 40 {
		s := snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)
		s.Aggregate.CorrectionID = fmt.Sprintf("fix-%d", i)
		if i%2 == 1 {
			s.Aggregate.Workspace = "beta|x" // a workspace whose name must be escaped
		}
		ev.Apply(Update{Snapshot: s})
	}
	if err := ev.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	count := &hgetalls{}
	rdb.AddHook(count)
	reader, _ := NewRedis(rdb, prefix, []string{"read"})
	for _, c := range []struct {
		ws   string
		want int
	}{{"acme", 20}, {"beta|x", 20}, {"beta", 0}, {"acm", 0}} {
		before := count.n.Load()
		got, err := reader.CurrentAlerts(ctx, c.ws, 100)
		if err != nil || len(got) != c.want {
			t.Fatalf("alerts of %q: %d (%v), want %d", c.ws, len(got), err, c.want)
		}
		if read := count.n.Load() - before; read != int64(c.want) {
			t.Errorf("listing %q's %d alerts read %d records", c.ws, c.want, read)
		}
	}
}
