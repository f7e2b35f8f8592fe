package readside

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []schemas.Snapshot) error { return nil }
func (nopPublisher) PublishSuites(context.Context, suite.Output, time.Time) error {
	return nil
}

// mutableTallies is a TallyReader whose answers a test changes.
type mutableTallies struct {
	mu sync.Mutex
	t  map[aggregator.Key]aggregator.Tally
}

func (m *mutableTallies) Tally(_ context.Context, k aggregator.Key, _ time.Time) (aggregator.Tally, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.t[k], nil
}

// sseIDs reads events from a stream until it has n ids or the deadline passes.
func sseIDs(t *testing.T, sc *bufio.Scanner, n int) []int64 {
	t.Helper()
	var ids []int64
	for len(ids) < n && sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			v, _ := strconv.ParseInt(id, 10, 64)
			ids = append(ids, v)
		}
	}
	return ids
}

// TestStream: a stream of one aggregate receives each published version in order; after a
// disconnect, resuming with Last-Event-ID sends the current snapshot (newer than the id) and then
// new versions, never one at or below the id; another workspace's snapshots never appear.
func TestStream(t *testing.T) {
	client := testenv.Redis(t)
	prefix := testenv.Name(t, "stream")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	key := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	other := key
	other.Scope.Workspace = "other"
	tallies := &mutableTallies{t: map[aggregator.Key]aggregator.Tally{}}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat}, tallies, prometheus.NewRegistry(), func() time.Time { return now }, zap.NewNop())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, l) }()
	defer func() { cancel(); <-done }()

	publish := func(k aggregator.Key, v int64) {
		t.Helper()
		tally := aggregator.Tally{Version: v, All: aggregator.Counts{Passed: v}}
		tallies.mu.Lock()
		tallies.t[k] = tally
		tallies.mu.Unlock()
		if err := rec.Publish(ctx, []schemas.Snapshot{tally.Snapshot(k, now)}); err != nil {
			t.Fatal(err)
		}
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	open := func(last string) (*bufio.Scanner, []int64, func()) {
		t.Helper()
		sctx, stop := context.WithTimeout(ctx, 20*time.Second)
		req, _ := http.NewRequestWithContext(sctx, http.MethodGet, "http://"+l.Addr().String()+"/v1/stream?"+
			"workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x", nil)
		req.Header.Set("Authorization", "Bearer "+tokenA)
		if last != "" {
			req.Header.Set("Last-Event-ID", last)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("stream: %v %v", err, resp)
		}
		sc := bufio.NewScanner(resp.Body)
		// Read the catch-up up to its end marker, so the stream is subscribed before we publish.
		var ids []int64
		for sc.Scan() && sc.Text() != ": live" {
			if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
				v, _ := strconv.ParseInt(id, 10, 64)
				ids = append(ids, v)
			}
		}
		return sc, ids, func() { stop(); resp.Body.Close() }
	}
	publish(key, 1)
	sc, caught, stop := open("")
	for _, v := range []int64{2, 3} {
		publish(other, v+100) // another workspace: never streamed
		publish(key, v)
	}
	// The catch-up finds version 1 through the index.
	if ids := append(caught, sseIDs(t, sc, 2)...); len(ids) != 3 || ids[0] != 1 || ids[1] != 2 || ids[2] != 3 {
		t.Fatalf("first connection: ids %v, want [1 2 3]", ids)
	}
	stop()
	publish(key, 4)
	publish(key, 5)
	sc, caught, stop = open("3")
	defer stop()
	publish(key, 6)
	ids := append(caught, sseIDs(t, sc, 1)...)
	if len(ids) != 2 || ids[0] != 5 || ids[1] != 6 {
		t.Fatalf("resumed after 3: ids %v, want [5 6] (the current snapshot, then new ones)", ids)
	}
}

// slowDial delays every new connection of a client: a Redis slow to accept the server's
// subscription connection.
type slowDial struct{ delay time.Duration }

func (s slowDial) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		time.Sleep(s.delay)
		return next(ctx, network, addr)
	}
}
func (slowDial) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (slowDial) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A stream goes live (": live") only once the server's subscription to the channel is
// confirmed: what is published after that reaches it. Here the subscription's connection takes
// 2 s; before, a stream opened at once went live without it, and the versions published next
// were lost (TestStream failed so on a loaded machine).
func TestStreamGoesLiveOnlyWhenSubscribed(t *testing.T) {
	client := testenv.Redis(t) // connected: only the subscription dials anew
	client.AddHook(slowDial{2 * time.Second})
	prefix := testenv.Name(t, "stream-subscribed")
	testenv.CleanPrefix(t, client, prefix)
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	key := aggregator.Key{Scope: schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}, CorrectionID: "x", Source: aggregator.Live}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat}, &mutableTallies{t: map[aggregator.Key]aggregator.Tally{}}, prometheus.NewRegistry(), func() time.Time { return now }, zap.NewNop())
	addr, ctx := serveStreams(t, h)

	sctx, stop := context.WithTimeout(ctx, 8*time.Second)
	defer stop()
	req, _ := http.NewRequestWithContext(sctx, http.MethodGet, "http://"+addr+"/v1/stream?workspace=w&correction_id=x", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", err, resp)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && sc.Text() != ": live" {
	}
	for _, v := range []int64{1, 2} {
		tally := aggregator.Tally{Version: v, All: aggregator.Counts{Passed: v}}
		if err := rec.Publish(ctx, []schemas.Snapshot{tally.Snapshot(key, now)}); err != nil {
			t.Fatal(err)
		}
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ids := sseIDs(t, sc, 2); len(ids) != 2 || ids[0] != 1 || ids[1] != 2 {
		t.Fatalf("ids %v after going live, want [1 2]", ids)
	}
}

// Without a subscription (Redis down) a stream is refused with 503 after streamSubscribeWait,
// not answered 200 and left silent.
func TestStreamRefusedWithoutSubscription(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer dead.Close()
	cat := NewCatalog(dead, testenv.Name(t, "stream-dead"), time.Hour)
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat}, &mutableTallies{t: map[aggregator.Key]aggregator.Tally{}}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	addr, _ := serveStreams(t, h)
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/stream?workspace=w", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("stream without a subscription: %d, want 503", resp.StatusCode)
	}
}

// openLive opens a stream of workspace w on addr and reads it to its ": live" marker.
func openLive(t *testing.T, ctx context.Context, addr string) (*bufio.Scanner, func()) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/stream?workspace=w&correction_id=x", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", err, resp)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && sc.Text() != ": live" {
	}
	return sc, func() { resp.Body.Close() }
}

// What is published while the server's subscription is lost never reaches its streams, so when
// go-redis subscribes again the server closes every stream: each client resumes with
// Last-Event-ID and catches up. Here the subscription's connection is killed (CLIENT KILL TYPE
// pubsub); before, the stream stayed open and silent about what it had missed.
func TestStreamsClosedWhenTheSubscriptionIsMadeAgain(t *testing.T) {
	client := testenv.Redis(t)
	cat := NewCatalog(client, testenv.Name(t, "stream-resubscribe"), time.Hour)
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: cat}, &mutableTallies{t: map[aggregator.Key]aggregator.Tally{}}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	addr, ctx := serveStreams(t, h)
	sctx, stop := context.WithTimeout(ctx, 20*time.Second)
	defer stop()
	sc, closeBody := openLive(t, sctx, addr)
	defer closeBody()
	if err := client.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() { // pings or nothing, until the server ends the stream
	}
	if sctx.Err() != nil {
		t.Fatal("the stream stayed open after its subscription was lost and made again")
	}
}

// A stream still waiting for a subscription ends at once when the server stops, rather than
// holding the shutdown for its whole wait.
func TestStreamWaitingForASubscriptionEndsAtShutdown(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer dead.Close()
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: NewCatalog(dead, testenv.Name(t, "stream-shutdown"), time.Hour)},
		&mutableTallies{t: map[aggregator.Key]aggregator.Tally{}}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, l) }()
	answered := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, "http://"+l.Addr().String()+"/v1/stream?workspace=w", nil)
		req.Header.Set("Authorization", "Bearer "+tokenA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	time.Sleep(300 * time.Millisecond) // the stream is waiting (it waits 5 s at most)
	began := time.Now()
	cancel()
	<-done
	if took := time.Since(began); took > 2*time.Second {
		t.Errorf("Serve took %v to stop with a stream waiting for a subscription", took)
	}
	if code := <-answered; code != http.StatusServiceUnavailable {
		t.Errorf("the waiting stream was answered %d, want 503", code)
	}
}

// serveStreams serves h on a loopback port until the test ends; ctx ends when it stops.
func serveStreams(t *testing.T, h *HTTP) (addr string, ctx context.Context) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	return l.Addr().String(), ctx
}
