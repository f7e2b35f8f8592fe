package readside

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Signing in returns the reader to the page that asked for it: a page opened without a token
// sends them to the form with that page to return to, and the form, once the token is taken,
// sends them back — only ever to a path of this server, never to another site.
func TestSignInReturnsToTheAskedPage(t *testing.T) {
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), RateLimit: 1000}, fakeTallies{}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	do := func(req *http.Request) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.srv.Handler.ServeHTTP(rec, req)
		return rec
	}
	page := "/ui/outcomes?workspace=w&model=m&run=r&checkpoint=c&artifact=a"
	rec := do(httptest.NewRequest(http.MethodGet, page, nil))
	loc := rec.Header().Get("Location")
	if rec.Code != http.StatusSeeOther || loc != "/login?next="+url.QueryEscape(page) {
		t.Fatalf("a page without a token: %d, Location %q", rec.Code, loc)
	}
	rec = do(httptest.NewRequest(http.MethodGet, loc, nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `name="next" value="`+strings.ReplaceAll(page, "&", "&amp;")+`"`) {
		t.Fatalf("the form does not carry the page to return to: %d %s", rec.Code, rec.Body)
	}
	post := func(next, token string) *httptest.ResponseRecorder {
		form := url.Values{"token": {token}, "next": {next}}
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		return do(req)
	}
	if rec := post(page, tokenA); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != page {
		t.Fatalf("signed in: %d, Location %q, want the page", rec.Code, rec.Header().Get("Location"))
	}
	for _, next := range []string{"//evil.example/x", "https://evil.example/", "/\\evil.example", "evil.example", "javascript:alert(1)", "/ok\r\nSet-Cookie: x=y", ""} {
		if rec := post(next, tokenA); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/" {
			t.Errorf("next %q: %d, Location %q, want /", next, rec.Code, rec.Header().Get("Location"))
		}
	}
	// A wrong token keeps the page to return to on the form shown again.
	if rec := post(page, "wrong-token"); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), `name="next"`) {
		t.Fatalf("a wrong token: %d %s", rec.Code, rec.Body)
	}
}
