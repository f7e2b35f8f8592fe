package readside

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/internal/testenv"
	"github.com/repeatrate/repeatrate/schemas"
)

// commandCount counts the commands a client sends, a pipeline's each: what Redis is asked to do.
type commandCount struct {
	mu sync.Mutex
	n  int
}

func (c *commandCount) add(n int) { c.mu.Lock(); c.n += n; c.mu.Unlock() }
func (c *commandCount) get() int  { c.mu.Lock(); defer c.mu.Unlock(); return c.n }

func (c *commandCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *commandCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.add(1); return next(ctx, cmd) }
}
func (c *commandCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.add(len(cmds)); return next(ctx, cmds) }
}

// budgetServer serves the read side on real Redis with n corrections of workspace "w" applied and
// indexed, its client charging reads (ReadCost) and counting every command it sends.
func budgetServer(t *testing.T, n int, cfg HTTPConfig) (*HTTP, *httptest.Server, *commandCount, *prometheus.Registry) {
	t.Helper()
	client := testenv.OwnRedis(t)
	prefix := testenv.Name(t, "budget")
	testenv.CleanPrefix(t, client, prefix)
	store, err := aggregator.NewRedis(client, aggregator.RedisConfig{Prefix: prefix, Retention: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cat := NewCatalog(client, prefix, time.Hour)
	rec := NewRecorder(nopPublisher{}, cat, nil, zap.NewNop())
	ctx := context.Background()
	scope := schemas.Scope{Workspace: "w", Model: "m", Run: "r", Checkpoint: "c", Artifact: "a"}
	var obs []aggregator.Observation
	for i := range n {
		obs = append(obs, aggregator.Observation{Key: aggregator.Key{Scope: scope, CorrectionID: fmt.Sprintf("fix%03d", i), Source: aggregator.Live},
			OpportunityID: "o", Class: aggregator.Passed, Occurred: aggregator.Micros(recordBase), Assessed: aggregator.Micros(recordBase)})
	}
	applied, err := store.Apply(ctx, obs, recordBase)
	if err != nil {
		t.Fatal(err)
	}
	var snaps []schemas.Snapshot
	for k, tally := range applied.Tallies {
		snaps = append(snaps, tally.Snapshot(k, recordBase))
	}
	if err := rec.Publish(ctx, snaps); err != nil {
		t.Fatal(err)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	count := &commandCount{}
	client.AddHook(ReadCost{})
	client.AddHook(count)
	reg := prometheus.NewRegistry()
	cfg.Tokens, cfg.Catalog, cfg.Registerer = testTokens(t), cat, reg
	h := NewHTTP(cfg, store, reg, func() time.Time { return recordBase }, zap.NewNop())
	srv := httptest.NewServer(h.srv.Handler)
	t.Cleanup(srv.Close)
	return h, srv, count, reg
}

func getWith(t *testing.T, url, token string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// A token's reads are charged the Redis commands they send: a page of many outcomes costs many
// times a snapshot, so a token asking for the costliest pages is refused (429, with the time its
// budget needs) long before its request rate is, while Redis does no more than the budget allows;
// a token on the same server whose budget is its own keeps reading.
func TestReadsArePaidInRedisCommands(t *testing.T) {
	const budget, burst = 100, 600
	_, srv, count, reg := budgetServer(t, 120, HTTPConfig{RateLimit: 1000, ReadBudget: budget, ReadBurst: burst})
	outcomes := srv.URL + "/v1/outcomes?workspace=w&model=m&run=r&checkpoint=c&artifact=a&limit=200"
	snapshot := srv.URL + "/v1/snapshots?workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=fix000"

	before := count.get()
	if code, _, body := getWith(t, snapshot, tokenA); code != 200 {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	perSnapshot := count.get() - before
	before = count.get()
	if code, _, body := getWith(t, outcomes, tokenA); code != 200 || strings.Count(body, `"badge"`) != 120 {
		t.Fatalf("outcomes: %d %.200s", code, body)
	}
	perPage := count.get() - before
	if perSnapshot < 1 || perPage < 50*perSnapshot {
		t.Fatalf("a snapshot sent %d commands, a page of 120 outcomes %d: the page should cost far more", perSnapshot, perPage)
	}
	if charged := gathered(t, reg, "repeatrate_http_read_commands_total", ""); int(charged) != perSnapshot+perPage {
		t.Fatalf("charged %v commands, the client sent %d", charged, perSnapshot+perPage)
	}

	t.Logf("a snapshot sends %d Redis commands, a page of 120 outcomes %d", perSnapshot, perPage)
	start := time.Now()
	before = count.get()
	pages, refused := 1, 0
	var retryAfter string
	var refusal string
	for range 40 {
		code, hdr, body := getWith(t, outcomes, tokenA)
		switch code {
		case 200:
			pages++
		case 429:
			refused++
			retryAfter, refusal = hdr.Get("Retry-After"), body
		default:
			t.Fatalf("outcomes: %d %s", code, body)
		}
	}
	sent := count.get() - before
	elapsed := time.Since(start).Seconds()
	t.Logf("40 more pages in %.2fs: %d answered, %d refused, %d commands sent", elapsed, pages-1, refused, sent)
	// What the token may have spent: its burst, what refilled meanwhile, and the one page that
	// takes it into debt.
	if allowed := float64(burst) + budget*elapsed + float64(perPage); float64(sent) > allowed {
		t.Fatalf("40 page requests sent %d Redis commands in %.1fs; the budget allows %.0f", sent, elapsed, allowed)
	}
	if refused == 0 || !strings.Contains(refusal, "read budget spent") {
		t.Fatalf("%d of 40 pages of %d commands each refused on a budget of %d/s (burst %d); last refusal %q", refused, perPage, budget, burst, refusal)
	}
	if s, err := strconv.Atoi(retryAfter); err != nil || s < 1 || s > (burst+perPage)/budget+1 {
		t.Fatalf("Retry-After %q: want the seconds until the debt is paid", retryAfter)
	}
	if n := gathered(t, reg, "repeatrate_http_read_refused_total", "budget"); int(n) != refused {
		t.Fatalf("counted %v refusals, answered %d", n, refused)
	}
	// The other token's budget is its own.
	if code, _, body := getWith(t, srv.URL+"/v1/suites?workspace=other", tokenB); code != 200 {
		t.Fatalf("another token, while the first is refused: %d %s", code, body)
	}
}

// A token runs at most MaxReadsInFlight reads at once; the next is refused (429) at once instead
// of queueing more work on Redis, another token is not, and a slot is given back when its read is
// answered.
func TestReadsInFlightAreCappedPerToken(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 8)
	tallies := blockingTallies{entered: entered, release: release}
	reg := prometheus.NewRegistry()
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), MaxReadsInFlight: 2, RateLimit: 1000, Registerer: reg}, tallies, reg, time.Now, zap.NewNop())
	srv := httptest.NewServer(h.srv.Handler)
	defer srv.Close()
	snapshot := srv.URL + "/v1/snapshots?workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x"
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, _, body := getWith(t, snapshot, tokenA); code != 200 {
				t.Errorf("a read within the cap: %d %s", code, body)
			}
		}()
	}
	<-entered
	<-entered
	code, hdr, body := getWith(t, snapshot, tokenA)
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || !strings.Contains(body, "2 reads at once") {
		t.Fatalf("a third read at once: %d %q %s", code, hdr.Get("Retry-After"), body)
	}
	otherWS := srv.URL + "/v1/snapshots?workspace=other&model=m&run=r&checkpoint=c&artifact=a&correction_id=x"
	go func() { <-entered }()
	done := make(chan int, 1)
	go func() { c, _, _ := getWith(t, otherWS, tokenB); done <- c }()
	close(release)
	if c := <-done; c != 200 {
		t.Fatalf("another token's read: %d", c)
	}
	wg.Wait()
	if code, _, body := getWith(t, snapshot, tokenA); code != 200 {
		t.Fatalf("a read after the others were answered: %d %s", code, body)
	}
	if n := gathered(t, reg, "repeatrate_http_read_refused_total", "in_flight"); n != 1 {
		t.Fatalf("counted %v refusals in flight, answered 1", n)
	}
}

// blockingTallies answers each Tally once release is closed, telling entered first.
type blockingTallies struct {
	entered chan struct{}
	release chan struct{}
}

func (b blockingTallies) Tally(ctx context.Context, k aggregator.Key, _ time.Time) (aggregator.Tally, error) {
	if k.Source == aggregator.Live {
		select {
		case b.entered <- struct{}{}:
		default:
		}
		select {
		case <-b.release:
		case <-ctx.Done():
			return aggregator.Tally{}, ctx.Err()
		}
	}
	t := aggregator.Tally{Version: 1}
	t.All.Passed = 1
	return t, nil
}

// gathered is the value of metric name in g, summed over the series whose label values include
// label (every series when label is empty).
func gathered(t *testing.T, g prometheus.Gatherer, name, label string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetValue() == label
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// ctxTallies fails every read with its context's error, as a read cut short by its client does.
type ctxTallies struct{}

func (ctxTallies) Tally(ctx context.Context, _ aggregator.Key, _ time.Time) (aggregator.Tally, error) {
	<-ctx.Done()
	return aggregator.Tally{}, ctx.Err()
}

// A read whose client hung up is not logged as a failure of the state: a client that hangs up on
// every read (an abuser, or a dashboard closing its tab) would fill the log with warnings.
func TestReadsAbandonedByTheirClientAreNotWarnings(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t)}, ctxTallies{}, prometheus.NewRegistry(), time.Now, zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, "/v1/snapshots?workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x", nil).WithContext(ctx)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	cancel()
	h.srv.Handler.ServeHTTP(httptest.NewRecorder(), req)
	if logs.Len() != 0 {
		t.Fatalf("an abandoned read was logged: %v", logs.All()[0].Message)
	}
	// The same failure while the client still waits is a warning.
	req = httptest.NewRequest(http.MethodGet, "/v1/snapshots?workspace=w&model=m&run=r&checkpoint=c&artifact=a&correction_id=x", nil)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	h2 := NewHTTP(HTTPConfig{Tokens: testTokens(t)}, fakeTallies{err: errors.New("redis: connection refused")}, prometheus.NewRegistry(), time.Now, zap.New(core))
	rec := httptest.NewRecorder()
	h2.srv.Handler.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || logs.Len() != 1 {
		t.Fatalf("a failed read: %d, %d warnings", rec.Code, logs.Len())
	}
}

// A stream whose client hung up during its catch-up (while the catalog was listed) is not logged
// as a warning either.
func TestStreamCatchUpsAbandonedByTheirClientAreNotWarnings(t *testing.T) {
	client := testenv.OwnRedis(t)
	prefix := testenv.Name(t, "catchup")
	testenv.CleanPrefix(t, client, prefix)
	core, logs := observer.New(zap.WarnLevel)
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), Catalog: NewCatalog(client, prefix, time.Hour)}, ctxTallies{}, prometheus.NewRegistry(), time.Now, zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodGet, "/v1/stream?workspace=w", nil).WithContext(ctx)
	req.Header.Set("Authorization", "Bearer "+tokenA)
	cancel()
	h.srv.Handler.ServeHTTP(httptest.NewRecorder(), req)
	for _, e := range logs.All() {
		t.Errorf("an abandoned catch-up was logged at %s: %q", e.Level, e.Message)
	}
}

// Requests without a token that read no Redis hold no read slot: sign-in forms whose bodies
// trickle in (for up to the read timeout) cannot take an address's slots, so the sign-in page
// and its form keep answering from that address (behind a proxy, every client's).
func TestSlowSignInsHoldNoReadSlot(t *testing.T) {
	h := NewHTTP(HTTPConfig{Tokens: testTokens(t), MaxReadsInFlight: 1, RateLimit: 1000}, fakeTallies{}, prometheus.NewRegistry(), time.Now, zap.NewNop())
	reading := make(chan struct{}, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			r.Body = &firstRead{ReadCloser: r.Body, c: reading}
		}
		h.srv.Handler.ServeHTTP(w, r)
	}))
	defer srv.Close()
	var held []*io.PipeWriter
	defer func() {
		for _, w := range held {
			w.Close()
		}
	}()
	for range 3 {
		r, w := io.Pipe()
		held = append(held, w)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/login", r)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.ContentLength = 100
		go func() {
			if resp, err := (&http.Client{}).Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		go w.Write([]byte("token=")) // the rest never comes
		select {
		case <-reading: // the handler is reading this body: past every limit
		case <-time.After(10 * time.Second):
			t.Fatal("a trickling sign-in was never read: refused at a limit")
		}
	}
	resp, err := http.Get(srv.URL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the sign-in page beside 3 trickling sign-ins: %d", resp.StatusCode)
	}
}

// firstRead tells c when its body is first read.
type firstRead struct {
	io.ReadCloser
	c    chan struct{}
	once sync.Once
}

func (f *firstRead) Read(p []byte) (int, error) {
	f.once.Do(func() { f.c <- struct{}{} })
	return f.ReadCloser.Read(p)
}
