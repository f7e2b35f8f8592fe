package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// episodeRules is one sequential change rule, evaluated every second.
const episodeRules = `evaluation_interval: 1s
resend_interval: 1m
rules:
  - name: comeback
    kind: change
    method: sequential
    source: live
    window: 24h
    baseline: 7d
    keep_firing_for: 0s
`

// One alert episode lives through a restart of everything alerting depends on: two evaluators
// (`repeatrate alert`) on one processor, a correction's live rate stepping from 2 % to 50 %, and
// mid-episode one evaluator is killed and restarted, the Kafka broker restarted and Alertmanager
// restarted (which forgets every alert). Alertmanager holds the alert again within its resend
// interval, with the episode's start; the rate falls back and the alert resolves. Alertmanager
// knows one alert start, and its webhook's last word is the resolution; the alerts topic carries
// exactly one firing and one resolution.
func TestAlertEpisodeSurvivesRestarts(t *testing.T) {
	needScripts(t, "kafka.sh")
	amBin, err := exec.LookPath("prometheus-alertmanager")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("prometheus-alertmanager is not installed (deploy/local/alertmanager.sh installs it)")
		}
		t.Skip("prometheus-alertmanager is not installed")
	}
	s := &scenario{t: t, name: testenv.Name(t, "episode"), brokers: testenv.KafkaBrokers(t), redis: testenv.RedisAddr(t)}
	createTopics(t, s)
	t.Cleanup(func() {
		for _, p := range s.procs {
			p.Kill()
		}
		if t.Failed() {
			for _, p := range s.procs {
				t.Logf("log of %s:\n%s", p.Name, p.Tail(30))
			}
		}
	})
	hook := &amWebhook{}
	hsrv := httptest.NewServer(hook)
	defer hsrv.Close()
	am := startAlertmanager(t, amBin, hsrv.URL)
	rules := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rules, []byte(episodeRules), 0o600); err != nil {
		t.Fatal(err)
	}
	evaluator := func() *proc {
		return s.startArgs("alert", "--http-addr=", "--alert-rules="+rules, "--alertmanager-url=http://"+am.addr)
	}
	s.startArgs("run", "--http-addr=")
	a, _ := evaluator(), evaluator()

	// Six days at 2 %, then the step: pieces a second apart, so that the detector sees the
	// snapshots one by one (the first only becomes its reference).
	now := time.Now()
	ev := &testenv.LiveAttempts{Workspace: s.name, Correction: "fix-comeback"}
	ev.Add(5000, 100, now.Add(-6*24*time.Hour), now.Add(-25*time.Hour))
	s.produce(ev.Take())
	for i := range 12 {
		ev.Add(20, 10, now.Add(time.Duration(i)*time.Second), now.Add(time.Duration(i+1)*time.Second))
		s.produce(ev.Take())
		time.Sleep(time.Second)
	}
	waitUntil(t, 2*time.Minute, "Alertmanager holds the alert", func() bool { return len(am.active(t)) == 1 })
	start := am.active(t)[0]

	// Mid-episode: an evaluator dies and comes back, the broker restarts, Alertmanager restarts.
	a.Kill()
	evaluator()
	service(t, "kafka.sh", "restart")
	am.restart(t)
	waitUntil(t, 2*time.Minute, "the alert is back in the restarted Alertmanager", func() bool { return len(am.active(t)) == 1 })
	if again := am.active(t)[0]; !again.Equal(start) {
		t.Fatalf("after the restarts Alertmanager holds an alert that started %s, want the episode's start %s", again, start)
	}

	// The rate falls back: passes, a piece a second.
	for range 12 {
		at := time.Now()
		ev.Add(40, 0, at, at.Add(time.Second))
		s.produce(ev.Take())
		time.Sleep(time.Second)
	}
	waitUntil(t, 2*time.Minute, "Alertmanager's webhook says resolved", func() bool { return hook.last() == "resolved" })
	if n := len(am.active(t)); n != 0 {
		t.Fatalf("Alertmanager still holds %d active alerts after the resolution", n)
	}
	if starts := hook.starts(); len(starts) != 1 || !starts[0].Equal(start) {
		t.Fatalf("Alertmanager notified alerts starting %v, want one episode starting %s", starts, start)
	}
	firing, resolved := alertIDs(t, s)
	if len(firing) != 1 || len(resolved) != 1 {
		t.Fatalf("the alerts topic carries %d firing and %d resolved events (by id), want one each", len(firing), len(resolved))
	}
	t.Logf("one episode through an evaluator kill, a broker restart and an Alertmanager restart: Alertmanager notified %v, the alerts topic %d firing and %d resolved",
		hook.statuses(), len(firing), len(resolved))
}

// createTopics makes the scenario's topics.
func createTopics(t *testing.T, s *scenario) {
	t.Helper()
	client := &kafka.Client{Addr: kafka.TCP(s.brokers...), Timeout: 30 * time.Second, Transport: &kafka.Transport{}}
	var topics []kafka.TopicConfig
	for _, suffix := range []string{"in", "snapshots", "suites", "alerts", "dlq"} {
		topics = append(topics, kafka.TopicConfig{Topic: s.topic(suffix), NumPartitions: 1, ReplicationFactor: 1})
	}
	var err error
	for try := 0; try < 10; try++ { // a broker restarted by the previous scenario may still be settling
		if _, err = client.CreateTopics(context.Background(), &kafka.CreateTopicsRequest{Topics: topics}); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatal(err)
}

// produce writes CloudEvent lines to the scenario's input topic with `repeatrate produce`.
func (s *scenario) produce(lines []byte) {
	s.t.Helper()
	f := filepath.Join(s.t.TempDir(), "events.jsonl")
	if err := os.WriteFile(f, lines, 0o600); err != nil {
		s.t.Fatal(err)
	}
	var err error
	var out []byte
	for try := 0; try < 30; try++ { // the broker may be restarting
		if out, err = exec.Command(bin, "produce", "--brokers", strings.Join(s.brokers, ","), "--topic", s.topic("in"), "--in", f).CombinedOutput(); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
	s.t.Fatalf("produce: %v: %s", err, out)
}

// alertmanager is a Prometheus Alertmanager of the test's own, notifying a webhook.
type alertmanager struct {
	bin, dir, addr string
	proc           *proc
}

func startAlertmanager(t *testing.T, amBin, hook string) *alertmanager {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	am := &alertmanager{bin: amBin, dir: t.TempDir(), addr: addr}
	cfg := fmt.Sprintf(`route:
  receiver: hook
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 24h
receivers:
  - name: hook
    webhook_configs:
      - url: %s
        send_resolved: true
`, hook)
	if err := os.WriteFile(filepath.Join(am.dir, "alertmanager.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	am.start(t)
	t.Cleanup(func() { am.proc.Kill() })
	return am
}

func (am *alertmanager) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(am.bin, "--config.file="+filepath.Join(am.dir, "alertmanager.yml"), "--storage.path="+filepath.Join(am.dir, "data"),
		"--web.listen-address="+am.addr, "--cluster.listen-address=")
	p, err := testenv.StartProc("alertmanager", cmd)
	if err != nil {
		t.Fatal(err)
	}
	am.proc = p
	waitUntil(t, 30*time.Second, "Alertmanager ready", func() bool {
		r, err := http.Get("http://" + am.addr + "/-/ready")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
}

// restart stops Alertmanager as an operator would (SIGTERM) and starts it again on the same
// storage: it comes back knowing no alert.
func (am *alertmanager) restart(t *testing.T) {
	t.Helper()
	am.proc.Signal(syscall.SIGTERM)
	if _, exited := am.proc.Wait(30 * time.Second); !exited {
		t.Fatal("Alertmanager did not stop within 30 s of SIGTERM")
	}
	am.start(t)
}

// active returns the starts of the active alerts Alertmanager holds, to the millisecond.
func (am *alertmanager) active(t *testing.T) []time.Time {
	t.Helper()
	r, err := http.Get("http://" + am.addr + "/api/v2/alerts?active=true&silenced=false&inhibited=false")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var alerts []struct {
		StartsAt time.Time         `json:"startsAt"`
		Labels   map[string]string `json:"labels"`
	}
	if err := json.NewDecoder(r.Body).Decode(&alerts); err != nil {
		t.Fatal(err)
	}
	var out []time.Time
	for _, a := range alerts {
		if a.Labels["alertname"] == "comeback" {
			out = append(out, a.StartsAt.Truncate(time.Millisecond))
		}
	}
	return out
}

// amWebhook keeps what Alertmanager notifies.
type amWebhook struct {
	mu    sync.Mutex
	notes []amNote
}

type amNote struct {
	Status string `json:"status"`
	Alerts []struct {
		StartsAt time.Time `json:"startsAt"`
	} `json:"alerts"`
}

func (h *amWebhook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var n amNote
	if err := json.Unmarshal(b, &n); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.notes = append(h.notes, n)
	h.mu.Unlock()
}

func (h *amWebhook) last() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.notes) == 0 {
		return ""
	}
	return h.notes[len(h.notes)-1].Status
}

func (h *amWebhook) statuses() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, n := range h.notes {
		out = append(out, n.Status)
	}
	return out
}

// starts lists the distinct alert starts Alertmanager notified, to the millisecond (as its API
// gives them).
func (h *amWebhook) starts() []time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []time.Time
	for _, n := range h.notes {
		for _, a := range n.Alerts {
			if at := a.StartsAt.Truncate(time.Millisecond); !containsTime(out, at) {
				out = append(out, at)
			}
		}
	}
	return out
}

func containsTime(ts []time.Time, t time.Time) bool {
	for _, u := range ts {
		if u.Equal(t) {
			return true
		}
	}
	return false
}

// alertIDs reads the scenario's alerts topic whole and returns the ids of its firing and
// resolved events.
func alertIDs(t *testing.T, s *scenario) (firing, resolved map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(s.brokers...), Timeout: 10 * time.Second, Transport: &kafka.Transport{}}
	offs, err := client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{s.topic("alerts"): {kafka.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	end := offs.Topics[s.topic("alerts")][0].LastOffset
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: s.brokers, Topic: s.topic("alerts"), Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	firing, resolved = map[string]bool{}, map[string]bool{}
	for read := int64(0); read < end; read++ {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			ID   string `json:"id"`
			Type string `json:"type"`
		}
		if err := json.Unmarshal(m.Value, &e); err != nil {
			t.Fatal(err)
		}
		switch e.Type {
		case schemas.TypeAlertFiring:
			firing[e.ID] = true
		case schemas.TypeAlertResolved:
			resolved[e.ID] = true
		}
	}
	return firing, resolved
}

// waitUntil polls cond until it holds or the time is up.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
