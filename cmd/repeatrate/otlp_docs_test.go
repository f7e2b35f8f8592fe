package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/repeatrate/repeatrate/readside"
)

// TestOTLPExampleFromTheDocs runs the curl example of docs/feeding.md#opentelemetry, as written,
// against `repeatrate dev` (only the printed address and token put in): the export is accepted,
// and its live attempt is counted as a confirmed repeat of refund-policy-fix and its eval result
// in suite refunds.
func TestOTLPExampleFromTheDocs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	root, example := feedingExample(t, "## OpenTelemetry")
	base, token, _, out := startDev(t, false)
	script := strings.ReplaceAll(example, "http://127.0.0.1:8080/", base)
	script = regexp.MustCompile(`(?m)^TOKEN=\S+`).ReplaceAllString(script, "TOKEN="+token)
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = root
	answer, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(answer)) != "{}" { // OTLP's empty ExportLogsServiceResponse
		t.Fatalf("the docs' example: %v\n%s\n%s", err, answer, lastLines(out.String(), 10))
	}
	q := url.Values{"workspace": {"acme"}, "model": {"support-bot"}, "run": {"2026-11"}, "checkpoint": {"ckpt-42"}, "artifact": {"prod"}}
	get := func(path string, v any) int {
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		json.NewDecoder(resp.Body).Decode(v)
		return resp.StatusCode
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var page readside.OutcomesPage
		var suites readside.SuitesPage
		if get("v1/outcomes?"+q.Encode(), &page) == 200 && len(page.Items) == 1 && page.Items[0].Live != nil &&
			page.Items[0].Live.Windows.All.ConfirmedRepeats == 1 && page.Items[0].CorrectionID == "refund-policy-fix" &&
			get("v1/suites?workspace=acme", &suites) == 200 && len(suites.Items) == 1 && suites.Items[0] == "refunds" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the example's events were not counted within 30 s: outcomes %+v, suites %+v\n%s", page, suites, lastLines(out.String(), 10))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// feedingExample returns the repository root and the first sh example of docs/feeding.md after
// heading.
func feedingExample(t *testing.T, heading string) (root, example string) {
	t.Helper()
	root, _ = filepath.Abs(filepath.Join("..", ".."))
	doc, err := os.ReadFile(filepath.Join(root, "docs", "feeding.md"))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(doc), heading)
	if i < 0 {
		t.Fatalf("docs/feeding.md has no %q", heading)
	}
	block := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(string(doc)[i:])
	if block == nil {
		t.Fatalf("docs/feeding.md's %q has no sh example", heading)
	}
	return root, block[1]
}
