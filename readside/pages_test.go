package readside

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// TestPages renders the outcomes page (both sources side by side, one not measured) and a suite
// page from known state on real Redis, signing in through the login form's cookie.
func TestPages(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "pages")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	live := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	eval := live
	eval.Source = aggregator.Evaluation
	lt := aggregator.Tally{Version: 7, All: aggregator.Counts{Confirmed: 4, Passed: 16, Unscored: 3}}
	et := aggregator.Tally{Version: 5, All: aggregator.Counts{Unscored: 2}}
	ctx := context.Background()
	if err := rec.Publish(ctx, []schemas.Snapshot{lt.Snapshot(live, now), et.Snapshot(eval, now)}); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat, Suites: fakeSuites{}},
		fakeTallies{t: map[aggregator.Key]aggregator.Tally{live: lt, eval: et}}, prometheus.NewRegistry(),
		func() time.Time { return now }, zap.NewNop())
	login := httptest.NewRecorder()
	lreq := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader("token="+tokenA))
	lreq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	h.Handler().ServeHTTP(login, lreq)
	cookies := login.Result().Cookies()
	if login.Code != http.StatusSeeOther || len(cookies) != 1 || !cookies[0].HttpOnly {
		t.Fatalf("login: %d %v", login.Code, cookies)
	}
	get := func(path string) string {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.AddCookie(cookies[0])
		rr := httptest.NewRecorder()
		h.Handler().ServeHTTP(rr, req)
		if rr.Code != 200 {
			t.Fatalf("%s: %d %s", path, rr.Code, rr.Body)
		}
		return rr.Body.String()
	}
	body := get("/ui/outcomes?workspace=w&model=m&run=r&checkpoint=c&artifact=a")
	for _, want := range []string{"20.0%", "4/20", "not measured", `data-testid="live"`, `data-testid="evaluation"`, "20.0% live (4/20, 3 unscored)"} {
		if !strings.Contains(body, want) {
			t.Errorf("outcomes page lacks %q:\n%s", want, body)
		}
	}
	body = get("/ui/suite?workspace=w&suite=s")
	for _, want := range []string{`data-testid="always_pass">1<`, `data-testid="regressed">1<`, "c1"} {
		if !strings.Contains(body, want) {
			t.Errorf("suite page lacks %q:\n%s", want, body)
		}
	}
	if body := get("/?workspace=w"); !strings.Contains(body, "/ui/outcomes?") {
		t.Errorf("index lacks the scope link:\n%s", body)
	}
}
