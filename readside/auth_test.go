package readside

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/schemas"
)

// fakeSuites is a SuiteReader that knows one suite of workspace "w".
type fakeSuites struct{}

func (fakeSuites) Read(_ context.Context, k suite.Key, _ time.Time) (*suite.Summary, error) {
	if k.Workspace != "w" || k.Suite != "s" {
		return &suite.Summary{}, nil
	}
	return &suite.Summary{Discrimination: suite.DiscSummary{VersionsSeen: 2, Latest: "v2", AlwaysPass: 1},
		Versions: []suite.VersionSummary{{Version: "v1", Runs: 1}, {Version: "v2", Runs: 1}}}, nil
}

func (fakeSuites) Cases(_ context.Context, k suite.Key) (*suite.CaseTable, error) {
	return &suite.CaseTable{Versions: []string{"v1", "v2"}, Cases: []suite.CaseRow{
		{Case: "c1", Outcomes: []suite.Outcome{suite.OutcomePass, suite.OutcomeFail}, Class: suite.ClassTooNew}}}, nil
}

func (fakeSuites) Config() suite.Config {
	c := suite.Config{}
	c.Validate()
	return c
}

// wQuery holds every parameter some route needs, naming workspace w.
func everyParam(ws string) string {
	return "workspace=" + ws + "&model=m&run=r&checkpoint=c&artifact=a&correction_id=x&source=live&suite=s&from=v1&to=v2"
}

// TestAuthEveryRoute: across two workspaces, every route but health, readiness and the OpenAPI
// document answers 401 without a token (also with a wrong one) and 403 with a token of the other
// workspace, and neither answer carries anything of the workspace asked for.
func TestAuthEveryRoute(t *testing.T) {
	live := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	tallies := fakeTallies{t: map[aggregator.Key]aggregator.Tally{live: {Version: 3, All: aggregator.Counts{Confirmed: 1, Passed: 3}}}}
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Suites: fakeSuites{}, Metrics: true, AdminTokenSHA256: auth.Hash("admin-token-000000")},
		tallies, prometheus.NewRegistry(), time.Now, zap.NewNop())
	a := &api{}
	paths := []string{"/", "/ui/outcomes", "/ui/suite"}
	for _, r := range a.apiRoutes() {
		paths = append(paths, strings.TrimPrefix(r.pattern, "GET "))
	}
	do := func(path, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path+"?"+everyParam("w"), nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, req)
		return rec
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			if path == "/v1/openapi.json" {
				if rec := do(path, ""); rec.Code != http.StatusOK {
					t.Fatalf("openapi: %d", rec.Code)
				}
				return
			}
			page := !strings.HasPrefix(path, "/v1/")
			for _, tok := range []string{"", "not-a-token"} {
				rec := do(path, tok)
				want := http.StatusUnauthorized
				if page {
					want = http.StatusSeeOther // to the login form
				}
				body := rec.Body.String()
				if page { // the redirect names the page asked for (its own query, v2 included), nothing read
					if loc := rec.Header().Get("Location"); !strings.HasPrefix(loc, "/login?next=") {
						t.Errorf("token %q: to %q, want the login form", tok, loc)
					}
					body = ""
				}
				if rec.Code != want || strings.Contains(body, "25.0") || strings.Contains(body, "v2") {
					t.Errorf("token %q: %d %s", tok, rec.Code, body)
				}
			}
			if path == "/" {
				return // the index asks for no workspace
			}
			rec := do(path, tokenB)
			if rec.Code != http.StatusForbidden || strings.Contains(rec.Body.String(), "25.0") || strings.Contains(rec.Body.String(), `"v2"`) {
				t.Errorf("other workspace's token: %d %s", rec.Code, rec.Body)
			}
			if path == "/v1/stream" {
				return // streams until cancelled; its success is TestStream's
			}
			rec = do(path, tokenA)
			if rec.Code == http.StatusUnauthorized || rec.Code == http.StatusForbidden {
				t.Errorf("own workspace: %d %s", rec.Code, rec.Body)
			}
		})
	}
	// The admin token guards /metrics; a workspace token is not enough.
	for tok, want := range map[string]int{"": 401, tokenA: 401, "admin-token-000000": 200} {
		req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("/metrics with %q: %d, want %d", tok, rec.Code, want)
		}
	}
}

// TestPublicBadge: a workspace configured public serves its badge without a token; the other
// workspace's badge still needs one.
func TestPublicBadge(t *testing.T) {
	live := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	tallies := fakeTallies{t: map[aggregator.Key]aggregator.Tally{live: {Version: 3, All: aggregator.Counts{Confirmed: 1, Passed: 3}}}}
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), PublicBadges: []string{"w"}}, tallies, prometheus.NewRegistry(), time.Now, zap.NewNop())
	for ws, want := range map[string]int{"w": 200, "other": 401} {
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/badge.svg?"+everyParam(ws), nil))
		if rec.Code != want {
			t.Errorf("badge of %s: %d, want %d", ws, rec.Code, want)
		}
	}
	rec := httptest.NewRecorder()
	h.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/snapshots?"+everyParam("w"), nil))
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("snapshots of a public-badge workspace without a token: %d", rec.Code)
	}
}

// TestRateLimit: a token gets its burst, then 429 with Retry-After; another token is unaffected.
// (The bucket alone: these requests come before their Retry-After, which early_retry_test.go holds.)
func TestRateLimit(t *testing.T) {
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), RateLimit: 1, RateBurst: 5, EarlyRetryHold: -1}, fakeTallies{}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	codes := map[int]int{}
	for range 8 {
		req := httptest.NewRequest(http.MethodGet, "/v1/snapshots?"+everyParam("w"), nil)
		req.Header.Set("Authorization", "Bearer "+tokenA)
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, req)
		codes[rec.Code]++
		if rec.Code == http.StatusTooManyRequests && rec.Header().Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	if codes[http.StatusTooManyRequests] != 3 || codes[http.StatusNotFound] != 5 {
		t.Fatalf("codes %v, want 5 answered and 3 refused", codes)
	}
	req := httptest.NewRequest(http.MethodGet, "/v1/snapshots?"+everyParam("other"), nil)
	req.Header.Set("Authorization", "Bearer "+tokenB)
	rec := httptest.NewRecorder()
	h.Handler().ServeHTTP(rec, req)
	if rec.Code == http.StatusTooManyRequests {
		t.Fatal("another token was limited")
	}
}

// TestSlowConnections opens connections as an outsider would, 1 000 that never send a request:
// the server holds at most its per-address cap of them and still answers once they are gone.
func TestSlowConnections(t *testing.T) {
	h, server := serveCapped(t, 64, 16)
	var conns []net.Conn
	for range 1000 {
		c, err := net.Dial("tcp", server)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	// Rejected connections are closed at once: a read sees EOF; held ones time out.
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(h.metrics.rejectedConns) < float64(len(conns)-16) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if open, rej := testutil.ToFloat64(h.metrics.openConns), testutil.ToFloat64(h.metrics.rejectedConns); open > 16 || rej < float64(len(conns)-16) {
		t.Fatalf("%d slow connections: %v open, %v rejected; want at most 16 open", len(conns), open, rej)
	}
	for _, c := range conns {
		c.Close()
	}
	for testutil.ToFloat64(h.metrics.openConns) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/healthz", server))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "ok\n" {
		t.Fatalf("healthz after the flood: %d %q", resp.StatusCode, b)
	}
}
