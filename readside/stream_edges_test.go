package readside

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// sseEvent is one event of a stream as a client sees it.
type sseEvent struct {
	ID     int64
	Source string // the snapshot's aggregate source
}

// streamRig is a real server with a catalog on Redis and tallies the test sets, for stream tests.
type streamRig struct {
	t       *testing.T
	ctx     context.Context
	h       *HTTP
	addr    string
	rec     *Recorder
	tallies *mutableTallies
	now     time.Time
}

func newStreamRig(t *testing.T, tweak func(*HTTP)) *streamRig {
	t.Helper()
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "review")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	r := &streamRig{t: t, rec: NewRecorder(nopPublisher{}, cat, nil, zap.NewNop()),
		tallies: &mutableTallies{t: map[aggregator.Key]aggregator.Tally{}}, now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	r.h = NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat}, r.tallies, prometheus.NewRegistry(),
		func() time.Time { return r.now }, zap.NewNop())
	if tweak != nil {
		tweak(r.h)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = l.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	r.ctx = ctx
	done := make(chan error, 1)
	go func() { done <- r.h.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

func (r *streamRig) publish(k aggregator.Key, v int64) {
	r.t.Helper()
	tally := aggregator.Tally{Version: v, All: aggregator.Counts{Passed: v}}
	r.tallies.mu.Lock()
	r.tallies.t[k] = tally
	r.tallies.mu.Unlock()
	if err := r.rec.Publish(r.ctx, []schemas.Snapshot{tally.Snapshot(k, r.now)}); err != nil {
		r.t.Fatal(err)
	}
	if err := r.rec.Flush(r.ctx); err != nil {
		r.t.Fatal(err)
	}
}

// open opens a stream with query q and reads its catch-up; next reads live events until n arrived
// or the stream ends.
func (r *streamRig) open(q, last string) (caught []sseEvent, next func(n int) []sseEvent, stop func()) {
	r.t.Helper()
	sctx, cancel := context.WithTimeout(r.ctx, 8*time.Second)
	req, _ := http.NewRequestWithContext(sctx, http.MethodGet, "http://"+r.addr+"/v1/stream?"+q, nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		r.t.Fatalf("stream: %v %v", err, resp)
	}
	sc := bufio.NewScanner(resp.Body)
	read := func(n int, untilLive bool) []sseEvent {
		var out []sseEvent
		var ev sseEvent
		for (untilLive || len(out) < n) && sc.Scan() {
			line := sc.Text()
			switch {
			case untilLive && line == ": live":
				return out
			case strings.HasPrefix(line, "id: "):
				ev.ID, _ = strconv.ParseInt(strings.TrimPrefix(line, "id: "), 10, 64)
			case strings.HasPrefix(line, "data: "):
				var s schemas.Snapshot
				json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &s)
				ev.Source = s.Aggregate.Source
			case line == "" && ev.ID != 0:
				out = append(out, ev)
				ev = sseEvent{}
			}
		}
		return out
	}
	caught = read(0, true)
	return caught, func(n int) []sseEvent { return read(n, false) }, func() { cancel(); resp.Body.Close() }
}

// TestStreamOutlivesReadTimeout: a stream stays open past the server's read timeout (10 s). A
// whole-request read deadline that outlived the headers would expire in the background read that
// watches for a client hanging up and cancel the request, ending every stream; net/http clears it
// when that read starts. This guards that the streams rely on it.
func TestStreamOutlivesReadTimeout(t *testing.T) {
	const readTimeout = 300 * time.Millisecond
	r := newStreamRig(t, func(h *HTTP) { h.srv.ReadTimeout = readTimeout })
	key := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	r.publish(key, 1)
	caught, next, stop := r.open("workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x", "")
	defer stop()
	if len(caught) != 1 {
		t.Fatalf("catch-up %v, want version 1", caught)
	}
	// The condition under test is time passing beyond the read timeout.
	time.Sleep(3 * readTimeout)
	r.publish(key, 2)
	if got := next(1); len(got) != 1 || got[0].ID != 2 {
		t.Fatalf("after %v open: events %v, want version 2 (the stream ended)", 3*readTimeout, got)
	}
}

// TestStreamResumeAcrossSubjects: a stream of one correction carries two subjects (Live and
// Evaluation), each with its own versions. A client resuming with the id of the last event it
// received (Live's version 10) must still get Evaluation's newer state: its version 2, current at
// the reconnect, and its version 3 published after it. The id only orders one subject's events;
// filtering every subject by it lost Evaluation's versions up to 10, in the catch-up and live.
func TestStreamResumeAcrossSubjects(t *testing.T) {
	r := newStreamRig(t, nil)
	live := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	eval := live
	eval.Source = aggregator.Evaluation
	r.publish(eval, 1)
	r.publish(live, 10)
	q := "workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x"
	caught, _, stop := r.open(q, "")
	if len(caught) != 2 {
		t.Fatalf("first catch-up %v, want live 10 and evaluation 1", caught)
	}
	stop()
	r.publish(eval, 2) // while disconnected
	caught, next, stop := r.open(q, "10")
	defer stop()
	r.publish(eval, 3)
	got := append(caught, next(1)...)
	var evalIDs []int64
	for _, e := range got {
		if e.Source == "evaluation" {
			evalIDs = append(evalIDs, e.ID)
		}
	}
	if len(evalIDs) != 2 || evalIDs[0] != 2 || evalIDs[1] != 3 {
		t.Fatalf("resumed with Last-Event-ID 10: events %v; evaluation versions %v, want [2 3]", got, evalIDs)
	}
}

// TestLoginCrossSite: the login and logout forms refuse a cross-site post (login CSRF: another
// site signing a visitor in with its own token, so that the visitor reads and trusts the
// attacker's pages, or signing them out), while a same-origin post and one without browser
// headers (curl) sign in. The cookie is Secure when the page was reached over HTTPS, also behind
// a TLS-terminating proxy (the deployment the README recommends), where req.TLS is nil.
func TestLoginCrossSite(t *testing.T) {
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t)}, fakeTallies{}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	post := func(path string, hdr map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "http://rr.example"+path, strings.NewReader("token="+tokenA))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, req)
		return rec
	}
	for _, c := range []struct {
		name, path string
		hdr        map[string]string
		signedIn   bool
		secure     bool
	}{
		{"cross-site origin", "/login", map[string]string{"Origin": "https://evil.example"}, false, false},
		{"cross-site fetch metadata", "/login", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, false, false},
		{"null origin", "/login", map[string]string{"Origin": "null"}, false, false},
		{"cross-site logout", "/logout", map[string]string{"Sec-Fetch-Site": "cross-site"}, false, false},
		{"same origin", "/login", map[string]string{"Origin": "http://rr.example", "Sec-Fetch-Site": "same-origin"}, true, false},
		{"no browser headers", "/login", nil, true, false},
		{"behind a TLS proxy", "/login", map[string]string{"Origin": "https://rr.example", "X-Forwarded-Proto": "https"}, true, true},
		{"https origin", "/login", map[string]string{"Origin": "https://rr.example"}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := post(c.path, c.hdr)
			cookies := rec.Result().Cookies()
			if !c.signedIn {
				if rec.Code != http.StatusForbidden || len(cookies) != 0 {
					t.Fatalf("%s: %d with cookies %v, want 403 and none", c.path, rec.Code, cookies)
				}
				return
			}
			if rec.Code != http.StatusSeeOther || len(cookies) != 1 || cookies[0].Value != tokenA {
				t.Fatalf("%s: %d %v, want 303 and the cookie", c.path, rec.Code, cookies)
			}
			if ck := cookies[0]; ck.Secure != c.secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
				t.Fatalf("cookie %+v: want Secure %v, HttpOnly, SameSite=Strict", ck, c.secure)
			}
		})
	}
}

// TestRateLimitIPv6Prefix: an outsider holding an IPv6 /64 (what one host is usually given) has
// 2^64 addresses; limited per address it was never limited, and a public badge costs two Lua
// calls. Addresses of one /64 share a bucket, and so do their connections the per-address cap.
// And however many address buckets an outsider keeps busy, a configured token is still served.
func TestRateLimitIPv6Prefix(t *testing.T) {
	live := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	tallies := fakeTallies{t: map[aggregator.Key]aggregator.Tally{live: {Version: 3, All: aggregator.Counts{Confirmed: 1, Passed: 3}}}}
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), PublicBadges: []string{"w"}, RateLimit: 1, RateBurst: 5, EarlyRetryHold: -1}, tallies,
		prometheus.NewRegistry(), time.Now, zap.NewNop())
	codes := map[int]int{}
	for i := range 50 {
		req := httptest.NewRequest(http.MethodGet, "/v1/badge.svg?"+everyParam("w"), nil)
		req.RemoteAddr = "[2001:db8:1:2::" + strconv.FormatInt(int64(i+1), 16) + "]:4000"
		rec := httptest.NewRecorder()
		h.Handler().ServeHTTP(rec, req)
		codes[rec.Code]++
	}
	if codes[http.StatusOK] != 5 || codes[http.StatusTooManyRequests] != 45 {
		t.Fatalf("50 badges from 50 addresses of one /64: %v, want 5 answered, 45 refused", codes)
	}
	if a, b := clientIP(&http.Request{RemoteAddr: "[2001:db8:1:2::1]:1"}), clientIP(&http.Request{RemoteAddr: "[2001:db8:1:3::1]:1"}); a == b {
		t.Fatalf("two /64s share a key %q", a)
	}
	if a := clientIP(&http.Request{RemoteAddr: "192.0.2.7:80"}); a != "192.0.2.7" {
		t.Fatalf("IPv4 key %q", a)
	}

	// Every address bucket busy: a token's first request still gets through.
	lim := newLimiter(1, 5, time.Now)
	for i := range maxLimiterKeys {
		lim.allow("addr " + strconv.Itoa(i))
	}
	if ok, _ := lim.allow("token a"); !ok {
		t.Fatal("a token was refused because outsiders' addresses filled the limiter")
	}
}
