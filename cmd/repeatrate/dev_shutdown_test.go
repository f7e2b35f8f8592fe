package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestDevStopsPromptlyWhileFlooded runs `repeatrate dev` and floods it as an overloaded
// workstation sees it — 16 clients posting 1 MiB batches (a workspace each, so that the quotas
// let them load it: 40 batches taken before the signal) and 8 asking for 200-outcome pages, none
// of them stopping — then sends SIGTERM with the flood still on: dev exits 0 within 20 s (an
// overloaded dev once did not exit 25 s after SIGTERM; its HTTP server gives requests 5 s, and the
// ingest's writes 10 s more at most).
func TestDevStopsPromptlyWhileFlooded(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cmd := exec.Command(buildBinary(t), "dev", "--demo", "--kafka-addr=127.0.0.1:0", "--redis-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0")
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer cmd.Process.Kill()

	ingestLine := regexp.MustCompile(`POST (http://\S+/v1/events)`)
	tokenLine := regexp.MustCompile(`token: +(rr_dev_[0-9a-f]+)`)
	var ingestURL, token string
	for deadline := time.Now().Add(30 * time.Second); ingestURL == "" || token == ""; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("dev did not print its ingest URL and token:\n%s", lastLines(out.String(), 20))
		}
		if m := ingestLine.FindStringSubmatch(out.String()); m != nil {
			ingestURL = m[1]
		}
		if m := tokenLine.FindStringSubmatch(out.String()); m != nil {
			token = m[1]
		}
	}
	base := strings.TrimSuffix(ingestURL, "/v1/events")

	at := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	// One workspace per posting client: each workspace's quota of events per second would
	// otherwise refuse most of the flood before it loads anything.
	bodyOf := func(ws string) string {
		var evs []string
		for size, j := 2, 0; size < 1<<20-2048; j++ {
			ev := fmt.Sprintf(`{"specversion":"1.0","id":"f-%d","source":"flood","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":%q,"model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":"o-%d","correction_id":"fix-%d","occurred_at":%q,"assessed_at":%q,"outcome":"passed"}}`,
				j, ws, j, j%200, at, at)
			evs = append(evs, ev)
			size += len(ev) + 1
		}
		return "[" + strings.Join(evs, ",") + "]"
	}
	ctx, stopFlood := context.WithCancel(context.Background())
	var answered, accepted atomic.Int64
	var wg sync.WaitGroup
	defer func() { stopFlood(); wg.Wait() }()
	flood := func(n int, req func(i int) *http.Request) {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					resp, err := http.DefaultClient.Do(req(i).WithContext(ctx))
					if err != nil {
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					answered.Add(1)
					if resp.StatusCode == http.StatusAccepted {
						accepted.Add(1)
					}
				}
			}()
		}
	}
	bodies := make([]string, 16)
	for i := range bodies {
		bodies[i] = bodyOf(fmt.Sprintf("flood-%d", i))
	}
	flood(16, func(i int) *http.Request {
		r, _ := http.NewRequest(http.MethodPost, ingestURL, strings.NewReader(bodies[i]))
		r.Header.Set("Content-Type", "application/cloudevents-batch+json")
		r.Header.Set("Authorization", "Bearer "+token)
		return r
	})
	flood(8, func(int) *http.Request {
		r, _ := http.NewRequest(http.MethodGet, base+"/v1/outcomes?workspace=flood&model=m&run=r&checkpoint=c&artifact=a&limit=200", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		return r
	})
	// Loaded: dozens of megabyte batches taken (written to Kafka and being processed).
	waitFor(t, 2*time.Minute, "the flood to be taken", func() bool { return accepted.Load() >= 40 })

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("dev exited with %v on SIGTERM under the flood, want 0\n%s", err, lastLines(out.String(), 10))
		}
		t.Logf("dev exited %.1f s after SIGTERM; %d flood requests answered, %d batches taken", time.Since(sent).Seconds(), answered.Load(), accepted.Load())
	case <-time.After(20 * time.Second):
		t.Fatalf("dev did not exit within 20 s of SIGTERM under the flood\n%s", lastLines(out.String(), 10))
	}
}
