package readside

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
)

// The probes have a listener of their own (ProbeAddr), outside the API's connection caps: with
// every API slot held by connections that never finish a request (which the caps count before
// any request can authenticate, and which are not reclaimed), /healthz and /readyz still answer
// there, so a client cannot fail the liveness probe and have the processor restarted. On the API
// address the same probe is refused, as before.
func TestProbesAnswerWithEveryAPISlotHeld(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), MaxConns: 4, MaxConnsPerIP: 4, Registerer: reg, ProbeAddr: "unused"},
		fakeTallies{}, reg, time.Now, zap.NewNop())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.ServeWithProbes(ctx, l, pl) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	}()
	server, probes := l.Addr().String(), pl.Addr().String()
	// Four connections that send half a request header and stop: every slot of the API.
	for range 4 {
		c, err := net.Dial("tcp", server)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(h.metrics.openConns) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%v connections open, want the 4 slow ones", testutil.ToFloat64(h.metrics.openConns))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, err := get(server, "127.0.0.1", "/healthz", ""); err == nil && code == 200 {
		t.Fatal("the API answered a probe with every slot held: the test holds nothing")
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, err := get(probes, "127.0.0.1", path, ""); err != nil || code != 200 {
			t.Errorf("%s on the probe listener with every API slot held: %d %v", path, code, err)
		}
	}
	// Only the probes: the API is not served there.
	if code, _ := get(probes, "127.0.0.1", "/v1/snapshots", tokenA); code != 404 {
		t.Errorf("/v1/snapshots on the probe listener: %d, want 404", code)
	}
}
