package alert

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// alertmanagerURL finds the Alertmanager deploy/local/alertmanager.sh starts, skipping (failing
// under CI=true) when it does not answer.
func alertmanagerURL(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("REPEATRATE_TEST_ALERTMANAGER")
	if addr == "" {
		addr = "127.0.0.1:19193"
	}
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Alertmanager is required under CI=true but %s does not answer: %v", addr, err)
		}
		t.Skipf("Alertmanager not reachable at %s (deploy/local/alertmanager.sh start): %v", addr, err)
	}
	c.Close()
	return "http://" + addr
}

type gettableAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	EndsAt      time.Time         `json:"endsAt"`
	Status      struct {
		State string `json:"state"`
	} `json:"status"`
}

// amAlerts lists the alerts Alertmanager shows for alertname.
func amAlerts(t *testing.T, base, alertname string) []gettableAlert {
	t.Helper()
	resp, err := http.Get(base + "/api/v2/alerts?filter=" + url.QueryEscape(`alertname="`+alertname+`"`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []gettableAlert
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAlertmanagerEndToEnd drives an evaluator on real Redis into firing and resolved with the
// Alertmanager sink on a real Alertmanager, which must show the alert active with its labels and
// evidence, then no longer active.
func TestAlertmanagerEndToEnd(t *testing.T) {
	base := alertmanagerURL(t)
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	am := NewAlertmanager(base, time.Hour, 5*time.Second)
	store, _ := NewRedis(rdb, prefix, []string{am.Name()})
	name := testenv.Name(t, "rule")
	// The lifecycle runs two minutes behind the wall clock, so that the resolution it posts lies in
	// Alertmanager's past.
	now := time.Now().UTC().Truncate(time.Second).Add(-2 * time.Minute)
	clk := &clock{t: now}
	ev := newTestEvaluator(t, store, "rules:\n- {name: "+name+", kind: threshold, window: 24h, value: 0.1, min_scored: 20, labels: {severity: page}}\n", []Sink{am}, clk)
	ev.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, now)})
	if err := ev.Evaluate(ctx, now); err != nil {
		t.Fatal(err)
	}
	if err := ev.Deliver(ctx, am); err != nil {
		t.Fatal(err)
	}
	got := amAlerts(t, base, name)
	if len(got) != 1 {
		t.Fatalf("alertmanager shows %d alerts, want 1", len(got))
	}
	a := got[0]
	if a.Status.State != "active" || a.Labels["severity"] != "page" || a.Labels["workspace"] != "acme" ||
		a.Labels["kind"] != "threshold" || a.Annotations["evidence"] == "" {
		t.Errorf("alert %+v", a)
	}

	clk.set(now.Add(time.Minute))
	ev.Apply(Update{Snapshot: snap("live", 2, [2]int64{1, 100}, [2]int64{1, 100}, clk.now())})
	if err := ev.Evaluate(ctx, clk.now()); err != nil {
		t.Fatal(err)
	}
	if err := ev.Deliver(ctx, am); err != nil {
		t.Fatal(err)
	}
	// Resolved: endsAt is the resolution time, so Alertmanager no longer lists it as active.
	for _, a := range amAlerts(t, base, name) {
		if a.Status.State == "active" && a.EndsAt.After(time.Now()) {
			t.Errorf("still active after resolve: %+v", a)
		}
	}
}

// TestAlertmanagerRefuses: a failing Alertmanager is an error; a 4xx other than 408 and 429 is a
// refusal for good (ErrRefused), anything else an error the delivery loop retries.
func TestAlertmanagerRefuses(t *testing.T) {
	var status atomic.Int64
	srv := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad alerts", int(status.Load()))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	am := NewAlertmanager("http://"+ln.Addr().String(), time.Hour, time.Second)
	for _, tc := range []struct {
		status  int
		refused bool
	}{{400, true}, {413, true}, {422, true}, {401, false}, {403, false}, {404, false}, {408, false}, {429, false}, {500, false}, {503, false}} {
		status.Store(int64(tc.status))
		err = am.Send(context.Background(), []Notification{{ID: "x", Kind: "firing", At: t0}})
		if err == nil {
			t.Errorf("%d: no error", tc.status)
		} else if errors.Is(err, ErrRefused) != tc.refused {
			t.Errorf("%d: %v, want refused %v", tc.status, err, tc.refused)
		}
	}
}

type fakeWriter struct{ msgs []kafka.Message }

func (w *fakeWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	w.msgs = append(w.msgs, msgs...)
	return nil
}

// TestKafkaEvent: a notification becomes a structured CloudEvent of the alert type, keyed by rule
// and subject, whose id is the same for the same notification and whose data is the alert.
func TestKafkaEvent(t *testing.T) {
	w := &fakeWriter{}
	k := NewKafka(w)
	tb := NewTable()
	tb.PutSnapshot(snap("live", 1, [2]int64{150, 1000}, [2]int64{270, 7000}, t0))
	r := mustRule(t, "- {name: back, kind: change, min_increase: 0.05}")
	c := Evaluate(r, tb, t0)[0]
	e := &Evaluator{}
	n := e.notification(r, c, Record{State: StateFiring, ActiveAt: t0, FiredAt: t0}, NotifyFiring, t0, nil)
	for range 2 {
		if err := k.Send(context.Background(), []Notification{*n}); err != nil {
			t.Fatal(err)
		}
	}
	var ev [2]struct {
		ID      string        `json:"id"`
		Type    string        `json:"type"`
		Subject string        `json:"subject"`
		Data    schemas.Alert `json:"data"`
	}
	for i := range ev {
		if err := json.Unmarshal(w.msgs[i].Value, &ev[i]); err != nil {
			t.Fatal(err)
		}
	}
	if ev[0].ID != ev[1].ID || ev[0].Type != schemas.TypeAlertFiring || string(w.msgs[0].Key) != "back|a%7Cacme%7Cbot%7Cr%7Cc%7Cprod%7Cfix%7Clive" {
		t.Errorf("events %+v key %s", ev, w.msgs[0].Key)
	}
	d := ev[0].Data
	if d.State != "firing" || d.Evidence.Test == nil || d.Evidence.Test.LowerDifference <= 0.05 || len(d.Evidence.Windows) != 2 ||
		d.Evidence.Windows[1].Scored != 6000 || d.Fields["correction_id"] != "fix" {
		t.Errorf("data %+v", d)
	}
	if testing.Verbose() {
		t.Logf("%s", w.msgs[0].Value)
	}
}

// counterValue is the value of the counter name with labels in reg (0 when absent).
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] != lp.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestAlertmanagerRefusalDropped: Alertmanager answering 400 refuses those alerts for good (an
// invalid label, say). The evaluator retried them every ≤ 5 min forever, and a refused batch held
// back the valid notifications of the same record. Now the refused notification alone is dropped
// from the outbox, counted and logged once with the reason; the others are delivered. The
// receiver is a real HTTP server refusing the resolution of rule "bad".
func TestAlertmanagerRefusalDropped(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t, "alert")
	testenv.CleanPrefix(t, rdb, prefix)
	ctx := context.Background()
	var mu sync.Mutex
	var accepted []string
	refusedPosts := 0
	srv := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []postableAlert
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, a := range body {
			if a.Labels["alertname"] == "bad" && a.EndsAt.Sub(a.StartsAt) < time.Hour {
				refusedPosts++
				http.Error(w, "invalid alert: bad resolution", http.StatusBadRequest)
				return
			}
		}
		for _, a := range body {
			state := "firing"
			if a.EndsAt.Sub(a.StartsAt) < time.Hour {
				state = "resolved"
			}
			accepted = append(accepted, a.Labels["alertname"]+" "+state)
		}
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	am := NewAlertmanager("http://"+ln.Addr().String(), time.Hour, 5*time.Second)
	store, _ := NewRedis(rdb, prefix, []string{am.Name()})
	rs, err := Parse([]byte("rules:\n- {name: bad, kind: threshold, window: 24h, value: 0.1}\n- {name: good, kind: threshold, window: 24h, value: 0.1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: t0}
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.InfoLevel)
	e, err := NewEvaluator(EvaluatorConfig{Rules: rs, Lease: time.Minute}, store, []Sink{am}, clk.now, zap.New(core), NewMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	e.Apply(Update{CaughtUp: true})
	// Both rules fire, then resolve, before anything is delivered: each record's outbox holds a
	// firing and a resolution, sent as one batch.
	e.Apply(Update{Snapshot: snap("live", 1, [2]int64{30, 100}, [2]int64{30, 100}, t0)})
	if err := e.Evaluate(ctx, t0); err != nil {
		t.Fatal(err)
	}
	e.Apply(Update{Snapshot: snap("live", 2, [2]int64{1, 100}, [2]int64{1, 100}, t0.Add(time.Minute))})
	clk.set(t0.Add(time.Minute))
	if err := e.Evaluate(ctx, clk.now()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := e.Deliver(ctx, am); err != nil {
			t.Fatal(err)
		}
		clk.set(clk.now().Add(10 * time.Minute))
	}
	mu.Lock()
	slices.Sort(accepted)
	if want := []string{"bad firing", "good firing", "good resolved"}; !slices.Equal(accepted, want) {
		t.Errorf("Alertmanager accepted %v, want %v", accepted, want)
	}
	// Once in the batch, once alone: then never again.
	if refusedPosts != 2 {
		t.Errorf("the refused alert was posted %d times, want 2 (its batch, then alone)", refusedPosts)
	}
	mu.Unlock()
	if got := counterValue(t, reg, "repeatrate_alert_refused_total", map[string]string{"sink": "alertmanager", "kind": "resolved"}); got != 1 {
		t.Errorf("repeatrate_alert_refused_total{sink=alertmanager,kind=resolved} = %v, want 1", got)
	}
	if got := counterValue(t, reg, "repeatrate_alert_errors_total", map[string]string{"stage": "refused"}); got != 1 {
		t.Errorf("repeatrate_alert_errors_total{stage=refused} = %v, want 1", got)
	}
	var refusals []observer.LoggedEntry
	for _, l := range logs.All() {
		if strings.Contains(l.Message, "refused") {
			refusals = append(refusals, l)
		}
	}
	if len(refusals) != 1 || !strings.Contains(fmt.Sprint(refusals[0].ContextMap()["error"]), "400 Bad Request: invalid alert: bad resolution") {
		t.Errorf("refusal logs %v, want one with the status and the reason", refusals)
	}
	// Nothing is left to deliver: both records are resolved and gone from the index.
	if keys, err := store.Keys(ctx); err != nil || len(keys) != 0 {
		t.Errorf("index %v, %v: want empty", keys, err)
	}
}
