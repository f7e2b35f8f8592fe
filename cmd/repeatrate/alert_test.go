package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAlertRulesRefusedAtStart: a rules file with mistakes stops `alert` (and `run`) before any
// connection, with an error naming each rule and field.
func TestAlertRulesRefusedAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	bad := "rules:\n- name: back\n  kind: change\n  alpha: 2\n- name: high\n  kind: threshold\n  value: 20\n"
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"alert", "run"} {
		var stderr bytes.Buffer
		err := run(context.Background(), []string{cmd, "--alert-rules", path, "--http-addr", ""}, func(string) string { return "" }, nil, &stderr, &stderr)
		if err == nil {
			t.Fatalf("%s: started with a bad rules file", cmd)
		}
		for _, want := range []string{`rule "back": alpha: 2`, `rule "high": value: 20`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error lacks %q: %v", cmd, want, err)
			}
		}
	}
}

// TestAlertWebhookNeedsSecret: a webhook URL without a secret of at least 16 bytes stops the
// start, and the error does not show the secret it was given.
func TestAlertWebhookNeedsSecret(t *testing.T) {
	env := map[string]string{"REPEATRATE_ALERT_WEBHOOK_SECRET": "tiny-secret"}
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"run", "--alert-webhook-url", "http://127.0.0.1:1/hook", "--http-addr", ""},
		func(k string) string { return env[k] }, nil, &stderr, &stderr)
	if err == nil || !strings.Contains(err.Error(), "alert_webhook_secret") {
		t.Fatalf("started with an 11-byte webhook secret: %v", err)
	}
	if strings.Contains(err.Error()+stderr.String(), "tiny-secret") {
		t.Errorf("the secret shows: %v %s", err, stderr.String())
	}
}
