package readside

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// Time axes label each tick once and draw at most eight, whatever the span: by time of day
// within a day, by date for whole days, by date and time for sub-day ticks across days.
func TestTimeAxisLabelsAreUniqueAndFew(t *testing.T) {
	tick := regexp.MustCompile(`data-testid="x-tick" data-t="\d+">([^<]+)<`)
	end := time.Date(2026, 12, 2, 10, 37, 0, 0, time.UTC)
	for _, span := range []time.Duration{10 * time.Minute, 17*time.Minute + 54*time.Second, 6 * time.Hour, 25 * time.Hour,
		30 * time.Hour, 48 * time.Hour, 107 * time.Hour, 7 * 24 * time.Hour} {
		svg := string(timeChart(end.Add(-span), end, time.Hour, nil, nil))
		seen := map[string]bool{}
		ms := tick.FindAllStringSubmatch(svg, -1)
		for _, m := range ms {
			if seen[m[1]] {
				t.Errorf("span %v: tick label %q repeats: %q", span, m[1], ms)
			}
			seen[m[1]] = true
		}
		if len(ms) == 0 || len(ms) > 8 {
			t.Errorf("span %v: %d ticks", span, len(ms))
		}
	}
}

// Evidence reads as words for every window a rule may name, and any count prints.
func TestEvidenceInWords(t *testing.T) {
	r := func(v float64) *float64 { return &v }
	for _, c := range []struct {
		kind string
		ev   schemas.AlertEvidence
		want string
	}{
		{"change", schemas.AlertEvidence{Windows: []schemas.AlertWindow{{Name: "1h", Scored: 200, Rate: r(0.15)}, {Name: "all-1h", Scored: 3000, Rate: r(0.02)}},
			Test: &schemas.AlertTest{LowerDifference: 0.07}},
			"last hour 15.0% of 200 scored vs all before the hour 2.0% of 3\u2009000 scored; the increase is at least 7.0 points at the test's confidence"},
		{"change", schemas.AlertEvidence{Windows: []schemas.AlertWindow{{Name: "24h", Scored: 20, Rate: r(0.5)}, {Name: "7d-24h", Scored: 0}},
			Test: &schemas.AlertTest{}}, "last 24 h 50.0% of 20 scored vs nothing scored in the 6 days before; the increase is at least 0.0 points at the test's confidence"},
		{"change", schemas.AlertEvidence{Windows: []schemas.AlertWindow{{Name: "24h", Scored: 1500, Rate: r(0.15)}, {Name: "7d-24h", Scored: 6000, Rate: r(0.02)}},
			Test: &schemas.AlertTest{Detector: &schemas.AlertDetector{Statistic: 14.71, Threshold: 14.36, BaselineHigh: 0.031, Scored: 1234}}},
			"last 24 h 15.0% of 1\u2009500 scored vs the 6 days before 2.0% of 6\u2009000 scored; the detector's evidence e^14.7 reached its threshold e^14.4 over 1\u2009234 outcomes against a baseline bound of 3.1%"},
		{"not_measured_for", schemas.AlertEvidence{Value: r(7200)}, "no scored opportunity for 2 h"},
		{"not_measured_for", schemas.AlertEvidence{Value: r(93900)}, "no scored opportunity for 1 day 2 h 5 min"},
		{"threshold", schemas.AlertEvidence{Windows: []schemas.AlertWindow{{Name: "24h", Scored: 9275, Rate: r(0.21)}}, Threshold: r(0.2)},
			"last 24 h 21.0% of 9\u2009275 scored; threshold 20.0%"},
	} {
		if got := evidenceWords(c.kind, &c.ev); got != c.want {
			t.Errorf("%s evidence:\n got %q\nwant %q", c.kind, got, c.want)
		}
	}
	if got := thousands(math.MinInt64); got != "-9\u2009223\u2009372\u2009036\u2009854\u2009775\u2009808" {
		t.Errorf("thousands(MinInt64) = %q", got)
	}
}

// failingAlerts is an alert store that cannot be read.
type failingAlerts struct{}

func (failingAlerts) CurrentAlerts(context.Context, string, int) ([]CurrentAlert, error) {
	return nil, errors.New("alert store down")
}

// firingOn lists one firing alert on correction corr of workspace w's scope m/r/c/a.
type firingOn string

func (f firingOn) CurrentAlerts(_ context.Context, ws string, _ int) ([]CurrentAlert, error) {
	at := time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)
	return []CurrentAlert{{Rule: "back", Kind: "threshold", State: "firing", FiredAt: &at, ActiveAt: at,
		Fields: map[string]string{"workspace": ws, "model": "m", "run": "r", "checkpoint": "c", "artifact": "a", "correction_id": string(f), "source": "live"}}}, nil
}

// pageServer records one live snapshot per correction at the processor's clock at, and serves
// the pages on the server's clock now with alerts.
func pageServer(t *testing.T, corrections int, at, now time.Time, alerts AlertLister) func(path string) (int, string) {
	t.Helper()
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "pageedge")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	tallies := map[aggregator.Key]aggregator.Tally{}
	var snaps []schemas.Snapshot
	for i := range corrections {
		k := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"},
			CorrectionID: fmt.Sprintf("fix-%03d", i), Source: aggregator.Live}
		tl := aggregator.Tally{Version: 3, All: aggregator.Counts{Confirmed: 1, Passed: 9}, Hour: aggregator.Counts{Confirmed: 1, Passed: 9},
			Day: aggregator.Counts{Confirmed: 1, Passed: 9}}
		tallies[k] = tl
		snaps = append(snaps, tl.Snapshot(k, at))
	}
	ctx := context.Background()
	if err := rec.Publish(ctx, snaps); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat, Suites: fakeSuites{}, Alerts: alerts}, fakeTallies{t: tallies},
		prometheus.NewRegistry(), func() time.Time { return now }, zap.NewNop())
	return func(path string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer "+tokenA)
		rr := httptest.NewRecorder()
		h.Handler().ServeHTTP(rr, req)
		return rr.Code, rr.Body.String()
	}
}

const edgeScope = "workspace=w&model=m&run=r&checkpoint=c&artifact=a"

// The index reads at most 50 corrections' snapshots, counts the rest, and still shows an alert
// firing on one it did not read.
func TestIndexBoundsItsReads(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	get := pageServer(t, 60, now, now, firingOn("fix-055"))
	code, body := get("/?workspace=w")
	if code != 200 || strings.Count(body, `data-testid="index-correction"`) != indexCorrections ||
		!strings.Contains(body, "60 corrections (50 shown)") || !strings.Contains(body, "⚠ 1 firing among those not shown") {
		t.Fatalf("index of 60 corrections: %d\n%s", code, body)
	}
}

// A page says when it cannot read the alert store instead of showing no alert; a chart span it
// does not know is refused.
func TestPagesSayWhatTheyCannotRead(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	get := pageServer(t, 1, now, now, failingAlerts{})
	for _, path := range []string{"/ui/outcomes?" + edgeScope, "/?workspace=w"} {
		if code, body := get(path); code != 200 || !strings.Contains(body, `data-testid="alerts-unavailable"`) {
			t.Errorf("%s with the alert store down: %d, no notice:\n%s", path, code, body)
		}
	}
	if code, body := get("/ui/outcomes?" + edgeScope + "&range=1y"); code != 400 || !strings.Contains(body, "range must be 24h or 7d") {
		t.Errorf("range=1y: %d %s", code, body)
	}
}

// A processor whose clock is ahead of the read side's stamps points "in the future": the chart
// ends at its newest point rather than dropping it, and never says nothing was scored.
func TestChartKeepsPointsFromAClockAhead(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	get := pageServer(t, 1, now.Add(30*time.Second), now, nil)
	code, body := get("/ui/outcomes?" + edgeScope)
	if code != 200 || strings.Contains(body, "nothing scored in this span") || !strings.Contains(body, fmt.Sprintf(`data-t1="%d"`, now.Add(30*time.Second).Unix())) {
		t.Fatalf("chart with points 30 s ahead: %d\n%s", code, body)
	}
}
