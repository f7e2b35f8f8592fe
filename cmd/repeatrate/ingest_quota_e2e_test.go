package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/schemas"
)

// TestIngestStopsAWorkspaceAtItsRetainedQuota runs `run` on real Kafka and Redis with a quota of
// 50 retained opportunities per workspace: acme posts 60 opportunities (taken: it held none),
// and once the processor has counted them and the read side recorded their snapshots, acme's next
// post is refused 429 naming its count and quota, while beta, beside it, is still taken.
func TestIngestStopsAWorkspaceAtItsRetainedQuota(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const tokAcme, tokBeta = "rr-test-acme-0123456789", "rr-test-beta-0123456789"
	base := startIngestRun(ctx, t, "quota", []auth.TokenConfig{
		{Name: "acme", SHA256: auth.Hash(tokAcme), Workspaces: map[string]string{"acme": "write"}},
		{Name: "beta", SHA256: auth.Hash(tokBeta), Workspaces: map[string]string{"beta": "write"}},
	}, func(cfg *Config) { cfg.HTTP.IngestWorkspaceRetained = 50 })
	at := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	batch := func(ws, prefix string, n int) []byte {
		var evs []string
		for i := range n {
			evs = append(evs, fmt.Sprintf(`{"specversion": "1.0", "id": "%s-%d", "source": "quota-test", "type": %q, "data": {"scope": {"workspace": %q, "model": "m", "run": "r", "checkpoint": "c", "artifact": "a"}, "opportunity_id": "%s-%d", "correction_id": "fix", "occurred_at": %q, "assessed_at": %q, "outcome": "passed"}}`,
				prefix, i, schemas.TypeLiveAttempt, ws, prefix, i, at, at))
		}
		return []byte("[" + strings.Join(evs, ",") + "]")
	}
	post := func(token string, body []byte) (int, string) {
		t.Helper()
		return postBatch(ctx, t, base, token, body)
	}
	if code, body := post(tokAcme, batch("acme", "a", 60)); code != http.StatusAccepted {
		t.Fatalf("acme's first 60: %d %.300s", code, body)
	}
	var code int
	var body string
	waitFor(t, 60*time.Second, "acme refused at its quota", func() bool {
		code, body = post(tokAcme, batch("acme", "b", 1))
		return code == http.StatusTooManyRequests
	})
	if !strings.Contains(body, `workspace \"acme\" retains`) || !strings.Contains(body, "its quota is 50") {
		t.Fatalf("the refusal does not say why: %s", body)
	}
	if code, body := post(tokBeta, batch("beta", "c", 10)); code != http.StatusAccepted {
		t.Fatalf("beta beside acme at its quota: %d %.300s", code, body)
	}
}
