package readside

import (
	"bufio"
	"fmt"
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

// pacingServer serves cfg with the test tokens and a registry of its own; held reads its count
// of held refusals.
func pacingServer(t *testing.T, cfg HTTPConfig) (srv *httptest.Server, held func() float64) {
	reg := prometheus.NewRegistry()
	cfg.Tokens, cfg.Registerer = testTokens(t), reg
	srv = httptest.NewServer(NewHTTP(cfg, fakeTallies{}, reg, time.Now, zap.NewNop()).Handler())
	t.Cleanup(srv.Close)
	return srv, func() float64 { return gathered(t, reg, "repeatrate_http_held_requests_total", "") }
}

// A client that ignores Retry-After and sends again at once, from several connections, is paced
// by the server: its early requests wait for their Retry-After, so it gets a handful of answers
// a second, not a refusal as fast as it can send (each refusal costs the server a request, and a
// refused upload its connection). What it is allowed is still served.
func TestClientsIgnoringRetryAfterArePaced(t *testing.T) {
	srv, held := pacingServer(t, HTTPConfig{RateLimit: 1, RateBurst: 1})
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
	if held := held(); held < 1 {
		t.Fatalf("held %v requests", held)
	}
	t.Logf("%d loops for %s: %d served, %d refused", loops, elapsed.Round(time.Millisecond), served.Load(), refused.Load())
}

// A client that waits the Retry-After it was given is never held, and is served when it sends
// again.
func TestClientHonouringRetryAfterIsNotHeld(t *testing.T) {
	srv, held := pacingServer(t, HTTPConfig{RateLimit: 1, RateBurst: 1})
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
	if held := held(); held != 0 {
		t.Fatalf("a client that waited as told was held %v times", held)
	}
}

// Only refusals wait: a request the limits admit is served at once, even from a token refused a
// moment ago on another connection, a read sent once an in-flight slot is free, or a post for
// another workspace than the one the ingest refused (its 429s are per workspace).
func TestRequestsTheLimitsAdmitAreNeverHeld(t *testing.T) {
	ingest := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Query().Get("ws") == "full" { // as a retained quota: no Retry-After
			http.Error(w, "workspace full retains its quota", http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	})
	srv, held := pacingServer(t, HTTPConfig{RateLimit: 10, RateBurst: 3, Ingest: ingest})
	url := srv.URL + "/v1/snapshots?" + everyParam("w")

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

// halfClosedGet sends one GET on a connection of its own, half-closes it (net/http then ends the
// request's context) and reads the answer.
func halfClosedGet(t *testing.T, addr, path, token string) (int, http.Header) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", path, token)
	c.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// A client that half-closes each connection after its request is paced like any other, and
// each held refusal is answered with its 429 (not an empty 200).
func TestHalfClosingClientsArePacedAndAnswered(t *testing.T) {
	srv, held := pacingServer(t, HTTPConfig{RateLimit: 1, RateBurst: 1})
	addr, path := strings.TrimPrefix(srv.URL, "http://"), "/v1/snapshots?"+everyParam("w")
	getWith(t, srv.URL+path, tokenA) // the burst
	start := time.Now()
	refused := 0
	for time.Since(start) < 1500*time.Millisecond && refused < 100 {
		code, hdr := halfClosedGet(t, addr, path, tokenA)
		switch {
		case code == http.StatusTooManyRequests && hdr.Get("Retry-After") != "":
			refused++
		case code != http.StatusNotFound:
			t.Fatalf("half-closed client: %d", code)
		}
	}
	elapsed := time.Since(start)
	if most := int(2*elapsed.Seconds() + 2); refused > most {
		t.Fatalf("a loop of half-closed requests was refused %d times in %s; paced, at most %d", refused, elapsed.Round(time.Millisecond), most)
	}
	if held := held(); held < 1 {
		t.Fatalf("held %v", held)
	}
}

// A refusal waits only for its own limit's Retry-After: a client whose ingest is refused for
// 30 s (its workspace's quota) gets its reads' first rate-limit refusal at once.
func TestARefusalWaitsOnlyForItsOwnLimit(t *testing.T) {
	ingest := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Retry-After", "30")
		http.Error(w, "workspace over its quota", http.StatusTooManyRequests)
	})
	srv, held := pacingServer(t, HTTPConfig{RateLimit: 1, RateBurst: 2, Ingest: ingest})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+IngestPath, strings.NewReader("[]"))
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("ingest: %d", resp.StatusCode)
	}
	url := srv.URL + "/v1/snapshots?" + everyParam("w")
	if code, _, _ := getWith(t, url, tokenA); code != http.StatusNotFound {
		t.Fatalf("read: %d", code)
	}
	if code, _, _ := getWith(t, url, tokenA); code != http.StatusTooManyRequests {
		t.Fatalf("read past the rate: %d", code)
	}
	if held := held(); held != 0 {
		t.Fatalf("the read's first refusal was held (%v) by the ingest's Retry-After", held)
	}
}

// A held refusal's Retry-After counts from when it was decided: the time it was held is taken
// off what it answers, and the key is not paced for longer than that.
func TestHeldRefusalIsCountedFromWhenItWasDecided(t *testing.T) {
	srv, held := pacingServer(t, HTTPConfig{RateLimit: 1, RateBurst: 1})
	url := srv.URL + "/v1/snapshots?" + everyParam("w")
	getWith(t, url, tokenA)
	if code, _, _ := getWith(t, url, tokenA); code != http.StatusTooManyRequests {
		t.Fatalf("not refused: %d", code)
	}
	code, hdr, _ := getWith(t, url, tokenA)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") != "1" || held() != 1 {
		t.Fatalf("sent again at once: %d, Retry-After %q, held %v", code, hdr.Get("Retry-After"), held())
	}
	// Its Retry-After (1 s) was decided before it was held for about that: it has passed. The
	// bucket has refilled meanwhile, so this one is served, unheld.
	if code, _, _ := getWith(t, url, tokenA); code != http.StatusNotFound || held() != 1 {
		t.Fatalf("after the held refusal: %d, held %v", code, held())
	}
}

// At most perKey refusals of a key wait at once; a key whose Retry-After has passed, or another
// key, is not held, and nothing stays counted.
func TestEarlyRetryHoldsAreBounded(t *testing.T) {
	var held atomic.Int64
	e := newEarlyRetries(time.Minute, 1, time.Now, func() { held.Add(1) })
	e.refused("token a|rate", time.Now().Add(300*time.Millisecond))

	first := make(chan time.Duration)
	go func() { first <- e.hold("token a|rate") }()
	for held.Load() == 0 { // until the first is held
		time.Sleep(time.Millisecond)
	}
	if d := e.hold("token a|rate"); d != 0 { // past the key's cap
		t.Fatalf("a refusal past the key's cap waited %s", d)
	}
	if d := e.hold("token a|budget") + e.hold("token b|rate") + e.hold("addr a|rate"); d != 0 {
		t.Fatalf("other keys waited %s", d)
	}
	if d := <-first; d <= 0 || d > 300*time.Millisecond {
		t.Fatalf("the held refusal waited %s, want its Retry-After's 300 ms at most", d)
	}
	if held.Load() != 1 {
		t.Fatalf("held %d refusals, want 1", held.Load())
	}
	e.mu.Lock()
	n := len(e.count)
	e.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys still counted as held", n)
	}
	if d := e.hold("token a|rate"); d != 0 {
		t.Fatalf("held %s after the Retry-After passed", d)
	}
}

// At most maxLimiterKeys addresses are remembered: past that a new address is not held until a
// Retry-After has passed, and the full memory is scanned again only then; a token is always
// remembered, so outsiders cycling addresses cannot switch its pacing off.
func TestEarlyRetriesRememberBoundedAddresses(t *testing.T) {
	now := time.Unix(1000, 0)
	e := newEarlyRetries(time.Minute, 1, func() time.Time { return now }, func() {})
	for i := range maxLimiterKeys {
		e.refused("addr "+strconv.Itoa(i)+"|rate", now.Add(time.Duration(1+i%2)*time.Second))
	}
	e.refused("addr new|rate", now.Add(time.Second))
	e.refused("token a|rate", now.Add(time.Second))
	if _, ok := e.addrs["addr new|rate"]; ok || len(e.addrs) != maxLimiterKeys {
		t.Fatalf("remembered %d addresses, the new one %v", len(e.addrs), ok)
	}
	if _, ok := e.tokens["token a|rate"]; !ok {
		t.Fatal("a token was crowded out by addresses")
	}
	if want := now.Add(time.Second); !e.nextPrune.Equal(want) {
		t.Fatalf("next scan at %v, want %v (the earliest Retry-After)", e.nextPrune, want)
	}
	now = now.Add(1500 * time.Millisecond) // half of them have passed
	e.refused("addr new|rate", now.Add(time.Second))
	if _, ok := e.addrs["addr new|rate"]; !ok || len(e.addrs) != maxLimiterKeys/2+1 {
		t.Fatalf("after half the Retry-Afters passed: %d addresses, the new one %v", len(e.addrs), ok)
	}
}
