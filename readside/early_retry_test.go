package readside

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// A client that ignores Retry-After and sends again at once, from several connections, is paced
// by the server: its early requests wait for their Retry-After, so it gets a handful of answers
// a second, not a refusal as fast as it can send (each refusal costs the server a request, and a
// refused upload its connection). What it is allowed is still served.
func TestClientsIgnoringRetryAfterArePaced(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), RateLimit: 1, RateBurst: 1, Registerer: reg}, fakeTallies{}, reg, time.Now, zap.NewNop())
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	url := srv.URL + "/v1/snapshots?" + everyParam("w")

	const loops, run = 4, 2 * time.Second
	var refused, served atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < run {
				switch code, _, body := getWith(t, url, tokenA); code {
				case http.StatusTooManyRequests:
					refused.Add(1)
				case http.StatusNotFound: // answered: the fake store holds no such aggregate
					served.Add(1)
				default:
					t.Errorf("%d %s", code, body)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	// Each loop waits for the Retry-After (1 s) its token was given before each answer but the
	// first refusal: about two answers a second per loop, whatever the machine's speed.
	if most := int64(loops * (2*elapsed.Seconds() + 2)); refused.Load() > most {
		t.Fatalf("%d loops ignoring Retry-After for %s were refused %d times; paced, at most %d", loops, elapsed.Round(time.Millisecond), refused.Load(), most)
	}
	// The bucket still serves what it allows (1 + 1/s), no more.
	if allowed := int64(1 + elapsed.Seconds() + 1); served.Load() < 2 || served.Load() > allowed {
		t.Fatalf("served %d in %s, the rate limit allows %d", served.Load(), elapsed.Round(time.Millisecond), allowed)
	}
	if held := gathered(t, reg, "repeatrate_http_held_requests_total", ""); held < 1 {
		t.Fatalf("held %v requests", held)
	}
	t.Logf("%d loops for %s: %d served, %d refused", loops, elapsed.Round(time.Millisecond), served.Load(), refused.Load())
}

// A client that waits the Retry-After it was given is never held, and is served when it sends
// again.
func TestClientHonouringRetryAfterIsNotHeld(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), RateLimit: 1, RateBurst: 1, Registerer: reg}, fakeTallies{}, reg, time.Now, zap.NewNop())
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	url := srv.URL + "/v1/snapshots?" + everyParam("w")
	if code, _, body := getWith(t, url, tokenA); code != http.StatusNotFound {
		t.Fatalf("first request: %d %s", code, body)
	}
	code, hdr, _ := getWith(t, url, tokenA)
	secs, err := strconv.Atoi(hdr.Get("Retry-After"))
	if code != http.StatusTooManyRequests || err != nil || secs < 1 {
		t.Fatalf("second request: %d, Retry-After %q", code, hdr.Get("Retry-After"))
	}
	time.Sleep(time.Duration(secs) * time.Second) // as told
	if code, _, body := getWith(t, url, tokenA); code != http.StatusNotFound {
		t.Fatalf("after Retry-After: %d %s", code, body)
	}
	if held := gathered(t, reg, "repeatrate_http_held_requests_total", ""); held != 0 {
		t.Fatalf("a client that waited as told was held %v times", held)
	}
}

// Only refusals wait: a request the limits admit is served at once, even from a token refused a
// moment ago on another connection, a read sent once an in-flight slot is free, or a post for
// another workspace than the one the ingest refused (its 429s are per workspace).
func TestRequestsTheLimitsAdmitAreNeverHeld(t *testing.T) {
	reg := prometheus.NewRegistry()
	ingest := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Query().Get("ws") == "full" { // as a retained quota: no Retry-After
			http.Error(w, "workspace full retains its quota", http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), RateLimit: 10, RateBurst: 3, Ingest: ingest, Registerer: reg}, fakeTallies{}, reg, time.Now, zap.NewNop())
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	url := srv.URL + "/v1/snapshots?" + everyParam("w")
	held := func() float64 { return gathered(t, reg, "repeatrate_http_held_requests_total", "") }

	var refusedAt time.Time
	for i := 0; refusedAt.IsZero(); i++ { // past the burst
		code, hdr, _ := getWith(t, url, tokenA)
		if code == http.StatusTooManyRequests && hdr.Get("Retry-After") == "1" {
			refusedAt = time.Now()
		} else if code != http.StatusNotFound || i > 10 {
			t.Fatalf("request %d: %d, Retry-After %q", i, code, hdr.Get("Retry-After"))
		}
	}
	// The bucket refills a request in 100 ms, well within the Retry-After (1 s, whole seconds).
	time.Sleep(110 * time.Millisecond)
	if code, _, body := getWith(t, url, tokenA); code != http.StatusNotFound || held() != 0 {
		t.Fatalf("a request the bucket admits, within a refusal's Retry-After: %d %s, held %v", code, body, held())
	}
	if time.Since(refusedAt) >= time.Second {
		t.Log("the machine took longer than the Retry-After: the request above came after it")
	}

	post := func(ws string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+IngestPath+"?ws="+ws, strings.NewReader("[]"))
		req.Header.Set("Authorization", "Bearer "+tokenB)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("full"); code != http.StatusTooManyRequests {
		t.Fatalf("post for the full workspace: %d", code)
	}
	refusedAt = time.Now()
	if code := post("other"); code != http.StatusAccepted || held() != 0 {
		t.Fatalf("post for another workspace right after: %d, held %v", code, held())
	}
	// The full workspace's refusal, sent again at once, waits: a 429 without Retry-After is
	// paced as one of a second.
	early := time.Since(refusedAt) < time.Second
	code := post("full")
	if code != http.StatusTooManyRequests || (early && held() != 1) {
		t.Fatalf("post for the full workspace again: %d, held %v (within the refusal's second: %v)", code, held(), early)
	}
}

// A held refusal is still answered, with its 429, when its client half-closes the connection
// (net/http then cancels the request's context): not an empty 200.
func TestHeldRefusalIsAnsweredWhenTheClientHalfCloses(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), RateLimit: 1, RateBurst: 1, Registerer: reg}, fakeTallies{}, reg, time.Now, zap.NewNop())
	srv := httptest.NewServer(h.Handler())
	defer srv.Close()
	url := srv.URL + "/v1/snapshots?" + everyParam("w")
	getWith(t, url, tokenA)
	if code, _, _ := getWith(t, url, tokenA); code != http.StatusTooManyRequests {
		t.Fatalf("not refused: %d", code)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /v1/snapshots?"+everyParam("w")+" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+tokenA+"\r\nConnection: close\r\n\r\n")
	c.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("half-closed client: %d %q", resp.StatusCode, b)
	}
}

// At most perKey refusals of a key wait at once; one whose client left is answered at once; a
// key whose Retry-After has passed, or another key, is not held, and nothing stays counted.
func TestEarlyRetryHoldsAreBounded(t *testing.T) {
	var held atomic.Int64
	e := newEarlyRetries(time.Minute, 1, time.Now, func() { held.Add(1) })
	e.refused("token a", "30")

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan struct{})
	go func() {
		e.hold(ctx, "token a")
		close(first)
	}()
	for held.Load() == 0 { // until the first is held
		time.Sleep(time.Millisecond)
	}
	e.hold(context.Background(), "token a") // past the key's cap: at once
	e.hold(context.Background(), "token b") // never refused: at once
	e.hold(context.Background(), "addr a")
	select {
	case <-first:
		t.Fatal("the held refusal was let go before its Retry-After")
	default:
	}
	cancel()
	<-first
	if held.Load() != 1 {
		t.Fatalf("held %d refusals, want 1", held.Load())
	}
	e.mu.Lock()
	n := len(e.count)
	e.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys still counted as held", n)
	}
}

// At most maxLimiterKeys addresses are remembered: past that a new address is not held until a
// Retry-After has passed, and the full memory is scanned again only then; a token is always
// remembered, so outsiders cycling addresses cannot switch its pacing off.
func TestEarlyRetriesRememberBoundedAddresses(t *testing.T) {
	now := time.Unix(1000, 0)
	e := newEarlyRetries(time.Minute, 1, func() time.Time { return now }, func() {})
	for i := range maxLimiterKeys {
		e.refused("addr "+strconv.Itoa(i), strconv.Itoa(1+i%2))
	}
	e.refused("addr new", "1")
	e.refused("token a", "1")
	if _, ok := e.addrs["addr new"]; ok || len(e.addrs) != maxLimiterKeys {
		t.Fatalf("remembered %d addresses, the new one %v", len(e.addrs), ok)
	}
	if _, ok := e.tokens["token a"]; !ok {
		t.Fatal("a token was crowded out by addresses")
	}
	if want := now.Add(time.Second); !e.nextPrune.Equal(want) {
		t.Fatalf("next scan at %v, want %v (the earliest Retry-After)", e.nextPrune, want)
	}
	now = now.Add(1500 * time.Millisecond) // half of them have passed
	e.refused("addr new", "1")
	if _, ok := e.addrs["addr new"]; !ok || len(e.addrs) != maxLimiterKeys/2+1 {
		t.Fatalf("after half the Retry-Afters passed: %d addresses, the new one %v", len(e.addrs), ok)
	}
}
