package readside

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// Tokens of the tests: tokenA reads workspaces "w" and "w&<x>", tokenB reads "other".
const (
	tokenA = "token-a-0123456789"
	tokenB = "token-b-0123456789"
)

func testTokens(t testing.TB) *auth.Store {
	t.Helper()
	s, err := auth.NewStore([]auth.TokenConfig{
		{Name: "a", SHA256: auth.Hash(tokenA), Workspaces: map[string]string{"w": "read", "w&<x>": "read"}},
		{Name: "b", SHA256: auth.Hash(tokenB), Workspaces: map[string]string{"other": "read-write"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

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
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Metrics: true}, store, reg, func() time.Time { return now }, zap.NewNop())
	srv := httptest.NewServer(h.srv.Handler)
	defer srv.Close()

	q := url.Values{"workspace": {scope.Workspace}, "model": {"m"}, "run": {"r"}, "checkpoint": {"c"}, "artifact": {"a"}, "correction_id": {"fix"}}
	get := func(path string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+tokenA)
		resp, err := http.DefaultClient.Do(req)
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
	// 4 scored: the band's colour, pale, and the words "few scored".
	if code != 200 || ctype != "image/svg+xml" || !strings.Contains(body, "25.0% evaluation (1/4, 1 unscored) · few scored") ||
		!strings.Contains(body, `fill="`+paleHex(aggregator.Orange.Hex())+`"`) {
		t.Fatalf("badge: %d %s %s", code, ctype, body)
	}
	q.Set("correction_id", "other")
	if code, _, body := get("/v1/badge.svg?" + q.Encode()); code != http.StatusNotFound || !strings.Contains(body, "unknown scope") {
		t.Fatalf("badge of an unknown correction: %d %s", code, body)
	}
	if code, _, body := get("/v1/snapshots?" + q.Encode()); code != http.StatusNotFound || !strings.Contains(body, errUnknownScope) {
		t.Fatalf("snapshots of an unknown correction: %d %s", code, body)
	}
	// A correction whose only opportunity is unscored is known: 200, not measured.
	unscored := aggregator.Observation{Key: aggregator.Key{Scope: scope, CorrectionID: "other", Source: aggregator.Live},
		OpportunityID: "u", Class: aggregator.Unscored, Occurred: aggregator.Micros(now), Assessed: aggregator.Micros(now)}
	if _, err := store.Apply(context.Background(), []aggregator.Observation{unscored}, now); err != nil {
		t.Fatal(err)
	}
	if code, _, body := get("/v1/badge.svg?" + q.Encode()); code != http.StatusOK || !strings.Contains(body, "not measured (live 1 unscored") {
		t.Fatalf("badge of an unscored correction: %d %s", code, body)
	}
	if code, _, body := get("/v1/snapshots?" + q.Encode()); code != http.StatusOK || !strings.Contains(body, `"status":"not_measured"`) {
		t.Fatalf("snapshots of an unscored correction: %d %s", code, body)
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
	svg := badgeSVG("R", `<script>"x"</script>`, greyHex, `<b>`)
	if strings.Contains(svg, "<script>") || strings.Contains(svg, "<b>") {
		t.Fatalf("unescaped text in %s", svg)
	}
}

// fakeTallies is a TallyReader over a fixed map; err, when set, is every read's answer.
type fakeTallies struct {
	t   map[aggregator.Key]aggregator.Tally
	err error
}

func (f fakeTallies) Tally(_ context.Context, k aggregator.Key, _ time.Time) (aggregator.Tally, error) {
	return f.t[k], f.err
}

// serveOnce answers one GET of target by a server over r.
func serveOnce(t *testing.T, r TallyReader, target string) *httptest.ResponseRecorder {
	t.Helper()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t)}, r, prometheus.NewRegistry(), func() time.Time { return now }, zap.NewNop())
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	h.srv.Handler.ServeHTTP(rec, req)
	return rec
}

func TestHTTPQueryErrors(t *testing.T) {
	const all = "; all of workspace, model, run, checkpoint, artifact, correction_id are required, each once"
	const escape = "(% must be followed by two hex digits)"
	for _, c := range []struct {
		name, query, want string
	}{
		// Nothing given: every parameter, in the documented order.
		{"none", "", "query parameters workspace, model, run, checkpoint, artifact, correction_id are missing or empty" + all},
		// Several missing: all named, in a fixed order (a map named one of them at random).
		{"several missing", "workspace=w&checkpoint=c&artifact=a",
			"query parameters model, run, correction_id are missing or empty" + all},
		// One missing.
		{"one missing", "workspace=w&model=m&run=r&checkpoint=c&artifact=a",
			"query parameter correction_id is missing or empty" + all},
		// An empty value counts as missing.
		{"empty", "workspace=w&model=&run=r&checkpoint=c&artifact=a&correction_id=x",
			"query parameter model is missing or empty" + all},
		// A malformed escape is reported as such, not as missing.
		{"bad escape", "workspace=w&model=m%ZZ&run=r&checkpoint=c&artifact=a&correction_id=x",
			"query parameter model has a malformed percent-escape " + escape + all},
		// A truncated escape at the end of the query.
		{"truncated escape", "workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x%4",
			"query parameter correction_id has a malformed percent-escape " + escape + all},
		// Escapes, repeats and missing ones together, each kind in parameter order.
		{"mixed", "run=%&workspace=w&workspace=v&model=%G1",
			"query parameters model, run have a malformed percent-escape " + escape +
				"; query parameter workspace is given more than once" +
				"; query parameters checkpoint, artifact, correction_id are missing or empty" + all},
		// A malformed name, which names no parameter.
		{"bad name", "wor%kspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x",
			"a parameter name is malformed (a bad percent-escape, or ; for &); query parameter workspace is missing or empty" + all},
	} {
		t.Run(c.name, func(t *testing.T) {
			for range 20 { // the same answer every time
				rec := serveOnce(t, fakeTallies{}, "/v1/snapshots?"+c.query)
				var body struct{ Error string }
				if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
					t.Fatalf("body %q: %v", rec.Body, err)
				}
				if rec.Code != http.StatusBadRequest || rec.Header().Get("Content-Type") != "application/json" || body.Error != c.want {
					t.Fatalf("got %d %s %q\nwant 400 application/json %q", rec.Code, rec.Header().Get("Content-Type"), body.Error, c.want)
				}
			}
		})
	}
}

func TestHTTPHidesBackendErrors(t *testing.T) {
	r := fakeTallies{err: errors.New("read rr:{x}: dial tcp 10.1.2.3:6379: connect: connection refused")}
	q := "workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x"
	for _, path := range []string{"/v1/snapshots", "/v1/badge.svg"} {
		rec := serveOnce(t, r, path+"?"+q)
		if rec.Code != http.StatusServiceUnavailable || strings.Contains(rec.Body.String(), "10.1.2.3") ||
			strings.Contains(rec.Body.String(), "rr:") {
			t.Fatalf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
}

func TestHTTPUnknownScope(t *testing.T) {
	scope := schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}
	key := func(src aggregator.Source) aggregator.Key {
		return aggregator.Key{Scope: scope, CorrectionID: "x", Source: src}
	}
	q := "?workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x"
	for _, c := range []struct {
		name    string
		tallies map[aggregator.Key]aggregator.Tally
		code    int
		// what the snapshot body and the badge must contain
		snapshot, badge string
	}{
		// Neither source's aggregate exists: 404, a JSON error and a grey "unknown scope" badge.
		{"unknown", nil, http.StatusNotFound, errUnknownScope, ">unknown scope<"},
		// Known, only unscored opportunities: 200 with not_measured windows.
		{"only unscored", map[aggregator.Key]aggregator.Tally{
			key(aggregator.Live): {Version: 7, All: aggregator.Counts{Unscored: 3}},
		}, http.StatusOK, `"status":"not_measured"`, "not measured (live 3 unscored, evaluation 0 unscored)"},
		// Known, not measured: grey.
		{"not measured grey", map[aggregator.Key]aggregator.Tally{
			key(aggregator.Live): {Version: 7, All: aggregator.Counts{Unscored: 3}},
		}, http.StatusOK, `"status":"not_measured"`, `fill="` + aggregator.LightGrey.Hex() + `"`},
		// Known, every opportunity expired (the state outlives them until the aggregate goes idle).
		{"all expired", map[aggregator.Key]aggregator.Tally{
			key(aggregator.Evaluation): {Version: 9},
		}, http.StatusOK, `"status":"not_measured"`, "not measured (live 0 unscored, evaluation 0 unscored)"},
		// Known and measured.
		{"measured", map[aggregator.Key]aggregator.Tally{
			key(aggregator.Live): {Version: 3, All: aggregator.Counts{Confirmed: 1, Passed: 3}},
		}, http.StatusOK, `"status":"measured"`, "25.0% live (1/4, 0 unscored)"},
		// Known, measured at 0 %: brightgreen (pale: 3 scored are few).
		{"measured zero", map[aggregator.Key]aggregator.Tally{
			key(aggregator.Evaluation): {Version: 3, All: aggregator.Counts{Passed: 3}},
		}, http.StatusOK, `"status":"measured"`, `fill="` + paleHex(aggregator.BrightGreen.Hex()) + `"`},
		{"measured zero, enough scored", map[aggregator.Key]aggregator.Tally{
			key(aggregator.Evaluation): {Version: 3, All: aggregator.Counts{Passed: 30}},
		}, http.StatusOK, `"status":"measured"`, `fill="` + aggregator.BrightGreen.Hex() + `"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := fakeTallies{t: c.tallies}
			rec := serveOnce(t, r, "/v1/snapshots"+q)
			if rec.Code != c.code || rec.Header().Get("Content-Type") != "application/json" || !strings.Contains(rec.Body.String(), c.snapshot) {
				t.Errorf("snapshots: %d %s %s\nwant %d with %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body, c.code, c.snapshot)
			}
			rec = serveOnce(t, r, "/v1/badge.svg"+q)
			if rec.Code != c.code || rec.Header().Get("Content-Type") != "image/svg+xml" || !strings.Contains(rec.Body.String(), c.badge) {
				t.Errorf("badge: %d %s %s\nwant %d with %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body, c.code, c.badge)
			}
		})
	}
}

func TestReadyzHidesItsReason(t *testing.T) {
	h := NewHTTP(HTTPConfig{Ready: func(context.Context) error { return errors.New("dial tcp 10.1.2.3:6379: refused") }},
		fakeTallies{}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	rec := httptest.NewRecorder()
	h.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || strings.Contains(rec.Body.String(), "10.1.2.3") {
		t.Fatalf("readyz: %d %s", rec.Code, rec.Body)
	}
}

// A part that is retrying while the processor consumes (alerting's subscription, say) leaves
// /readyz ready, and says so in a line of its own.
func TestReadyzListsWhatIsDegraded(t *testing.T) {
	degraded := []string{"alerting: kafka subscription retrying (1 partitions or topics)"}
	h := NewHTTP(HTTPConfig{Ready: func(context.Context) error { return nil }, Degraded: func() []string { return degraded }},
		fakeTallies{}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	rec := httptest.NewRecorder()
	h.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if want := "ready\ndegraded: " + degraded[0] + "\n"; rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Fatalf("readyz: %d %q, want 200 %q", rec.Code, rec.Body, want)
	}
	degraded = nil
	rec = httptest.NewRecorder()
	h.srv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusOK || rec.Body.String() != "ready\n" {
		t.Fatalf("readyz once recovered: %d %q", rec.Code, rec.Body)
	}
}

// TestBadgeReadsAtAGlance: every fill a badge can have — each rate band, each pale (few scored),
// and grey — carries its text at a WCAG AA contrast of at least 4.5:1; the badge is as wide as its
// text (no dead space after it); its title says what R is.
func TestBadgeReadsAtAGlance(t *testing.T) {
	for _, c := range []aggregator.Colour{aggregator.BrightGreen, aggregator.Green, aggregator.YellowGreen, aggregator.Yellow,
		aggregator.Orange, aggregator.Red, aggregator.LightGrey} {
		for _, fill := range []string{c.Hex(), paleHex(c.Hex())} {
			if r := contrast(textOn(fill), fill); r < 4.5 {
				t.Errorf("text %s on %s (%s): contrast %.2f, want at least 4.5", textOn(fill), fill, c, r)
			}
		}
	}
	if r := contrast("#fff", "#555"); r < 4.5 {
		t.Errorf("the label's white on #555: contrast %.2f", r)
	}
	value := "2.5% live (10/400, 0 unscored)"
	svg := badgeSVG("R", value, aggregator.Green.Hex(), badgeR)
	var width, textLen float64
	if _, err := fmt.Sscanf(svg[strings.Index(svg, `width="`):], `width="%g"`, &width); err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndex(svg, `textLength="`)
	if _, err := fmt.Sscanf(svg[i:], `textLength="%g"`, &textLen); err != nil {
		t.Fatal(err)
	}
	// 10 px around "R", 10 px around the value, and at most a pixel of rounding.
	if slack := width - (10 + textWidth("R") + 10 + textLen); slack < 0 || slack > 1 {
		t.Errorf("badge %.0f px wide for %.1f px of text: %.1f px of slack", width, 20+textWidth("R")+textLen, slack)
	}
	if !strings.Contains(svg, "<title>R: the repeat rate") {
		t.Errorf("the badge's title does not say what R is: %s", svg)
	}
}
