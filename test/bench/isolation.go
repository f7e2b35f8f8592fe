package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Tenant isolation (BENCH_ISOLATION=1): one `repeatrate run` with its HTTP side, a normal tenant
// and an abusive one, each with a token of its own and a workspace of its own. The normal tenant
// reads its snapshot ten times a second, posts one new opportunity every 200 ms and follows its
// aggregate's live stream; its figures are the read latency and the time from posting an event to
// the stream carrying the snapshot that counts it (ingest → snapshot). The abuser, meanwhile, asks
// for its costliest pages (200 outcomes of 200 corrections) from 8 connections at once, catches up
// its whole workspace's stream from 2 more, and posts 1 MiB batches of new opportunities from 2;
// it ignores Retry-After and pauses 10 ms after a refusal, as a naive retry loop does. The normal
// tenant is measured alone, then beside the abuser, on a processor with the default limits and on
// one with the per-token and per-workspace limits lifted (what the limits buy).
const (
	isoQuietToken  = "rr-bench-quiet-0123456789"
	isoAbuserToken = "rr-bench-abuser-0123456789"
	isoCorrections = 200
)

// isoFigures are one phase's figures of the normal tenant, in ms.
type isoFigures struct {
	ReadP50, ReadP99     float64
	IngestP50, IngestP99 float64
	Reads, Ingests       int
	// The round trip of a PING from this harness straight to Redis, beside each read: what the
	// machine alone adds to any request (its cores are shared by every process here), without the
	// server's part.
	PingP50, PingP99 float64
	// CPU used over the phase, in cores: the processor, Redis, and this harness (the tenants'
	// clients, the abuser's included, share the machine).
	ProcessorCores, RedisCores, HarnessCores float64
	AbuserCores                              float64     `json:",omitempty"` // the abuser's process (nice 19)
	AbuserAnswers                            map[int]int `json:",omitempty"` // the abuser's answers by status code
}

func (e *env) isolationMode(ctx context.Context) error {
	secs, err := atLeast("BENCH_ISOLATION_SECONDS", "30", 5)
	if err != nil {
		return err
	}
	phase := time.Duration(secs) * time.Second
	logf("machine: %s", machine())
	logf("tenant isolation: %s per phase", phase)
	defer e.deleteTopics(ctx)
	out := map[string]map[string]isoFigures{}
	for _, limits := range strings.Split(getenv("BENCH_ISOLATION_LIMITS", "default,lifted"), ",") {
		if limits != "default" && limits != "lifted" {
			return fmt.Errorf("BENCH_ISOLATION_LIMITS: %q is neither default nor lifted", limits)
		}
		figs, err := e.isolationRun(ctx, limits, phase)
		if err != nil {
			return fmt.Errorf("isolation (%s limits): %w", limits, err)
		}
		out[limits] = figs
		q, a := figs["alone"], figs["abused"]
		logf("%s limits: read p50 %.1f → %.1f ms, p99 %.1f → %.1f ms (×%.2f; a PING to Redis p99 %.1f → %.1f ms); ingest→snapshot p50 %.0f → %.0f ms, p99 %.0f → %.0f ms (×%.2f); cores processor %.2f → %.2f, redis %.2f → %.2f, harness %.2f → %.2f, abuser %.2f; abuser's answers %v",
			limits, q.ReadP50, a.ReadP50, q.ReadP99, a.ReadP99, a.ReadP99/q.ReadP99, q.PingP99, a.PingP99, q.IngestP50, a.IngestP50, q.IngestP99, a.IngestP99, a.IngestP99/q.IngestP99,
			q.ProcessorCores, a.ProcessorCores, q.RedisCores, a.RedisCores, q.HarnessCores, a.HarnessCores, a.AbuserCores, a.AbuserAnswers)
	}
	b, _ := json.Marshal(map[string]any{"isolation": out})
	fmt.Println(string(b))
	return nil
}

// isolationRun starts a processor with the limits named (default, or lifted) and measures the
// normal tenant alone and beside the abuser.
func (e *env) isolationRun(ctx context.Context, limits string, phase time.Duration) (map[string]isoFigures, error) {
	name := fmt.Sprintf("%s-iso-%s", e.run, limits)
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	grant := func(name, token, ws string) string {
		sum := sha256.Sum256([]byte(token))
		return name + ":" + hex.EncodeToString(sum[:]) + ":" + ws + "=read-write"
	}
	cmd := exec.Command(e.bins[0].path, "run", "--kafka-create-topics", "--http-addr", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn",
		"--http-tokens", grant("quiet", isoQuietToken, "quiet")+";"+grant("abuser", isoAbuserToken, "abuse"))
	cmd.Env = append(os.Environ(), e.processorEnvBase(name, name+".in", e.redisAOF)...)
	if limits == "lifted" {
		cmd.Env = append(cmd.Env, "REPEATRATE_HTTP_RATE_LIMIT=1000000", "REPEATRATE_HTTP_READ_BUDGET=1000000000",
			"REPEATRATE_HTTP_MAX_READS_IN_FLIGHT=100000", "REPEATRATE_HTTP_INGEST_WORKSPACE_RATE=1000000000")
	} else {
		cmd.Env = append(cmd.Env, "REPEATRATE_HTTP_RATE_LIMIT=20") // the default, over the harness's own
		if r := os.Getenv("BENCH_ISOLATION_WORKSPACE_RATE"); r != "" {
			cmd.Env = append(cmd.Env, "REPEATRATE_HTTP_INGEST_WORKSPACE_RATE="+r)
		}
	}
	// BENCH_ISOLATION_PROFILE=<file>: a CPU profile of the processor over the abused phase
	// (default limits only).
	profile := os.Getenv("BENCH_ISOLATION_PROFILE")
	if limits != "default" {
		profile = ""
	}
	const adminToken = "rr-bench-admin-0123456789"
	if profile != "" {
		sum := sha256.Sum256([]byte(adminToken))
		cmd.Env = append(cmd.Env, "REPEATRATE_PPROF=true", "REPEATRATE_HTTP_ADMIN_TOKEN_SHA256="+hex.EncodeToString(sum[:]))
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
		rdb := redis.NewClient(&redis.Options{Addr: e.redisAOF})
		cleanup(rdb, name)
		rdb.Close()
	}()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	if err := waitHTTP(ctx, client, base+"/readyz", time.Minute); err != nil {
		return nil, err
	}
	// The abuser's workspace: isoCorrections corrections, so that its pages are the costliest.
	var seed []string
	for i := range isoCorrections {
		seed = append(seed, isoEvent("abuse", fmt.Sprintf("fix-%d", i), fmt.Sprintf("seed-%d", i), time.Now()))
	}
	if code, body := isoPost(ctx, client, base, isoAbuserToken, "["+strings.Join(seed, ",")+"]"); code != http.StatusAccepted {
		return nil, fmt.Errorf("seed the abuser's workspace: %d %.300s", code, body)
	}
	ping := redis.NewClient(&redis.Options{Addr: e.redisAOF})
	defer ping.Close()
	q := &quietTenant{client: client, base: base, redis: ping}
	if err := q.start(ctx); err != nil {
		return nil, err
	}
	defer q.stop()
	time.Sleep(2 * time.Second) // the first snapshots and the stream settle
	figs := map[string]isoFigures{}
	measure := func() isoFigures {
		p0, r0, h0, t0 := cpuSeconds(cmd.Process.Pid), redisCPU(ctx, e.redisAOF), cpuSeconds(os.Getpid()), time.Now()
		q.reset()
		time.Sleep(phase)
		f := q.figures()
		d := time.Since(t0).Seconds()
		f.ProcessorCores = (cpuSeconds(cmd.Process.Pid) - p0) / d
		f.RedisCores = (redisCPU(ctx, e.redisAOF) - r0) / d
		f.HarnessCores = (cpuSeconds(os.Getpid()) - h0) / d
		return f
	}
	figs["alone"] = measure()

	// The abuser runs in a process of its own at the lowest priority (nice 19): on a machine of
	// its own it would take none of the server's CPU, and here it takes what the server leaves.
	ab := exec.Command("nice", "-n", "19", os.Args[0])
	ab.Env = append(os.Environ(), "BENCH_ISOLATION_ABUSER="+base)
	ab.Stderr = os.Stderr
	abOut, err := ab.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := ab.Start(); err != nil {
		return nil, err
	}
	defer ab.Process.Kill()
	lines := bufio.NewScanner(abOut)
	if !lines.Scan() || lines.Text() != "ready" {
		return nil, fmt.Errorf("the abuser did not start: %v", lines.Err())
	}
	time.Sleep(2 * time.Second) // the abuse reaches its steady state
	a0 := cpuSeconds(ab.Process.Pid)
	if profile != "" {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, int(phase.Seconds())-2), nil)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			resp, err := (&http.Client{}).Do(req)
			if err != nil {
				logf("profile: %v", err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if err := os.WriteFile(profile, b, 0o644); err != nil {
				logf("profile: %v", err)
			}
		}()
	}
	f := measure()
	f.AbuserCores = (cpuSeconds(ab.Process.Pid) - a0) / phase.Seconds()
	ab.Process.Signal(syscall.SIGTERM)
	if lines.Scan() {
		json.Unmarshal(lines.Bytes(), &f.AbuserAnswers)
	}
	ab.Wait()
	figs["abused"] = f
	return figs, nil
}

// abuserMain is the abuser's process (BENCH_ISOLATION_ABUSER=<server URL>): it says "ready" once
// its bodies are made, abuses the server until SIGTERM, then prints its answers by status (JSON).
func abuserMain(base string) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// Another client host: connections from 127.0.0.2, so that the per-address connection caps
	// and limits count the abuser apart from the normal tenant.
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}
	a := startAbuser(ctx, client, base, func() { fmt.Println("ready") })
	<-ctx.Done()
	b, _ := json.Marshal(a.wait())
	fmt.Println(string(b))
}

func waitHTTP(ctx context.Context, client *http.Client, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %s (%v)", url, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func isoEvent(ws, correction, opp string, at time.Time) string {
	ts := at.UTC().Format(time.RFC3339Nano)
	return fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"bench/isolation","type":"repeatrate.live.attempt.v1","data":{"scope":{"workspace":%q,"model":"m","run":"r","checkpoint":"c","artifact":"a"},"opportunity_id":%q,"correction_id":%q,"occurred_at":%q,"assessed_at":%q,"outcome":"passed"}}`,
		opp, ws, opp, correction, ts, ts)
}

func isoPost(ctx context.Context, client *http.Client, base, token, body string) (int, string) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/events", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/cloudevents-batch+json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// quietTenant is the normal tenant: its reads, its posts and its stream.
type quietTenant struct {
	client *http.Client
	redis  *redis.Client // PINGed beside each read
	base   string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	reads  []float64 // ms
	pings  []float64 // ms, PINGs to Redis
	ingest []float64 // ms
	sent   []time.Time
	seen   int // opportunities the stream has shown counted
	from   int // sends before this one are not measured (an earlier phase's)
}

func (q *quietTenant) start(ctx context.Context) error {
	ctx, q.cancel = context.WithCancel(ctx)
	sel := "workspace=quiet&model=m&run=r&checkpoint=c&artifact=a&correction_id=fix&source=live"
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, q.base+"/v1/stream?"+sel, nil)
	req.Header.Set("Authorization", "Bearer "+isoQuietToken)
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return fmt.Errorf("the normal tenant's stream: %d", resp.StatusCode)
	}
	q.wg.Add(3)
	go func() { // the stream: each snapshot resolves the sends it counts
		defer q.wg.Done()
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
			if !ok {
				continue
			}
			var s struct {
				Windows struct {
					All struct {
						Passed int `json:"passed"`
					} `json:"all"`
				} `json:"windows"`
			}
			if json.Unmarshal(data, &s) != nil {
				continue
			}
			now := time.Now()
			q.mu.Lock()
			for ; q.seen < s.Windows.All.Passed && q.seen < len(q.sent); q.seen++ {
				if q.seen >= q.from {
					q.ingest = append(q.ingest, float64(now.Sub(q.sent[q.seen]).Microseconds())/1000)
				}
			}
			q.mu.Unlock()
		}
	}()
	go func() { // the reads
		defer q.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for ctx.Err() == nil {
			<-t.C
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, q.base+"/v1/snapshots?workspace=quiet&model=m&run=r&checkpoint=c&artifact=a&correction_id=fix", nil)
			req.Header.Set("Authorization", "Bearer "+isoQuietToken)
			start := time.Now()
			resp, err := q.client.Do(req)
			if err != nil {
				continue
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				q.mu.Lock()
				q.reads = append(q.reads, float64(time.Since(start).Microseconds())/1000)
				q.mu.Unlock()
			}
			start = time.Now()
			if q.redis.Ping(ctx).Err() == nil {
				q.mu.Lock()
				q.pings = append(q.pings, float64(time.Since(start).Microseconds())/1000)
				q.mu.Unlock()
			}
		}
	}()
	go func() { // the posts: one new opportunity each, taken in order
		defer q.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for i := 0; ctx.Err() == nil; i++ {
			<-t.C
			now := time.Now()
			code, _ := isoPost(ctx, q.client, q.base, isoQuietToken, "["+isoEvent("quiet", "fix", fmt.Sprintf("q-%d", i), now)+"]")
			if code != http.StatusAccepted {
				continue // not written; the next one is the next opportunity
			}
			q.mu.Lock()
			q.sent = append(q.sent, now)
			q.mu.Unlock()
		}
	}()
	return nil
}

func (q *quietTenant) stop() {
	q.cancel()
	q.wg.Wait()
}

// reset starts a phase: what was measured is dropped, and so are the sends before now.
func (q *quietTenant) reset() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.reads, q.ingest, q.pings, q.from = nil, nil, nil, len(q.sent)
}

func (q *quietTenant) figures() isoFigures {
	q.mu.Lock()
	defer q.mu.Unlock()
	pct := func(xs []float64, p float64) float64 {
		if len(xs) == 0 {
			return math.NaN()
		}
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[min(len(s)-1, int(float64(len(s))*p))]
	}
	return isoFigures{ReadP50: pct(q.reads, 0.5), ReadP99: pct(q.reads, 0.99), IngestP50: pct(q.ingest, 0.5), IngestP99: pct(q.ingest, 0.99),
		Reads: len(q.reads), Ingests: len(q.ingest), PingP50: pct(q.pings, 0.5), PingP99: pct(q.pings, 0.99)}
}

// abuser runs the abusive tenant's loops and counts its answers by status.
type abuser struct {
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers map[int]int
	posts   atomic.Int64
}

func startAbuser(ctx context.Context, client *http.Client, base string, ready func()) *abuser {
	a := &abuser{answers: map[int]int{}}
	count := func(code int) {
		a.mu.Lock()
		a.answers[code]++
		a.mu.Unlock()
		if code != http.StatusOK && code != http.StatusAccepted {
			select { // a naive retry loop: no Retry-After, a short pause
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	get := func(path string, within time.Duration) {
		rctx := ctx
		if within > 0 {
			var cancel context.CancelFunc
			rctx, cancel = context.WithTimeout(ctx, within)
			defer cancel()
		}
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, base+path, nil)
		req.Header.Set("Authorization", "Bearer "+isoAbuserToken)
		resp, err := client.Do(req)
		if err != nil {
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		count(resp.StatusCode)
	}
	loop := func(n int, f func(i int)) {
		for i := range n {
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				for ctx.Err() == nil {
					f(i)
				}
			}()
		}
	}
	abuse := getenv("BENCH_ISOLATION_ABUSE", "reads,streams,ingest")
	// 1 MiB batches of new opportunities over the abuser's corrections, made before the abuse
	// starts (making them as it goes took the harness most of a core): 64 of them, about 190 000
	// opportunities, cycled through.
	bodies := make([]string, 64)
	for b := range bodies {
		var evs []string
		size := 2
		for j := 0; size < 1<<20-1024; j++ {
			ev := isoEvent("abuse", fmt.Sprintf("fix-%d", j%isoCorrections), fmt.Sprintf("a-%d-%d", b, j), time.Now())
			evs = append(evs, ev)
			size += len(ev) + 1
		}
		bodies[b] = "[" + strings.Join(evs, ",") + "]"
	}
	ready()
	if strings.Contains(abuse, "reads") {
		loop(8, func(int) { get("/v1/outcomes?workspace=abuse&model=m&run=r&checkpoint=c&artifact=a&limit=200", 0) })
	}
	if strings.Contains(abuse, "streams") {
		loop(2, func(int) { get("/v1/stream?workspace=abuse&last_event_id=0", 200*time.Millisecond) })
	}
	if !strings.Contains(abuse, "ingest") {
		return a
	}
	loop(2, func(int) {
		// Code 0: no answer (a refused 1 MiB body makes the server close the connection before
		// the client has sent it all).
		code, _ := isoPost(ctx, client, base, isoAbuserToken, bodies[a.posts.Add(1)%int64(len(bodies))])
		if ctx.Err() == nil {
			count(code)
		}
	})
	return a
}

// wait stops the abuser's loops (their context has ended) and returns its answers by status.
func (a *abuser) wait() map[int]int {
	a.wg.Wait()
	return a.answers
}
