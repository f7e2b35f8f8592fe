package readside

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// TestOpenAPI: every route is documented and every documented path is a route; every JSON answer
// of every route, successes and errors, on real Redis, validates against the document's schema for
// its status.
func TestOpenAPI(t *testing.T) {
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI(), &doc); err != nil || doc.OpenAPI != "3.1.0" {
		t.Fatalf("document: %v %q", err, doc.OpenAPI)
	}
	a := &api{}
	var routes []string
	for _, r := range a.apiRoutes() {
		p := strings.TrimPrefix(r.pattern, "GET ")
		routes = append(routes, p)
		if _, ok := doc.Paths[p]["get"]; !ok {
			t.Errorf("route %s is not documented", p)
		}
	}
	for _, p := range []string{IngestPath, OTLPLogsPath} {
		if _, ok := doc.Paths[p]["post"]; !ok {
			t.Errorf("route POST %s is not documented", p)
		}
	}
	routes = append(routes, IngestPath, OTLPLogsPath) // served by package ingest; its answers are checked there
	for p := range doc.Paths {
		if !slices.Contains(routes, p) {
			t.Errorf("documented path %s is no route", p)
		}
	}

	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(OpenAPI()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("mem://openapi.json", raw); err != nil {
		t.Fatal(err)
	}
	schemaOf := func(path string, status int, ctype string) *jsonschema.Schema {
		t.Helper()
		esc := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1") }
		ptr := "mem://openapi.json#/paths/" + esc(path) + "/get/responses/" + strconv.Itoa(status) + "/content/" + esc(ctype) + "/schema"
		s, err := c.Compile(ptr)
		if err != nil {
			t.Fatalf("%s %d: no schema: %v", path, status, err)
		}
		return s
	}

	client := testenv.Redis(t)
	prefix := testenv.Name(t, "openapi")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	key := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	tally := aggregator.Tally{Version: 7, All: aggregator.Counts{Confirmed: 1, Passed: 3, Unscored: 1}, Day: aggregator.Counts{Passed: 2},
		First: aggregator.Micros(now.Add(-time.Hour)), Last: aggregator.Micros(now)}
	ctx := context.Background()
	if err := rec.Publish(ctx, []schemas.Snapshot{tally.Snapshot(key, now)}); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	tallies := fakeTallies{t: map[aggregator.Key]aggregator.Tally{key: tally}}
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat, Suites: fakeSuites{}, Alerts: fakeAlerts{}}, tallies, prometheus.NewRegistry(),
		func() time.Time { return now }, zap.NewNop())
	scope := "workspace=w&model=m&run=r&checkpoint=c&artifact=a"
	for _, c := range []struct {
		path, query, token string
		status             int
	}{
		{"/v1/openapi.json", "", "", 200},
		{"/v1/snapshots", scope + "&correction_id=x", tokenA, 200},
		{"/v1/snapshots", scope + "&correction_id=nope", tokenA, 404},
		{"/v1/snapshots", scope, tokenA, 400},
		{"/v1/snapshots", scope + "&correction_id=x", tokenB, 403},
		{"/v1/snapshots", scope + "&correction_id=x", "", 401},
		{"/v1/corrections", "workspace=w", tokenA, 200},
		{"/v1/corrections", "workspace=w&limit=0", tokenA, 400},
		{"/v1/outcomes", scope, tokenA, 200},
		{"/v1/outcomes", "workspace=w", tokenA, 400},
		{"/v1/history", scope + "&correction_id=x&source=live", tokenA, 200},
		{"/v1/history", scope + "&correction_id=x&source=evaluation", tokenA, 404},
		{"/v1/suites", "workspace=w", tokenA, 200},
		{"/v1/suites/discrimination", "workspace=w&suite=s", tokenA, 200},
		{"/v1/suites/discrimination", "workspace=w&suite=nope", tokenA, 404},
		{"/v1/suites/stability", "workspace=w&suite=s", tokenA, 200},
		{"/v1/suites/cases", "workspace=w&suite=s", tokenA, 200},
		{"/v1/suites/moved", "workspace=w&suite=s&from=v1&to=v2", tokenA, 200},
		{"/v1/suites/moved", "workspace=w&suite=s&from=v1&to=v9", tokenA, 404},
		{"/v1/stream", "workspace=w&last_event_id=x", tokenA, 400},
		{"/v1/alerts", "workspace=w", tokenA, 200},
		{"/v1/alerts", "workspace=w", tokenB, 403},
		{"/v1/alerts", "workspace=w", "", 401},
		{IngestPath, "", tokenA, 405},
		// Answers of the server's own limits, on any route.
		{"/v1/snapshots", scope + "&pad=" + strings.Repeat("x", maxQueryBytes), tokenA, 414},
		{"/v1/suites", "workspace=w&pad=" + strings.Repeat("x", maxQueryBytes), tokenA, 414},
		// The badge answers errors as grey badges (its reader is an <img>).
		{"/v1/badge.svg", scope + "&correction_id=x", tokenA, 200},
		{"/v1/badge.svg", scope, tokenA, 400},
		{"/v1/badge.svg", scope + "&correction_id=x", "", 401},
		{"/v1/badge.svg", scope + "&correction_id=x", tokenB, 403},
		{"/v1/badge.svg", scope + "&correction_id=nope", tokenA, 404},
		{"/v1/badge.svg", scope + "&pad=" + strings.Repeat("x", maxQueryBytes), tokenA, 414},
	} {
		req := httptest.NewRequest(http.MethodGet, c.path+"?"+c.query, nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		rr := httptest.NewRecorder()
		h.Handler().ServeHTTP(rr, req)
		if rr.Code != c.status {
			t.Errorf("%s?%s: %d, want %d: %s", c.path, c.query, rr.Code, c.status, rr.Body)
			continue
		}
		ctype := rr.Header().Get("Content-Type")
		if ctype == "image/svg+xml" {
			// The document must declare the badge's content type for this status.
			var d map[string]any
			if err := json.Unmarshal(doc.Paths[c.path]["get"], &d); err != nil {
				t.Fatal(err)
			}
			resp, _ := d["responses"].(map[string]any)[strconv.Itoa(c.status)].(map[string]any)
			if _, ok := resp["content"].(map[string]any)[ctype]; !ok || !strings.HasPrefix(rr.Body.String(), "<svg") {
				t.Errorf("%s?%s (%d): answered %s, which the document does not declare for it", c.path, c.query, c.status, ctype)
			}
			continue
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(rr.Body.Bytes()))
		if err != nil || ctype != "application/json" {
			t.Errorf("%s?%s: %s not JSON: %v", c.path, c.query, ctype, err)
			continue
		}
		if err := schemaOf(c.path, c.status, ctype).Validate(v); err != nil {
			t.Errorf("%s?%s (%d): %v\n%s", c.path, c.query, c.status, err, rr.Body)
		}
	}
}

// fakeAlerts lists one firing and one pending alert of workspace w.
type fakeAlerts struct{}

func (fakeAlerts) CurrentAlerts(_ context.Context, ws string, _ int) ([]CurrentAlert, error) {
	if ws != "w" {
		return nil, nil
	}
	fired := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	return []CurrentAlert{
		{Rule: "high", Kind: "threshold", Subject: "a|w|m|r|c|a|x|live", Fields: map[string]string{"workspace": "w"},
			Labels: map[string]string{"severity": "page"}, Annotations: map[string]string{}, State: "firing", ActiveAt: fired, FiredAt: &fired},
		{Rule: "low", Subject: "a|w|m|r|c|a|y|live", Fields: map[string]string{"workspace": "w"},
			Labels: map[string]string{}, Annotations: map[string]string{}, State: "pending", ActiveAt: fired},
	}, nil
}
