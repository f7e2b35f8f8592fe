package readside

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
)

// serveCapped serves a server capped at max connections, perIP per address, on a loopback port
// until the test ends, and returns it with its address.
func serveCapped(t *testing.T, max, perIP int) (*HTTP, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), MaxConns: max, MaxConnsPerIP: perIP, Registerer: reg},
		fakeTallies{}, reg, time.Now, zap.NewNop())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return h, l.Addr().String()
}

// idleClient is a keep-alive connection from local address from that made one unauthenticated
// GET /healthz and then holds its slot, as an attacker that repeats the probe before the idle
// timeout does.
func idleClient(t *testing.T, server, from string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("idle client from %s: %v", from, err)
	}
	resp.Body.Close()
	return c
}

// get makes one request on a new connection from local address from.
func get(server, from, path, token string) (int, error) {
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext, DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodGet, "http://"+server+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Connection slots held by idle keep-alive connections (one unauthenticated health probe each,
// then nothing) do not lock anyone out: when the server's cap, or one address's, is reached, the
// longest idle connection is closed to make room, so probes and authorised requests from any
// address keep being answered. Slow connections that never finish a request are still refused
// past the caps (TestSlowConnections).
func TestIdleConnectionsCannotHoldEverySlot(t *testing.T) {
	h, server := serveCapped(t, 8, 4)
	// Two addresses fill the server: 4 idle connections each.
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		for range 4 {
			idleClient(t, server, from)
		}
	}
	for i, c := range []struct{ from, path, token string }{
		{"127.0.0.2", "/healthz", ""}, // one more from an address at its own cap, the server full
		{"127.0.0.4", "/healthz", ""}, // a probe from a third address
		{"127.0.0.5", "/v1/snapshots?workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x", tokenA}, // a reader
		{"127.0.0.4", "/readyz", ""},
	} {
		code, err := get(server, c.from, c.path, c.token)
		if err != nil || code == 0 || code >= 500 {
			t.Fatalf("request %d (%s from %s) with every slot held by idle connections: %d %v", i, c.path, c.from, code, err)
		}
	}
	if n := testutil.ToFloat64(h.metrics.reclaimedConns); n < 1 {
		t.Errorf("%v idle connections reclaimed", n)
	}
	if open := testutil.ToFloat64(h.metrics.openConns); open > 8 {
		t.Errorf("%v connections open, cap 8", open)
	}
}

// A kept-alive connection whose next request's header is on its way is not idle, though the
// server reports the request only once the whole header is read: it is never the one closed to
// make room, and its request is answered.
func TestConnectionWithARequestArrivingIsNotReclaimed(t *testing.T) {
	h, server := serveCapped(t, 2, 2)
	a := idleClient(t, server, "127.0.0.2") // the longest idle: the first choice to close
	idleClient(t, server, "127.0.0.3")
	fmt.Fprintf(a, "GET /healthz HTTP/1.1\r\nHost: x\r\n") // the header's last line not yet sent
	busy := func() bool {
		cl := h.conns.Load()
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for c := range cl.conns {
			if c.ip == "127.0.0.2" {
				return c.idleSince.IsZero()
			}
		}
		return false
	}
	for deadline := time.Now().Add(10 * time.Second); !busy(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server did not read the arriving header within 10 s")
		}
	}
	if code, err := get(server, "127.0.0.4", "/healthz", ""); err != nil || code != http.StatusOK {
		t.Fatalf("a probe while the server is full: %d %v", code, err)
	}
	fmt.Fprintf(a, "\r\n")
	a.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(a), nil)
	if err != nil {
		t.Fatalf("the request arriving on a kept-alive connection: %v (closed to make room)", err)
	}
	resp.Body.Close()
}
