package sink

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

func TestHTTPOnRedis(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "http")
	testenv.CleanPrefix(t, client, prefix)
	store, err := aggregator.NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	scope := schemas.Scope{Workspace: "w&<x>", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}
	var obs []aggregator.Observation
	for i, cl := range []aggregator.Class{aggregator.Confirmed, aggregator.Passed, aggregator.Passed, aggregator.Passed, aggregator.Unscored} {
		obs = append(obs, aggregator.Observation{Key: aggregator.Key{Scope: scope, CorrectionID: "fix", Source: aggregator.Evaluation},
			OpportunityID: string(rune('a' + i)), Class: cl, Occurred: aggregator.Micros(now), Assessed: aggregator.Micros(now)})
	}
	if _, err := store.Apply(context.Background(), obs, now); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "probe_total", Help: "x"}))
	h := NewHTTP(HTTPConfig{}, store, reg, func() time.Time { return now }, zap.NewNop())
	srv := httptest.NewServer(h.srv.Handler)
	defer srv.Close()

	q := url.Values{"workspace": {scope.Workspace}, "model": {"m"}, "run": {"r"}, "checkpoint": {"c"}, "artifact": {"a"}, "correction_id": {"fix"}}
	get := func(path string) (int, string, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}

	code, _, body := get("/v1/snapshots?" + q.Encode())
	var snaps struct {
		Live, Evaluation *schemas.Snapshot
	}
	if err := json.Unmarshal([]byte(body), &snaps); code != 200 || err != nil {
		t.Fatalf("snapshots: %d %v %s", code, err, body)
	}
	if snaps.Live != nil || snaps.Evaluation == nil || snaps.Evaluation.Windows.All.Scored != 4 || snaps.Evaluation.Version != snaps.Evaluation.ObservedAt.UnixMicro() {
		t.Fatalf("snapshots = %s", body)
	}

	code, ctype, body := get("/v1/badge.svg?" + q.Encode())
	if code != 200 || ctype != "image/svg+xml" || !strings.Contains(body, "25.0% evaluation (1/4, 1 unscored)") {
		t.Fatalf("badge: %d %s %s", code, ctype, body)
	}
	q.Set("correction_id", "other")
	if _, _, body := get("/v1/badge.svg?" + q.Encode()); !strings.Contains(body, "not measured") {
		t.Fatalf("badge of an unknown correction: %s", body)
	}
	q.Del("model")
	if code, _, _ := get("/v1/snapshots?" + q.Encode()); code != http.StatusBadRequest {
		t.Fatalf("missing model: %d, want 400", code)
	}
	if code, _, _ := get("/v1/snapshots?x=" + strings.Repeat("a", maxQueryBytes)); code != http.StatusRequestURITooLong {
		t.Fatalf("long query: %d, want 414", code)
	}
	if code, _, body := get("/metrics"); code != 200 || !strings.Contains(body, "probe_total") {
		t.Fatalf("metrics: %d", code)
	}
	if code, _, _ := get("/healthz"); code != 200 {
		t.Fatalf("healthz: %d", code)
	}
	if resp, err := http.Post(srv.URL+"/v1/snapshots", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %v %v", err, resp.StatusCode)
	}
}

func TestBadgeEscapes(t *testing.T) {
	svg := badgeSVG("R", `<script>"x"</script>`, false)
	if strings.Contains(svg, "<script>") {
		t.Fatalf("unescaped text in %s", svg)
	}
}
