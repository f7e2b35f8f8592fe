package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/repeatrate/repeatrate/ingest"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// startIngestRun runs `run` on real Kafka and Redis (isolated names) with its HTTP side on a free
// port, the tokens given and adjust's changes, until the test ends; it returns the HTTP base URL
// once /healthz answers.
func startIngestRun(ctx context.Context, t *testing.T, name string, tokens []auth.TokenConfig, adjust func(*Config)) string {
	t.Helper()
	testenv.KafkaBrokers(t)
	cfg, _ := isolated(ctx, t, name, 2)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg.HTTPAddr = "127.0.0.1:" + strconv.Itoa(port)
	cfg.HTTP.Tokens = tokens
	if adjust != nil {
		adjust(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- runProcessor(pctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	base := "http://" + cfg.HTTPAddr
	waitFor(t, 30*time.Second, "the HTTP server", func() bool {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return base
}

// TestIngestEndToEnd runs `run` on real Kafka and Redis and feeds it only through POST /v1/events,
// as the README's curl example does: a structured, a binary and a batch post are accepted (202)
// and appear in the snapshots; an invalid event is refused with its dead-letter reason and a token
// of another workspace with 403, and neither is counted; the same event posted twice is counted
// once; a body one byte over the limit is 413 and the largest body, exactly at the limit, is
// accepted.
func TestIngestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tokAcme, tokBeta = "rr-test-acme-0123456789", "rr-test-beta-0123456789"
	base := startIngestRun(ctx, t, "ingest", []auth.TokenConfig{
		{Name: "acme", SHA256: auth.Hash(tokAcme), Workspaces: map[string]string{"acme": "read-write"}},
		{Name: "beta", SHA256: auth.Hash(tokBeta), Workspaces: map[string]string{"beta": "write"}},
	}, func(cfg *Config) { cfg.HTTP.RateLimit = 200 })

	type answer struct {
		code int
		ans  ingest.Answer
		raw  string
	}
	post := func(token, ctype string, headers map[string]string, body []byte) answer {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events", bytes.NewReader(body))
		req.Header.Set("Content-Type", ctype)
		req.Header.Set("Authorization", "Bearer "+token)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		a := answer{code: resp.StatusCode, raw: string(b)}
		json.Unmarshal(b, &a.ans)
		return a
	}
	at := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	scope := `{"workspace": "acme", "model": "support-bot", "run": "2026-11", "checkpoint": "ckpt-42", "artifact": "prod"}`
	liveData := func(opp, outcome string) string {
		return fmt.Sprintf(`{"scope": %s, "opportunity_id": %q, "correction_id": "refund-policy-fix", "occurred_at": %q, "assessed_at": %q, "outcome": %q}`,
			scope, opp, at, at, outcome)
	}
	structured := func(id, typ, data string) string {
		return fmt.Sprintf(`{"specversion": "1.0", "id": %q, "source": "support-bot/prod", "type": %q, "datacontenttype": "application/json", "data": %s}`,
			id, typ, data)
	}
	accepted := func(what string, a answer, n int) {
		t.Helper()
		if a.code != http.StatusAccepted || a.ans.Accepted != n || len(a.ans.Events) != n {
			t.Fatalf("%s: %d, want 202 with %d accepted: %s", what, a.code, n, a.raw)
		}
	}

	// Structured, binary and batch.
	first := structured("a-1", schemas.TypeLiveAttempt, liveData("conv-1/turn-1", "passed"))
	accepted("structured", post(tokAcme, "application/cloudevents+json", nil, []byte(first)), 1)
	accepted("binary", post(tokAcme, "application/json", map[string]string{"ce-specversion": "1.0", "ce-id": "a-2",
		"ce-source": "support-bot/prod", "ce-type": schemas.TypeLiveAttempt}, []byte(liveData("conv-2/turn-1", "confirmed_repeat"))), 1)
	check := fmt.Sprintf(`{"scope": %s, "suite": "regressions", "case_id": "refund-1", "version": "v1", "version_seq": 1, "run_index": 0, "runs": 1,
		"result": "fail", "correction_id": "refund-policy-fix", "opportunity_id": "refund-1@v1", "occurred_at": %q, "assessed_at": %q}`, scope, at, at)
	accepted("batch", post(tokAcme, "application/cloudevents-batch+json", nil, []byte("["+
		structured("a-3", schemas.TypeLiveAttempt, liveData("conv-3/turn-1", "passed"))+", "+
		structured("e-1", schemas.TypeEvalResult, check)+"]")), 2)

	// Refused: nothing of either request is written.
	bad := post(tokAcme, "application/cloudevents-batch+json", nil, []byte("["+
		structured("a-4", schemas.TypeLiveAttempt, liveData("conv-4/turn-1", "passed"))+", "+
		structured("a-5", schemas.TypeLiveAttempt, liveData("conv-5/turn-1", "maybe"))+"]"))
	if bad.code != http.StatusBadRequest || len(bad.ans.Events) != 2 || bad.ans.Events[1].Reason != schemas.ReasonBadEnum ||
		bad.ans.Events[0].Status != ingest.StatusNotWritten {
		t.Fatalf("invalid event: %d %s", bad.code, bad.raw)
	}
	other := post(tokBeta, "application/cloudevents+json", nil, []byte(structured("a-6", schemas.TypeLiveAttempt, liveData("conv-6/turn-1", "passed"))))
	if other.code != http.StatusForbidden || len(other.ans.Events) != 1 || other.ans.Events[0].Status != ingest.StatusForbidden {
		t.Fatalf("another workspace's token: %d %s", other.code, other.raw)
	}

	// The same event again: accepted (a retry is safe), counted once.
	accepted("the same event again", post(tokAcme, "application/cloudevents+json", nil, []byte(first)), 1)

	// The body limit: the largest body is eval results with long replies (not correction
	// checks, so they leave the repeat rate alone), padded with white space to exactly the
	// limit; one byte more is 413.
	limit := defaultConfig().HTTP.IngestMaxBodyBytes
	reply := strings.Repeat("word ", 12000)
	var big bytes.Buffer
	big.WriteString("[")
	for i := 0; big.Len() < limit-70_000; i++ {
		if i > 0 {
			big.WriteString(",")
		}
		big.WriteString(structured("big-"+strconv.Itoa(i), schemas.TypeEvalResult, fmt.Sprintf(`{"scope": %s, "suite": "long-replies",
			"case_id": "case-%d", "version": "v1", "version_seq": 1, "run_index": 0, "runs": 1, "result": "pass", "prediction": %q,
			"occurred_at": %q, "assessed_at": %q}`, scope, i, reply, at, at)))
	}
	pad := limit - big.Len() - 1
	body := append(append(big.Bytes(), bytes.Repeat([]byte(" "), pad)...), ']')
	if over := post(tokAcme, "application/cloudevents-batch+json", nil, append([]byte(" "), body...)); over.code != http.StatusRequestEntityTooLarge {
		t.Fatalf("one byte over the limit: %d %s", over.code, over.raw)
	}
	if len(body) != limit {
		t.Fatalf("largest body is %d bytes, limit %d", len(body), limit)
	}
	largest := post(tokAcme, "application/cloudevents-batch+json", nil, body)
	if largest.code != http.StatusAccepted || largest.ans.Accepted < 10 {
		t.Fatalf("largest body: %d %.300s", largest.code, largest.raw)
	}

	// A last event of the same aggregate (so on the same partition, after the duplicate): once
	// it is counted, everything before it is.
	accepted("last", post(tokAcme, "application/cloudevents+json", nil,
		[]byte(structured("a-9", schemas.TypeLiveAttempt, liveData("conv-9/turn-1", "passed")))), 1)

	var snaps struct {
		Live       *schemas.Snapshot `json:"live"`
		Evaluation *schemas.Snapshot `json:"evaluation"`
	}
	counts := func(s *schemas.Snapshot) string {
		if s == nil {
			return "none"
		}
		a := s.Windows.All
		return fmt.Sprintf("%d confirmed, %d passed, %d unscored", a.ConfirmedRepeats, a.Passed, a.Unscored)
	}
	// Live: conv-1 (posted twice) and conv-3 and conv-9 passed, conv-2 a repeat; evaluation: the check failed.
	const wantLive, wantEval = "1 confirmed, 3 passed, 0 unscored", "1 confirmed, 0 passed, 0 unscored"
	var got string
	waitFor(t, 60*time.Second, "the snapshots of the ingested events", func() bool {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/snapshots?workspace=acme&model=support-bot&run=2026-11"+
			"&checkpoint=ckpt-42&artifact=prod&correction_id=refund-policy-fix", nil)
		req.Header.Set("Authorization", "Bearer "+tokAcme)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&snaps) != nil {
			return false
		}
		got = counts(snaps.Live) + " / " + counts(snaps.Evaluation)
		return counts(snaps.Live) == wantLive
	})
	if got != wantLive+" / "+wantEval {
		t.Fatalf("snapshots: %s, want %s / %s", got, wantLive, wantEval)
	}
	// The processor saw the second copy and counted it a duplicate (the snapshots are the same
	// with or without it, so it may come in a later batch); nothing was dead-lettered.
	var metrics []byte
	waitFor(t, 30*time.Second, "the second copy counted a duplicate", func() bool {
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		metrics, _ = io.ReadAll(resp.Body)
		return strings.Contains(string(metrics), `repeatrate_observations_total{outcome="duplicate"}`)
	})
	if !strings.Contains(string(metrics), `repeatrate_observations_total{outcome="duplicate"} 1`) ||
		strings.Contains(string(metrics), "repeatrate_dead_letters_total{") {
		t.Errorf("metrics: want one duplicate and no dead letter:\n%s", grepLines(string(metrics), "repeatrate_observations_total", "repeatrate_dead_letters_total"))
	}
}

// grepLines returns the lines of s that start with any of prefixes.
func grepLines(s string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}

// postBatch posts body as a CloudEvents batch to base's /v1/events with token, and returns the
// answer's status and body.
func postBatch(ctx context.Context, t *testing.T, base, token string, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/cloudevents-batch+json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
