package ingest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/repeatrate/repeatrate/internal/auth"
)

const tokenMulti = "token-multi-writer-000" // writes acme and beta

func batchOf(ws string, n int, prefix string) []byte {
	evs := make([]map[string]any, n)
	for i := range evs {
		evs[i] = live(fmt.Sprintf("%s-%d", prefix, i), ws)
	}
	return mustJSON(evs)
}

// A workspace writes at most its quota of events per second: once a request has taken it past
// its budget, the next request with an event of that workspace is refused whole (429, every event
// not_written, Retry-After until the budget is paid off, counted by workspace), and nothing of it
// reaches Kafka; another workspace's quota is its own.
func TestWorkspaceQuotaRefusesWholeRequests(t *testing.T) {
	w := &fakeWriter{}
	reg := prometheus.NewRegistry()
	h := newHandler(t, w, Config{WorkspaceRate: 10, WorkspaceBurst: 100, Registerer: reg})
	valid := openAPISchema(t)

	// A request larger than the burst is taken while the budget is not in debt: a workspace can
	// always write a request of any valid size.
	if rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: batchOf("acme", 150, "a")}); rec.Code != http.StatusAccepted {
		t.Fatalf("first request: %d %s", rec.Code, rec.Body)
	}
	written := len(w.msgs)
	// A token that writes only acme is refused before its body is read: even an unreadable one
	// is answered 429, not 400.
	rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: []byte("[{not json")})
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `workspace \"acme\" wrote more than its quota of 10 events per second`) {
		t.Fatalf("a request past the quota: %d %s", rec.Code, rec.Body)
	}
	if err := valid(rec.Code, rec.Body.Bytes()); err != nil {
		t.Fatalf("the answer is not as documented: %v", err)
	}
	// 150 written against 100: 50 in debt at 10/s is 5 s.
	if s, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || s < 5 || s > 6 {
		t.Fatalf("Retry-After %q, want 5–6 s", rec.Header().Get("Retry-After"))
	}
	// A token that also writes another workspace is judged by its events: an event of acme's
	// makes the whole request refused, with every event's result.
	multi, err := auth.NewStore([]auth.TokenConfig{{Name: "multi", SHA256: auth.Hash(tokenMulti), Workspaces: map[string]string{"acme": "write", "beta": "write"}}})
	if err != nil {
		t.Fatal(err)
	}
	h.cfg.Tokens = multi
	rec = post(h, request{token: tokenMulti, ctype: ceBatch, body: mustJSON([]map[string]any{live("m-1", "beta"), live("m-2", "acme"), live("m-3", "beta")})})
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a request with an event of a workspace past its quota: %d %s", rec.Code, rec.Body)
	}
	if err := valid(rec.Code, rec.Body.Bytes()); err != nil {
		t.Fatalf("the answer is not as documented: %v", err)
	}
	var ans Answer
	if err := json.Unmarshal(rec.Body.Bytes(), &ans); err != nil {
		t.Fatal(err)
	}
	if ans.Accepted != 0 || len(ans.Events) != 3 || !strings.Contains(ans.Error, `workspace "acme"`) {
		t.Fatalf("answer: %+v", ans)
	}
	for _, e := range ans.Events {
		if e.Status != StatusNotWritten || e.Topic != "" {
			t.Fatalf("an event of a refused request: %+v", e)
		}
	}
	if len(w.msgs) != written {
		t.Fatalf("%d messages written by refused requests", len(w.msgs)-written)
	}
	if n := testutil.ToFloat64(h.overQuota.WithLabelValues("acme", "events")); n != 2 {
		t.Fatalf("over_quota{workspace=acme} = %v, want 2", n)
	}
	h.cfg.Tokens = tokens(t)
	// beta's budget is its own.
	if rec := post(h, request{token: tokenBeta, ctype: ceBatch, body: batchOf("beta", 50, "c")}); rec.Code != http.StatusAccepted {
		t.Fatalf("another workspace beside one over its quota: %d %s", rec.Code, rec.Body)
	}
}

// Only what may have been written is charged: events Kafka certainly refused cost their workspace
// nothing, so a client that sends them again as told is not refused for a write that never was.
func TestWorkspaceQuotaChargesOnlyWhatMayBeWritten(t *testing.T) {
	w := &fakeWriter{fail: func(call, _ int) bool { return call == 1 }}
	h := newHandler(t, w, Config{WorkspaceRate: 1, WorkspaceBurst: 100, SingleAttempt: true, RetryRefusedFor: -1})
	body := batchOf("acme", 100, "a")
	rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: body})
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), StatusFailed) {
		t.Fatalf("a refused write: %d %.300s", rec.Code, rec.Body)
	}
	w.mu.Lock()
	w.fail = nil // Kafka takes writes again
	w.mu.Unlock()
	if rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: body}); rec.Code != http.StatusAccepted {
		t.Fatalf("the same request sent again after Kafka refused it: %d %.300s", rec.Code, rec.Body)
	}
	// 100 written on a burst of 100: the budget is spent, not in debt by the refused write too.
	if l := h.quota.Level("acme"); l < -1 || l > 1 {
		t.Fatalf("acme's budget after 100 events written on a burst of 100: %v, want 0", l)
	}
}

// retainedCounts is a RetainedCounter of fixed counts, counting its lookups, failing with err.
type retainedCounts struct {
	mu      sync.Mutex
	n       map[string]int64
	err     error
	lookups int
}

func (r *retainedCounts) Retained(_ context.Context, ws string) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookups++
	return r.n[ws], r.err
}

func (r *retainedCounts) set(ws string, n int64, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n[ws], r.err = n, err
}

// A workspace that holds its quota of retained opportunities is refused (429, nothing written,
// a message naming the count, the quota and what frees room, no Retry-After) until it holds
// fewer; another workspace is not. The
// count is looked up at most once per refresh, and a failed lookup keeps the last count rather
// than refusing or opening the ingest.
func TestRetainedQuotaRefusesAWorkspaceAtIt(t *testing.T) {
	w := &fakeWriter{}
	counts := &retainedCounts{n: map[string]int64{"acme": 1000, "beta": 10}}
	h := newHandler(t, w, Config{MaxRetained: 1000, Retained: counts, RetainedRefresh: time.Hour})
	valid := openAPISchema(t)
	rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: batchOf("acme", 2, "a")})
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), `workspace \"acme\" retains 1000 opportunities, its quota is 1000`) {
		t.Fatalf("a workspace at its quota: %d %s", rec.Code, rec.Body)
	}
	if err := valid(rec.Code, rec.Body.Bytes()); err != nil {
		t.Fatalf("the answer is not as documented: %v", err)
	}
	// Waiting frees nothing (opportunities age out behind newer events, which the quota
	// refuses): no Retry-After, and the answer says what does.
	if len(w.msgs) != 0 || rec.Header().Get("Retry-After") != "" || !strings.Contains(rec.Body.String(), "waiting does not free room") ||
		!strings.Contains(rec.Body.String(), "--http-ingest-workspace-retained") {
		t.Fatalf("%d messages written, Retry-After %q: %s", len(w.msgs), rec.Header().Get("Retry-After"), rec.Body)
	}
	if n := testutil.ToFloat64(h.overQuota.WithLabelValues("acme", "retained")); n != 1 {
		t.Fatalf("over_quota{acme,retained} = %v", n)
	}
	if rec := post(h, request{token: tokenBeta, ctype: ceBatch, body: batchOf("beta", 2, "b")}); rec.Code != http.StatusAccepted {
		t.Fatalf("a workspace under its quota: %d %s", rec.Code, rec.Body)
	}
	// Within the refresh the count is not looked up again; after it, it is.
	counts.set("acme", 999, nil)
	post(h, request{token: tokenAcme, ctype: ceBatch, body: batchOf("acme", 1, "c")})
	if counts.lookups != 2 {
		t.Fatalf("%d lookups for two workspaces within the refresh", counts.lookups)
	}
	h.cfg.RetainedRefresh = time.Nanosecond
	if rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: batchOf("acme", 1, "d")}); rec.Code != http.StatusAccepted {
		t.Fatalf("a workspace under its quota again: %d %s", rec.Code, rec.Body)
	}
	// Redis unreachable: the last count stands.
	counts.set("acme", 5000, errors.New("redis: connection refused"))
	if rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: batchOf("acme", 1, "e")}); rec.Code != http.StatusAccepted {
		t.Fatalf("a failed lookup after a count under the quota: %d %s", rec.Code, rec.Body)
	}
}

// slowWriter takes every message after a delay, as Kafka's acknowledgement takes a while.
type slowWriter struct {
	mu   sync.Mutex
	msgs int
}

func (w *slowWriter) WriteMessages(_ context.Context, msgs ...kafka.Message) error {
	time.Sleep(50 * time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs += len(msgs)
	return nil
}

// Requests posted at once cannot all pass a workspace's quota: each is charged as it is admitted,
// not when Kafka answers, so 20 requests of 150 events at once on a burst of 100 write one
// request's events, the rest refused (before, all 20 were admitted and 3 000 events written).
func TestWorkspaceQuotaHoldsForRequestsAtOnce(t *testing.T) {
	w := &slowWriter{}
	h := newHandler(t, w, Config{WorkspaceRate: 10, WorkspaceBurst: 100})
	var accepted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch rec := post(h, request{token: tokenAcme, ctype: ceBatch, body: batchOf("acme", 150, fmt.Sprintf("r%d", i))}); rec.Code {
			case http.StatusAccepted:
				accepted.Add(1)
			case http.StatusTooManyRequests:
				refused.Add(1)
			default:
				t.Errorf("a request: %d %s", rec.Code, rec.Body)
			}
		}()
	}
	wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if accepted.Load() != 1 || refused.Load() != 19 || w.msgs != 150 {
		t.Fatalf("%d accepted, %d refused, %d events written; want 1, 19 and 150 on a burst of 100", accepted.Load(), refused.Load(), w.msgs)
	}
}

// A token whose workspaces are over different quotas is refused before its body is read with
// each workspace's reason, and told to come back when the soonest of them takes events again:
// one at its retained quota (waiting frees nothing) beside one briefly over its rate must not
// hide the rate's Retry-After, nor blame the first workspace alone.
func TestEarlyRefusalNamesEachWorkspacesQuota(t *testing.T) {
	w := &fakeWriter{}
	counts := &retainedCounts{n: map[string]int64{"acme": 1000}}
	h := newHandler(t, w, Config{WorkspaceRate: 10, WorkspaceBurst: 10, MaxRetained: 1000, Retained: counts, RetainedRefresh: time.Hour})
	multi, err := auth.NewStore([]auth.TokenConfig{{Name: "multi", SHA256: auth.Hash(tokenMulti), Workspaces: map[string]string{"acme": "write", "beta": "write"}}})
	if err != nil {
		t.Fatal(err)
	}
	h.cfg.Tokens = multi
	if rec := post(h, request{token: tokenMulti, ctype: ceBatch, body: batchOf("beta", 20, "a")}); rec.Code != http.StatusAccepted {
		t.Fatalf("beta's first 20: %d %s", rec.Code, rec.Body)
	}
	rec := post(h, request{token: tokenMulti, ctype: ceBatch, body: batchOf("beta", 1, "b")})
	body := rec.Body.String()
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(body, `\"acme\" retains 1000`) || !strings.Contains(body, `\"beta\" wrote more than its quota of 10 events per second`) {
		t.Fatalf("refusal: %d %s", rec.Code, body)
	}
	if s, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || s < 1 || s > 2 {
		t.Fatalf("Retry-After %q: want beta's 1 s, not none", rec.Header().Get("Retry-After"))
	}
	if len(w.msgs) != 20 {
		t.Fatalf("%d messages written", len(w.msgs))
	}
}
