package alert

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// TestRemovedRuleResolves: a rule taken out of the rules file across a restart while its alert
// fires must resolve that alert (with the labels it fired with, so Alertmanager matches it), not
// leave it firing forever in Redis with no resolved notification on any sink.
func TestRemovedRuleResolves(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	kafka, am := &recordingSink{name: "kafka"}, &recordingSink{name: "am"}
	clk := &clock{t: t0}
	store, _ := NewRedis(rdb, prefix, []string{"kafka", "am"})
	before := "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20, labels: {severity: page}}\n" +
		"- {name: other, kind: threshold, window: 24h, value: 0.9, min_scored: 20}\n"
	after := "rules:\n- {name: other, kind: threshold, window: 24h, value: 0.9, min_scored: 20}\n"
	high := snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)

	first := newTestEvaluator(t, store, before, []Sink{kafka, am}, clk)
	first.Apply(Update{Snapshot: high})
	if err := first.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	for _, s := range []Sink{kafka, am} {
		if err := first.Deliver(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	second := newTestEvaluator(t, store, after, []Sink{kafka, am}, clk)
	second.Apply(Update{Snapshot: high})
	clk.set(t0.Add(time.Minute))
	for range 2 {
		if err := second.Evaluate(ctx, clk.now()); err != nil {
			t.Fatal(err)
		}
		for _, s := range []Sink{kafka, am} {
			if err := second.Deliver(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := kafka.kinds(); len(got) != 2 || got[1] != "resolved" {
		t.Fatalf("kafka got %v, want [firing resolved]", got)
	}
	if got := am.kinds(); len(got) != 2 || got[1] != "resolved" {
		t.Fatalf("alertmanager got %v, want [firing resolved]", got)
	}
	res := am.sent[1].Alert
	if res.Kind != "threshold" || res.Labels["severity"] != "page" || res.Rule != "high" || res.FiredAt != am.sent[0].Alert.FiredAt {
		t.Errorf("resolved alert %+v, want the firing one's kind, labels and episode", res)
	}
	if keys, err := store.Keys(ctx); err != nil || len(keys) != 0 {
		t.Errorf("index %v, %v: want empty once resolved and delivered", keys, err)
	}
}

// TestChangedRuleResolvesTheFiredAlert: a rule whose labels or kind changed across a restart
// while its alert fires resolves it under the labels and kind it fired with: Alertmanager knows
// an alert by its labels (kind among them), and a resolution under others would leave the old
// alert firing there.
func TestChangedRuleResolvesTheFiredAlert(t *testing.T) {
	const fired = "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20, labels: {severity: page}}\n"
	tests := []struct {
		name  string
		after string // the rule as the restarted evaluator has it
	}{
		{"labels", "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20, labels: {severity: ticket}}\n"},
		{"kind", "rules:\n- {name: high, kind: change, window: 24h, baseline: 7d, min_scored: 20, labels: {severity: page}}\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rdb := testenv.Redis(t)
			prefix := testenv.Name(t, "alert")
			testenv.CleanPrefix(t, rdb, prefix)
			ctx := context.Background()
			am := &recordingSink{name: "am"}
			clk := &clock{t: t0}
			store, _ := NewRedis(rdb, prefix, []string{"am"})
			first := newTestEvaluator(t, store, fired, []Sink{am}, clk)
			first.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
			if err := first.Evaluate(ctx, t0); err != nil {
				t.Fatal(err)
			}
			second := newTestEvaluator(t, store, tc.after, []Sink{am}, clk)
			second.Apply(Update{Snapshot: snap("live", 2, [2]int64{1, 100}, [2]int64{1, 100}, t0.Add(time.Hour))})
			clk.set(t0.Add(time.Hour))
			if err := second.Evaluate(ctx, clk.now()); err != nil {
				t.Fatal(err)
			}
			if err := second.Deliver(ctx, am); err != nil {
				t.Fatal(err)
			}
			if got := am.kinds(); len(got) != 2 || got[1] != "resolved" {
				t.Fatalf("alertmanager got %v, want [firing resolved]", got)
			}
			if a := am.sent[1].Alert; a.Labels["severity"] != "page" || a.Kind != "threshold" {
				t.Errorf("resolved with severity %q and kind %q, fired with page and threshold", a.Labels["severity"], a.Kind)
			}
		})
	}
}

// TestChangeEvidenceMalformedCounts: a snapshot whose counts are impossible (more confirmed than
// scored, a longer window smaller than a shorter one) must neither fire a change alert nor put a
// NaN or infinity in its evidence.
func TestChangeEvidenceMalformedCounts(t *testing.T) {
	r := mustRule(t, "- {name: c, kind: change, window: 24h, baseline: 7d, min_scored: 20}\n")
	for _, tc := range []struct {
		name      string
		day, week [2]int64
	}{
		{"confirmed above scored", [2]int64{50, 40}, [2]int64{60, 400}},
		{"week below day", [2]int64{30, 100}, [2]int64{10, 50}},
		{"week confirmed below day", [2]int64{30, 100}, [2]int64{10, 500}},
		{"negative", [2]int64{-5, 100}, [2]int64{-5, 400}},
	} {
		s := snap("live", 1, tc.day, tc.week, t0)
		tab := NewTable()
		tab.PutSnapshot(s)
		for _, c := range Evaluate(r, tab, t0) {
			if c.Active {
				t.Errorf("%s: fires on impossible counts: %+v", tc.name, c.Evidence)
			}
			if _, err := json.Marshal(c.Evidence); err != nil {
				t.Errorf("%s: evidence does not encode: %v", tc.name, err)
			}
		}
	}
}

// TestStatisticsHugeCounts: the statistics stay finite and fast at counts far beyond a loop over
// every success (a 7d window of a busy stream), and Fisher's tail matches its normal approximation.
func TestStatisticsHugeCounts(t *testing.T) {
	a := Counts{Confirmed: 2_000_000_000, Scored: 100_000_000_000}
	b := Counts{Confirmed: 12_000_000_000, Scored: 600_000_000_000}
	p := FisherGreater(a, b)
	if math.IsNaN(p) || p < 0.45 || p > 0.55 {
		t.Errorf("FisherGreater at equal rates and huge counts = %v, want about 0.5", p)
	}
	lo, hi := ConfidenceSequence(a, 0.05/720/2)
	if !(lo > 0.0199 && lo < 0.02 && hi > 0.02 && hi < 0.0201) {
		t.Errorf("confidence sequence at 2e9/1e11 = [%v, %v]", lo, hi)
	}
}

// fisherDirect is Fisher's one-sided tail summed term by term, the reference for small counts.
func fisherDirect(a, b Counts) float64 {
	n1, n2, k := a.Scored, b.Scored, a.Confirmed+b.Confirmed
	lch := func(n, r int64) float64 {
		x, _ := math.Lgamma(float64(n + 1))
		y, _ := math.Lgamma(float64(r + 1))
		z, _ := math.Lgamma(float64(n - r + 1))
		return x - y - z
	}
	p := 0.0
	for x := a.Confirmed; x <= min(k, n1); x++ {
		if k-x <= n2 {
			p += math.Exp(lch(n1, x) + lch(n2, k-x) - lch(n1+n2, k))
		}
	}
	return math.Min(1, p)
}

// TestFisherGreaterAgreesWithDirectSum checks the tail summation from the largest term against
// the term-by-term sum over a grid of small tables, including the edges of the support.
func TestFisherGreaterAgreesWithDirectSum(t *testing.T) {
	for n1 := int64(1); n1 <= 30; n1 += 3 {
		for n2 := int64(1); n2 <= 40; n2 += 7 {
			for x1 := int64(0); x1 <= n1; x1++ {
				for x2 := int64(0); x2 <= n2; x2 += 2 {
					a, b := Counts{x1, n1}, Counts{x2, n2}
					got, want := FisherGreater(a, b), fisherDirect(a, b)
					if math.Abs(got-want) > 1e-9*math.Max(1, want) && math.Abs(got-want) > 1e-12 {
						t.Fatalf("FisherGreater(%v, %v) = %v, direct sum %v", a, b, got, want)
					}
				}
			}
		}
	}
}

// TestStaleWindowsEmpty: an aggregate that stopped receiving events (silent, or dropped as idle)
// keeps its last snapshot in the compacted topic; once the clock is past a rolling window's
// length that window holds nothing, so a threshold or change alert on it resolves instead of
// firing forever on data that left the window.
func TestStaleWindowsEmpty(t *testing.T) {
	s := snap("live", 1, [2]int64{30, 100}, [2]int64{30, 400}, t0.Add(30*time.Minute))
	s.Windows.Hour = win(30, 100)
	tab := NewTable()
	tab.PutSnapshot(s)
	for _, tc := range []struct {
		rule   string
		at     time.Duration // after t0 (the snapshot is at t0+30m)
		active bool
	}{
		{"{name: r, kind: threshold, window: 24h, value: 0.1}", time.Hour, true},
		{"{name: r, kind: threshold, window: 24h, value: 0.1}", 23*time.Hour + 59*time.Minute, true},
		{"{name: r, kind: threshold, window: 24h, value: 0.1}", 24 * time.Hour, false},
		{"{name: r, kind: threshold, window: 1h, value: 0.1}", 60 * time.Minute, true},
		{"{name: r, kind: threshold, window: 1h, value: 0.1}", 90 * time.Minute, false},
		{"{name: r, kind: threshold, window: 7d, value: 0.05}", 167 * time.Hour, true},
		{"{name: r, kind: threshold, window: 7d, value: 0.05}", 168 * time.Hour, false},
		{"{name: r, kind: threshold, window: all, value: 0.05}", 1000 * time.Hour, true},
		{"{name: r, kind: change, window: 24h, baseline: 7d, min_scored: 20}", time.Hour, true},
		{"{name: r, kind: change, window: 24h, baseline: 7d, min_scored: 20}", 25 * time.Hour, false},
	} {
		r := mustRule(t, "- "+tc.rule+"\n")
		cs := Evaluate(r, tab, t0.Add(tc.at))
		if len(cs) != 1 || cs[0].Active != tc.active {
			t.Errorf("%s at snapshot+%s: %+v, want active %v", tc.rule, tc.at-30*time.Minute, cs, tc.active)
		}
	}
}

// TestSinksRefuseRedirects: a receiver that answers a POST with a redirect has not accepted the
// alerts. Go's client would follow a 302 with a GET (dropping the body) and take the 200 of that
// GET for a delivery; the sinks must count it a failure and retry.
func TestSinksRefuseRedirects(t *testing.T) {
	var posts atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/moved" {
			w.WriteHeader(http.StatusOK)
			return
		}
		posts.Add(1)
		http.Redirect(w, r, "/moved", http.StatusFound)
	}))
	defer srv.Close()
	note := []Notification{{ID: "x", Kind: "firing", At: t0, Alert: testAlert()}}
	wh, err := NewWebhook(srv.URL+"/hook", []byte("0123456789abcdef"), time.Second, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []Sink{wh, NewAlertmanager(srv.URL, time.Hour, time.Second)} {
		if err := s.Send(context.Background(), note); err == nil {
			t.Errorf("%s: a redirect counted as delivered", s.Name())
		}
	}
	if posts.Load() != 2 {
		t.Errorf("%d posts, want 2", posts.Load())
	}
}

func testAlert() schemas.Alert {
	return schemas.Alert{Rule: "r", Kind: "threshold", Subject: "a|x", Fields: map[string]string{}, Labels: map[string]string{},
		Annotations: map[string]string{}, State: "firing", ActiveAt: t0, FiredAt: t0}
}

// slowSink takes 40 s of the shared clock per send and records when each send started.
type slowSink struct {
	clk    *clock
	starts []time.Time
}

func (s *slowSink) Name() string      { return "kafka" }
func (s *slowSink) Takes(Notify) bool { return true }
func (s *slowSink) Send(context.Context, []Notification) error {
	s.starts = append(s.starts, s.clk.now())
	s.clk.set(s.clk.now().Add(40 * time.Second))
	return nil
}

// TestDeliverStaysWithinLease: a sender works through the records it claimed one after another;
// a slow sink must not make it send one whose lease has run out, which another evaluator may
// already have claimed and sent (a duplicate). The records it did not reach wait for the lease.
func TestDeliverStaysWithinLease(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	clk := &clock{t: t0}
	slow := &slowSink{clk: clk}
	store, _ := NewRedis(rdb, prefix, []string{"kafka"})
	e := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{slow}, clk)
	for i := range 3 {
		s := snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)
		s.Aggregate.CorrectionID = fmt.Sprint("fix-", i)
		e.Apply(Update{Snapshot: s})
	}
	if err := e.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	if err := e.Deliver(ctx, slow); err != nil {
		t.Fatal(err)
	}
	for _, s := range slow.starts {
		if s.Sub(t0) >= time.Minute {
			t.Errorf("a send started %s after the claim, past its 1m lease", s.Sub(t0))
		}
	}
	// The rest goes out once its lease is over, each record once.
	clk.set(t0.Add(2 * time.Minute))
	for range 3 {
		if err := e.Deliver(ctx, slow); err != nil {
			t.Fatal(err)
		}
		clk.set(clk.now().Add(2 * time.Minute))
	}
	if len(slow.starts) != 3 {
		t.Errorf("%d sends, want 3 (one per record)", len(slow.starts))
	}
}

// TestOutboxKeysApart: a subject key ends with a user-chosen part (a case id, a version, a
// correction id) that may contain ':'. A case named "x:ob:kafka" must not have the record key of
// case "x"'s outbox (a hash where a list is, WRONGTYPE, a lost notification): both fire, once.
func TestOutboxKeysApart(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	kafka := &recordingSink{name: "kafka"}
	clk := &clock{t: t0}
	store, _ := NewRedis(rdb, prefix, []string{"kafka"})
	e := newTestEvaluator(t, store, "rules:\n- {name: revived, kind: revived_regression}\n", []Sink{kafka}, clk)
	for _, id := range []string{"x:ob:kafka", "x"} {
		e.Apply(Update{Revived: &schemas.CaseRevived{Workspace: "acme", Suite: "s", CaseID: id, Version: "v1", Regression: true}})
		if err := e.Evaluate(ctx, clk.now()); err != nil {
			t.Errorf("case %q: %v", id, err)
		}
	}
	if err := e.Deliver(ctx, kafka); err != nil {
		t.Fatal(err)
	}
	if got := kafka.kinds(); len(got) != 2 {
		t.Errorf("delivered %v, want a firing for each case", got)
	}
}
