package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"gopkg.in/yaml.v3"

	"github.com/repeatrate/repeatrate/alert"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// exampleRules writes deploy/alert-rules.example.yaml with only its timing shortened for a test:
// every rule evaluated each second, and the change rule pending for forChange and resolving at
// once. Everything statistical (windows, alpha, min_increase, min_scored) is the example's.
func exampleRules(t *testing.T, forChange time.Duration) string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/alert-rules.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	doc["evaluation_interval"] = "1s"
	found := false
	for _, r := range doc["rules"].([]any) {
		r := r.(map[string]any)
		if r["name"] == "correction-regressed" {
			r["for"], r["keep_firing_for"], found = forChange.String(), "0s", true
		}
	}
	if !found {
		t.Fatal("the example rules lost correction-regressed")
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// liveAggregate is the live aggregate of l's attempts.
func liveAggregate(l *testenv.LiveAttempts) schemas.Aggregate {
	return schemas.Aggregate{Workspace: l.Workspace, Model: "bot", Run: "r1", Checkpoint: "c1", Artifact: "prod", CorrectionID: l.Correction, Source: "live"}
}

// alertLog follows the alerts topic.
type alertLog struct {
	mu  sync.Mutex
	evs []alertEvent
}

type alertEvent struct {
	ID      string        `json:"id"`
	Type    string        `json:"type"`
	Subject string        `json:"subject"`
	Data    schemas.Alert `json:"data"`
}

func (l *alertLog) add(m kafka.Message) error {
	var e alertEvent
	if err := json.Unmarshal(m.Value, &e); err != nil {
		return err
	}
	if e.Type == schemas.TypeAlertFiring || e.Type == schemas.TypeAlertResolved {
		l.mu.Lock()
		l.evs = append(l.evs, e)
		l.mu.Unlock()
	}
	return nil
}

func (l *alertLog) all() []alertEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]alertEvent(nil), l.evs...)
}

// hookLog is a webhook receiver that verifies each request's signature and keeps the events.
type hookLog struct {
	secret  []byte
	mu      sync.Mutex
	evs     []alertEvent
	refused int
}

func (h *hookLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	h.mu.Lock()
	defer h.mu.Unlock()
	err := alert.VerifySignature(h.secret, r.Header.Get(alert.HeaderTimestamp), r.Header.Get(alert.HeaderSignature), body, time.Now(), time.Minute)
	var evs []alertEvent
	if err == nil {
		err = json.Unmarshal(body, &evs)
	}
	if err != nil {
		h.refused++
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	h.evs = append(h.evs, evs...)
}

func (h *hookLog) types() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, e := range h.evs {
		out = append(out, e.Type)
	}
	return out
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAlertEndToEnd runs `run` with the example rules (timing shortened) on real Kafka and Redis:
// a correction's live rate steps from 2 % (6 000 attempts over the 6 days before) to 15 % (1 000
// in the last half hour) and fires correction-regressed once, with the evidence of exactly those
// counts, on the alerts topic and the signed webhook; the processor is stopped while the alert is
// pending and restarted, and the alert fires once; it is restarted again while firing, and
// nothing repeats; the rate falls back and the alert resolves once. A second correction with 3 of
// 5 attempts failing after 0 of 5 fires nothing throughout.
func TestAlertEndToEnd(t *testing.T) {
	testenv.KafkaBrokers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// One partition everywhere: the tiny correction's snapshots precede the step's, so every
	// evaluation that sees the step has seen them.
	cfg, kc := isolated(ctx, t, "alert", 1)
	cfg.AlertRules = exampleRules(t, 4*time.Second)
	hook := &hookLog{secret: []byte("e2e-webhook-secret-0123456789")}
	hsrv := httptest.NewServer(hook)
	defer hsrv.Close()
	cfg.AlertWebhookURL, cfg.AlertWebhookSecret = hsrv.URL, string(hook.secret)
	rdb := testenv.Redis(t)
	store, err := alert.NewRedis(rdb, cfg.Redis.KeyPrefix, []string{"kafka"})
	if err != nil {
		t.Fatal(err)
	}

	now := time.Now()
	big := &testenv.LiveAttempts{Workspace: cfg.Kafka.GroupID, Correction: "fix-step"}
	tiny := &testenv.LiveAttempts{Workspace: cfg.Kafka.GroupID, Correction: "fix-tiny"}
	tiny.Add(5, 0, now.Add(-6*24*time.Hour), now.Add(-2*24*time.Hour))
	tiny.Add(5, 3, now.Add(-30*time.Minute), now.Add(-time.Minute))
	big.Add(6000, 120, now.Add(-6*24*time.Hour), now.Add(-2*24*time.Hour))
	key := store.Key("correction-regressed", "a|"+liveAggregate(big).ID())
	state := func() alert.State {
		recs, err := store.Load(ctx, []string{key})
		if err != nil {
			t.Fatal(err)
		}
		return recs[key].State
	}
	send := func(s *testenv.LiveAttempts) {
		t.Helper()
		w := kc.writer(cfg.Kafka.InputTopics[0])
		defer w.Close()
		if _, err := produce(ctx, bytes.NewReader(s.Take()), w); err != nil {
			t.Fatal(err)
		}
	}
	type proc struct {
		stop context.CancelFunc
		done chan error
		reg  *prometheus.Registry
	}
	start := func() *proc {
		pctx, stop := context.WithCancel(ctx)
		p := &proc{stop: stop, done: make(chan error, 1), reg: prometheus.NewRegistry()}
		go func() {
			p.done <- runProcessorWith(pctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), p.reg)
		}()
		return p
	}
	halt := func(p *proc) {
		t.Helper()
		p.stop()
		select {
		case err := <-p.done:
			if err != nil {
				t.Fatalf("run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("run did not stop within 30s")
		}
	}
	log := &alertLog{}
	tctx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	go tail(tctx, kc, cfg.Kafka.AlertsTopic, time.Hour, log.add)

	send(tiny)
	send(big)
	p := start()
	big.Add(1000, 150, now.Add(-30*time.Minute), now.Add(-time.Minute))
	send(big)

	// (c) Stopped between pending and firing.
	waitFor(t, 60*time.Second, "correction-regressed pending", func() bool { return state() == alert.StatePending })
	halt(p)
	if s := state(); s != alert.StatePending {
		t.Fatalf("after the stop the alert is %s, want pending (it fired before the stop: the test proves nothing)", s)
	}
	if evs := log.all(); len(evs) != 0 {
		t.Fatalf("alerts published while pending: %+v", evs)
	}
	p = start()
	waitFor(t, 60*time.Second, "one firing on the alerts topic", func() bool { return len(log.all()) >= 1 })
	waitFor(t, 30*time.Second, "the webhook's firing", func() bool { return len(hook.types()) >= 1 })

	// Restarted while firing: the new evaluator must not resolve it before it has read the
	// snapshot topic again. Wait for it to have evaluated after catching up.
	halt(p)
	p = start()
	waitFor(t, 60*time.Second, "evaluations after the restart", func() bool { return evaluations(p.reg) >= 3 })
	if s := state(); s != alert.StateFiring {
		t.Fatalf("after a restart the alert is %s, want firing", s)
	}

	// The rate falls back: 1 000 more attempts at 2 %, in the last hour so that they dilute the
	// 1h window too (correction-regressed-fast: 170/2000 against nothing before it).
	big.Add(1000, 20, now.Add(-50*time.Minute), now.Add(-2*time.Minute))
	send(big)
	waitFor(t, 60*time.Second, "the resolution on the alerts topic", func() bool { return len(log.all()) >= 2 })
	waitFor(t, 30*time.Second, "the webhook's resolution", func() bool { return len(hook.types()) >= 2 })
	// A few more evaluations, so that anything else that would fire has had the chance.
	seen := evaluations(p.reg)
	waitFor(t, 30*time.Second, "three more evaluations", func() bool { return evaluations(p.reg) >= seen+3 })
	halt(p)
	stopTail()

	evs := log.all()
	if len(evs) != 2 || evs[0].Type != schemas.TypeAlertFiring || evs[1].Type != schemas.TypeAlertResolved {
		t.Fatalf("alerts topic: %d events %+v, want one firing then one resolved", len(evs), evs)
	}
	if got := hook.types(); len(got) != 2 || got[0] != schemas.TypeAlertFiring || got[1] != schemas.TypeAlertResolved || hook.refused != 0 {
		t.Errorf("webhook: %v (refused %d), want the firing and the resolution", got, hook.refused)
	}
	fire, res := evs[0].Data, evs[1].Data
	for _, e := range evs {
		if e.Data.Rule != "correction-regressed" || e.Data.Fields["correction_id"] != "fix-step" || e.Data.Labels["severity"] != "page" {
			t.Errorf("%s is not correction-regressed on fix-step: %+v", e.Type, e.Data)
		}
	}
	if hook.evs[0].ID != evs[0].ID {
		t.Errorf("webhook id %s, alerts topic id %s", hook.evs[0].ID, evs[0].ID)
	}
	ev := fire.Evidence
	if len(ev.Windows) != 2 || ev.Test == nil {
		t.Fatalf("firing evidence %+v", ev)
	}
	recent, base := ev.Windows[0], ev.Windows[1]
	if recent.Name != "24h" || recent.ConfirmedRepeats != 150 || recent.Scored != 1000 ||
		base.Name != "7d-24h" || base.ConfirmedRepeats != 120 || base.Scored != 6000 {
		t.Errorf("firing windows %+v %+v, want 24h 150/1000 and 7d-24h 120/6000", recent, base)
	}
	want := alert.ChangeTest(alert.Counts{Confirmed: 150, Scored: 1000}, alert.Counts{Confirmed: 120, Scored: 6000}, 0.05, time.Hour, 30*24*time.Hour, 0.05)
	if tst := ev.Test; tst.Method != alert.ChangeMethod || tst.Alpha != 0.05 || tst.MinIncrease != 0.05 ||
		tst.LowerDifference != want.LowerDifference || tst.LowerDifference < 0.05 || tst.FisherPOneLook > 1e-20 {
		t.Errorf("firing test %+v, want lower difference %v", tst, want.LowerDifference)
	}
	if res.ResolvedAt == nil || !res.FiredAt.Equal(fire.FiredAt) || res.Evidence.Windows[0].Scored != 2000 ||
		res.Evidence.Windows[0].ConfirmedRepeats != 170 {
		t.Errorf("resolution %+v", res)
	}
	if testing.Verbose() {
		b, _ := json.Marshal(evs[0])
		t.Logf("firing event as published: %s", b)
	}
}

// evaluations reads repeatrate_alert_evaluations_total, every trigger summed.
func evaluations(reg prometheus.Gatherer) int {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() == "repeatrate_alert_evaluations_total" {
			for _, m := range mf.GetMetric() {
				n += int(m.GetCounter().GetValue())
			}
		}
	}
	return n
}
