package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"golang.org/x/term"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/deploy"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/internal/synth"
)

func devCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dev", stderr)
	kafkaAddr := fs.String("kafka-addr", "127.0.0.1:9092", "address of the embedded Kafka-protocol broker (port 0: any free port)")
	redisAddr := fs.String("redis-addr", "127.0.0.1:6379", "address of the embedded Redis-protocol server (port 0: any free port)")
	httpAddr := fs.String("http-addr", "127.0.0.1:8080", "HTTP address (health, metrics, API, badge)")
	demo := fs.Bool("demo", false, "feed synthetic traffic and print snapshots as they change")
	rate := fs.Int("rate", 20, "demo events per second")
	logLevel := fs.String("log-level", "warn", "processor log level")
	retention := fs.Duration("retention", 2*time.Hour, "identity retention behind each aggregate's newest event "+
		"(at least 1h; shorter than run's 30 days, so the embedded Redis stays small)")
	kafkaRetention := fs.Duration("kafka-retention", time.Minute, "how long the embedded broker keeps records, in this process's memory (at least 10s: "+
		"the demo's suite and backlog are written once, at start, and must be read before they go)")
	compression := fs.String("kafka-compression", "snappy", "codec of every record batch written to the embedded broker, which keeps its records in this "+
		"process's memory: none, gzip, snappy, lz4 or zstd")
	pprof := fs.Bool("pprof", false, "serve /debug/pprof on the HTTP address")
	stateLayout := fs.Int("redis-state-layout", int(aggregator.Layout10), "state layout of the embedded Redis's namespace: 10, or 11 (a keyed fingerprint per "+
		"opportunity in packed buckets: a third of the memory, more CPU)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := compressionCodec(*compression); err != nil {
		return fmt.Errorf("dev: --kafka-compression: %w", err)
	}
	if err := aggregator.Layout(*stateLayout).Validate(); err != nil {
		return fmt.Errorf("dev: --redis-state-layout: %w", err)
	}
	if *kafkaRetention < 10*time.Second {
		// Shorter, the broker may drop what the demo wrote once at start before the processor
		// reads it (at 1 ms the suite never arrived); zero or less stops its retention clock.
		return fmt.Errorf("dev: --kafka-retention %v: at least 10s", *kafkaRetention)
	}
	if os.Getenv("GOGC") == "" {
		// The processor's GOGC=400 trades memory for CPU per event; a demo on a laptop wants the
		// memory back: its embedded broker and Redis live in this heap too, and what --retention
		// keeps grows for its 2 hours (at --rate 400, 3 MB of live heap a minute). At 50 the heap
		// stays within 1.5× of what is live; the collector runs about twice as often (its marking
		// was 18 % of dev's CPU at 100, at --rate 400).
		debug.SetGCPercent(devGCPercent)
	}
	_, kport, err := hostPort(*kafkaAddr)
	if err != nil {
		return fmt.Errorf("dev: --kafka-addr: %w", err)
	}
	if kport == 0 {
		if kport, err = freePort(); err != nil {
			return err
		}
	}
	// The embedded broker keeps everything in memory: it drops records older than kafkaRetention
	// (applied below), so the demo runs for hours in bounded memory. It frees whole segments only,
	// as Kafka does, and rolls a segment only once it is full (it has no time-based roll), so
	// segments are small: with its default (100 MiB) a partition's segment never rolled, nothing was
	// freed, and dev grew ~12 MB a minute; at 1 MiB each of the 18 partitions still held up to a
	// MiB of records older than the retention, filling at the demo's rate (+7 MB from 5 to 10 min).
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(kport),
		kfake.BrokerConfigs(map[string]string{"log.retention.ms": strconv.FormatInt(kafkaRetention.Milliseconds(), 10),
			"log.segment.bytes": strconv.Itoa(devSegmentBytes)}),
		kfake.SeedTopics(4, TopicLive, TopicEval, TopicSnapshots, TopicSuites), kfake.SeedTopics(1, TopicAlerts, TopicDLQ))
	if err != nil {
		return fmt.Errorf("dev: embedded kafka on port %d: %w", kport, err)
	}
	defer cluster.Close()
	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr(*redisAddr); err != nil {
		return fmt.Errorf("dev: embedded redis on %s: %w", *redisAddr, err)
	}
	defer mr.Close()
	brokers := cluster.ListenAddrs()
	// Port 0 takes a free port here, so that the addresses printed below are ones to open.
	if *httpAddr != "" {
		host, hport, err := hostPort(*httpAddr)
		if err != nil {
			return fmt.Errorf("dev: --http-addr: %w", err)
		}
		if hport == 0 {
			if hport, err = freePort(); err != nil {
				return err
			}
			*httpAddr = net.JoinHostPort(host, strconv.Itoa(hport))
		}
		// A busy port is said in one line before anything is printed: the banner's token and
		// URLs would belong to whatever holds the port.
		l, err := net.Listen("tcp", *httpAddr)
		if err != nil {
			return fmt.Errorf("dev: --http-addr %s: %w", *httpAddr, err)
		}
		l.Close()
	}
	fmt.Fprintf(stdout, "embedded Kafka broker: %v\nembedded Redis:        %s\nHTTP:                  http://%s/metrics\n",
		brokers, mr.Addr(), *httpAddr)
	fmt.Fprintf(stdout, "input topics: %s, %s; snapshots: %s, %s; alerts: %s; dead letters: %s\n",
		TopicLive, TopicEval, TopicSnapshots, TopicSuites, TopicAlerts, TopicDLQ)

	cfg := defaultConfig()
	cfg.Kafka.Brokers = brokers
	cfg.Redis.Addrs = []string{mr.Addr()}
	cfg.HTTPAddr = *httpAddr
	cfg.LogLevel = *logLevel
	// The embedded Redis runs the scripts on gopher-lua, whose registry overflows on a call of a
	// few thousand observations of one aggregate (the demo's backlog is mostly a few aggregates);
	// a demo gains nothing from the large batches that spread Redis's fixed cost under load.
	cfg.Batch.MaxMessages = 2000
	cfg.Retention = *retention
	cfg.Redis.StateLayout = *stateLayout
	// The embedded broker keeps its records in this heap: compressed, the demo's JSON takes a
	// fraction of the memory (at 400 events/s, uncompressed snapshots alone held 230 MB).
	cfg.Kafka.Compression = *compression
	cfg.Pprof = *pprof
	token, err := devToken(&cfg)
	if err != nil {
		return err
	}
	if cfg.Pprof {
		// Never open: the profiler (and so /metrics) take the printed token.
		cfg.HTTP.AdminTokenSHA256 = auth.Hash(token)
	}
	fmt.Fprintf(stdout, "read side:             http://%s/ (sign in with the token), API http://%s/v1/openapi.json\n"+
		"ingest:                POST http://%s/v1/events (CloudEvents over HTTP, same token)\ntoken:                 %s (reads and writes every workspace)\n",
		*httpAddr, *httpAddr, *httpAddr, token)
	if err := cfg.Validate(); err != nil {
		return err
	}
	log, err := newLogger(cfg.LogLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()

	if *demo {
		// The stepping correction's page (demoStep): its numbers move every second.
		fmt.Fprintf(stdout, "demo page:             http://%s/ui/outcomes?artifact=prod&checkpoint=v2&model=support-bot&run=prod&workspace=demo\n", *httpAddr)
		// The demo evaluates the README's example rules; demoStep makes one of them fire.
		path, err := writeTemp("repeatrate-demo-rules-*.yaml", deploy.AlertRulesExample)
		if err != nil {
			return err
		}
		defer os.Remove(path)
		cfg.AlertRules = path
	}
	g, gctx := errgroup.WithContext(ctx)
	reg := prometheus.NewRegistry()
	g.Go(func() error { return runProcessorWith(gctx, cfg, log, reg) })
	g.Go(func() error { keepRedisClock(gctx, mr, time.Second); return nil })
	g.Go(func() error {
		tick := time.NewTicker(min(*kafkaRetention/4, 30*time.Second))
		defer tick.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-tick.C:
				cluster.ApplyRetention()
			}
		}
	})
	if *demo {
		kc, err := newKafkaClients(cfg.Kafka)
		if err != nil {
			return err
		}
		view := newDemoView()
		view.outcomes = func() map[string]int { return observationOutcomes(reg) }
		view.input = func() int64 { return eventsIn(reg) }
		g.Go(func() error { return demoTraffic(gctx, kc, *rate, &view.sent, log) })
		g.Go(func() error { return demoStep(gctx, kc, time.Now, &view.sent, log) })
		g.Go(func() error { return demoSuite(gctx, kc, time.Now(), &view.sent, log) })
		g.Go(func() error { return view.follow(gctx, kc) })
		if f, ok := stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			g.Go(func() error { return view.live(gctx, stdout) })
		} else {
			g.Go(func() error { view.print(gctx, stdout, 5*time.Second); return nil })
		}
	}
	return g.Wait()
}

// keepRedisClock advances the embedded Redis's TTLs by the time that passed, every period, until
// ctx ends. miniredis does not count TTLs down by itself: without this no key ever expired in dev,
// and what --retention and the idle TTLs should drop (an aggregate gone quiet, its catalog and
// history keys) stayed for the life of the process. (Its ClockTTL would do the same on every
// command, at the cost of a walk over every key each time.)
func keepRedisClock(ctx context.Context, mr *miniredis.Miniredis, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			mr.FastForward(now.Sub(last))
			last = now
		}
	}
}

// devGCPercent is dev's GOGC unless the environment sets one.
const devGCPercent = 50

// devSegmentBytes is the embedded broker's segment size: what a partition holds beyond its
// retention before it frees anything.
const devSegmentBytes = 64 << 10

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// demoTraffic publishes synthetic events at rate per second until ctx ends.
func demoTraffic(ctx context.Context, kc *kafkaClients, rate int, sent *atomic.Int64, log *zap.Logger) error {
	mix := demoMix
	mix.Seed = uint64(time.Now().UnixNano())
	w := kc.writer(TopicLive)
	w.Topic = "" // each message names its topic
	defer w.Close()
	_, err := generateLoad(ctx, trafficConfig{Rate: max(1, rate), Mix: mix, LiveTopic: TopicLive, EvalTopic: TopicEval,
		OnSent: func(n int) { sent.Add(int64(n)) },
		OnWriteError: func(err error) error {
			if ctx.Err() == nil {
				log.Warn("demo produce", zap.Error(err))
			}
			return nil
		}}, w)
	return err
}

func writeTemp(pattern string, b []byte) (string, error) {
	f, err := os.CreateTemp("", pattern)
	if err != nil {
		return "", err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return f.Name(), err
}

// Demo rate step (README, Alerting): the example rule correction-regressed-fast compares the last
// hour with the 23 before it; 3 000 attempts at 2 % in the hour before the last, then 40 a second
// at 15 % (repeats spread evenly) make it pending within about 40 s and firing a minute later
// (TestDevDemoInBrowser measured it listed on the page 1m32s after start; 1m45s–1m51s at 25 a second). After five minutes the rate
// falls back to 2 %; the alert resolved about three minutes later in two runs (7m48s and 7m50s
// after start), not once the 15 % minutes had left the hour.
const (
	demoStepBaseline = 3000
	demoStepPerSec   = 40
	demoStepHigh     = 5 * time.Minute
)

// demoSuite feeds once the graded runs of suite support-qa in the demo's scope: 24 cases in 7
// versions of 3 runs each, over the 3 hours before now, with the faults of internal/synth — a
// quarter of the cases pass for five versions and then fail (revived), some replies loop
// (abnormal), a few results are re-sent or re-graded — so that the suite page has floor, ceiling,
// stability per version and cases that moved to show.
func demoSuite(ctx context.Context, kc *kafkaClients, now time.Time, sent *atomic.Int64, log *zap.Logger) error {
	lines := synth.Suite(synth.SuiteConfig{Seed: uint64(now.UnixNano()), Workspace: "demo", Suite: "support-qa", Cases: 24, Versions: 7, Runs: 3,
		Duplicates: 0.02, Regrades: 0.02, LoopShare: 0.04, Scope: demoScope}, now.Add(-3*time.Hour))
	w := kc.writer(TopicEval)
	defer w.Close()
	n, err := produce(ctx, bytes.NewReader(append(bytes.Join(lines, []byte("\n")), '\n')), w)
	sent.Add(int64(n))
	if err != nil && ctx.Err() == nil {
		log.Warn("demo suite", zap.Error(err))
	}
	return nil
}

// demoScope is the scope of the demo's stepping correction and suite.
var demoScope = map[string]string{"workspace": "demo", "model": "support-bot", "run": "prod", "checkpoint": "v2", "artifact": "prod"}

// demoStep feeds the stepping correction (workspace demo, correction fix-comeback) until ctx ends;
// sent counts what it wrote.
func demoStep(ctx context.Context, kc *kafkaClients, now func() time.Time, sent *atomic.Int64, log *zap.Logger) error {
	w := kc.writer(TopicLive)
	defer w.Close()
	seq := 0
	// perMille of every 1000 are confirmed repeats (20 at 2 %, 150 at 15 %), spread evenly: the
	// attempt whose running share of repeats reaches a new whole number is one, so every minute's
	// rate is the step's rate, not a burst of repeats followed by none.
	send := func(n, perMille int, from, to time.Time) error {
		var buf bytes.Buffer
		for i := range n {
			seq++
			at := from.Add(time.Duration(i) * to.Sub(from) / time.Duration(n))
			outcome := "passed"
			if seq*perMille/1000 != (seq-1)*perMille/1000 {
				outcome = "confirmed_repeat"
			}
			b, _ := json.Marshal(map[string]any{"specversion": "1.0", "id": "demo-step-" + strconv.Itoa(seq), "source": "dev/demo",
				"type": "repeatrate.live.attempt.v1", "data": map[string]any{
					"scope":         demoScope,
					"correction_id": "fix-comeback", "opportunity_id": "step-" + strconv.Itoa(seq), "outcome": outcome,
					"occurred_at": at.UTC().Format(time.RFC3339Nano), "assessed_at": at.UTC().Format(time.RFC3339Nano)}})
			buf.Write(b)
			buf.WriteByte('\n')
		}
		n, err := produce(ctx, &buf, w)
		sent.Add(int64(n))
		return err
	}
	start := now()
	if err := send(demoStepBaseline, 20, start.Add(-115*time.Minute), start.Add(-65*time.Minute)); err != nil {
		return demoStepErr(ctx, err, log)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case t := <-tick.C:
			perMille := 150
			if t.Sub(start) > demoStepHigh {
				perMille = 20
			}
			if err := send(demoStepPerSec, perMille, t.Add(-time.Second), t); err != nil {
				return demoStepErr(ctx, err, log)
			}
		}
	}
}

func demoStepErr(ctx context.Context, err error, log *zap.Logger) error {
	if ctx.Err() != nil {
		return nil
	}
	log.Warn("demo rate step", zap.Error(err))
	return nil
}
