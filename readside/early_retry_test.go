package readside

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// At most perKey requests of a key are held at once; a client that leaves while held is
// answered nothing; a key whose Retry-After has passed, or another key, is not held.
func TestEarlyRetryHoldsAreBounded(t *testing.T) {
	var held atomic.Int64
	e := newEarlyRetries(time.Minute, 1, time.Now, func() { held.Add(1) })
	e.refused("token a", "30")

	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan bool)
	go func() { first <- e.wait(ctx, "token a") }()
	for held.Load() == 0 { // until the first is held
		time.Sleep(time.Millisecond)
	}
	if !e.wait(context.Background(), "token a") {
		t.Fatal("a request past the key's hold cap was not let through")
	}
	if !e.wait(context.Background(), "token b") {
		t.Fatal("another key was held")
	}
	select {
	case <-first:
		t.Fatal("the held request was let go before its Retry-After")
	default:
	}
	cancel()
	if <-first {
		t.Fatal("a request whose client left was let through")
	}
	if held.Load() != 1 {
		t.Fatalf("held %d requests, want 1", held.Load())
	}
	e.mu.Lock()
	n := len(e.count)
	e.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys still counted as held", n)
	}

	// Past maxLimiterKeys keys, a new key is not remembered (not held) until a Retry-After passes.
	now := time.Unix(1000, 0)
	e = newEarlyRetries(time.Minute, 1, func() time.Time { return now }, func() {})
	for i := range maxLimiterKeys {
		e.refused("addr "+strconv.Itoa(i), "1")
	}
	e.refused("addr new", "1")
	if _, ok := e.until["addr new"]; ok || len(e.until) != maxLimiterKeys {
		t.Fatalf("remembered %d keys, the new one %v", len(e.until), ok)
	}
	now = now.Add(2 * time.Second)
	e.refused("addr new", "1")
	if _, ok := e.until["addr new"]; !ok || len(e.until) != 1 {
		t.Fatalf("after every Retry-After passed: %d keys, the new one %v", len(e.until), ok)
	}
}
