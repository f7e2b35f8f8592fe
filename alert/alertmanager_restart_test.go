package alert

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// fakeAlertmanager keeps what was posted in memory, as Alertmanager does, and can restart empty.
type fakeAlertmanager struct {
	mu     sync.Mutex
	active map[string]postableAlert // by alertname
}

func (f *fakeAlertmanager) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body []postableAlert
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range body {
		if a.EndsAt.Before(a.StartsAt) {
			http.Error(w, "start time must be before end time", http.StatusBadRequest)
			return
		}
		f.active[a.Labels["alertname"]] = a
	}
}

func (f *fakeAlertmanager) restart() {
	f.mu.Lock()
	f.active = map[string]postableAlert{}
	f.mu.Unlock()
}

func (f *fakeAlertmanager) get(name string) (postableAlert, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.active[name]
	return a, ok
}

// An Alertmanager that restarts forgets every alert; with the default resend interval a firing
// alert is posted again within a minute, as Prometheus re-sends (it was four hours).
func TestFiringAlertIsBackInARestartedAlertmanagerWithinAMinute(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	fake := &fakeAlertmanager{active: map[string]postableAlert{}}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	rules, err := Parse([]byte("rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: t0}
	am := NewAlertmanager(srv.URL, rules.Rules[0].ResendInterval, 5*time.Second)
	am.now = clk.now
	store, _ := NewRedis(rdb, prefix, []string{am.Name()})
	ev := newTestEvaluator(t, store, "rules:\n- {name: high, kind: threshold, window: 24h, value: 0.1, min_scored: 20}\n", []Sink{am}, clk)
	ev.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	step := func(at time.Time) {
		t.Helper()
		clk.set(at)
		if err := ev.Evaluate(ctx, at); err != nil {
			t.Fatal(err)
		}
		if err := ev.Deliver(ctx, am); err != nil {
			t.Fatal(err)
		}
	}
	step(t0)
	if _, ok := fake.get("high"); !ok {
		t.Fatal("the firing alert was not posted")
	}
	fake.restart()
	for s := 30; s <= 60; s += 30 {
		step(t0.Add(time.Duration(s) * time.Second))
	}
	a, ok := fake.get("high")
	if !ok {
		t.Fatal("a minute after Alertmanager restarted, the firing alert is still not back in it")
	}
	if now := clk.now(); !a.EndsAt.After(now) || !a.StartsAt.Equal(t0) {
		t.Errorf("re-posted alert starts %s ends %s at %s: want the episode's start and an end ahead", a.StartsAt, a.EndsAt, now)
	}
}

// A firing notification posted late (Alertmanager down longer than its validity) is valid from
// when it is sent; a resolution stamped before the firing (the resolving evaluator's clock behind
// the firing one's) still ends no earlier than it started, which Alertmanager requires.
func TestAlertmanagerTimesFromTheSend(t *testing.T) {
	am := NewAlertmanager("http://127.0.0.1:1", time.Minute, time.Second)
	fired := &Notification{At: t0, Alert: schemas.Alert{Rule: "r", FiredAt: t0}}
	sent := t0.Add(10 * time.Minute)
	if p := am.postable(fired, sent); !p.EndsAt.After(sent) {
		t.Errorf("firing queued at %s, sent at %s, ends %s: already over when posted", t0, sent, p.EndsAt)
	}
	early := t0.Add(-2 * time.Second)
	resolved := &Notification{At: early, Alert: schemas.Alert{Rule: "r", FiredAt: t0, ResolvedAt: &early}}
	if p := am.postable(resolved, sent); p.EndsAt.Before(p.StartsAt) {
		t.Errorf("resolution ends %s before the start %s: Alertmanager refuses it and the alert stays firing", p.EndsAt, p.StartsAt)
	}
}
