package main

import (
	"context"
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
	kafkaRetention := fs.Duration("kafka-retention", 5*time.Minute, "how long the embedded broker keeps records")
	pprof := fs.Bool("pprof", false, "serve /debug/pprof on the HTTP address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" {
		// The processor's GOGC=400 trades memory for CPU per event; a demo on a laptop wants the
		// memory back (its embedded broker and Redis live in this heap too).
		debug.SetGCPercent(100)
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
	// (applied below), so the demo runs for hours in bounded memory.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(kport),
		kfake.BrokerConfigs(map[string]string{"log.retention.ms": strconv.FormatInt(kafkaRetention.Milliseconds(), 10)}),
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
	fmt.Fprintf(stdout, "embedded Kafka broker: %v\nembedded Redis:        %s\nHTTP:                  http://%s/metrics\n",
		brokers, mr.Addr(), *httpAddr)
	fmt.Fprintf(stdout, "input topics: %s, %s; snapshots: %s, %s; alerts: %s; dead letters: %s\n",
		TopicLive, TopicEval, TopicSnapshots, TopicSuites, TopicAlerts, TopicDLQ)

	cfg := defaultConfig()
	cfg.Kafka.Brokers = brokers
	cfg.Redis.Addrs = []string{mr.Addr()}
	cfg.HTTPAddr = *httpAddr
	cfg.LogLevel = *logLevel
	cfg.Batch.Linger = 20 * time.Millisecond
	cfg.Retention = *retention
	cfg.Pprof = *pprof
	if err := cfg.Validate(); err != nil {
		return err
	}
	log, err := newLogger(cfg.LogLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()

	g, gctx := errgroup.WithContext(ctx)
	reg := prometheus.NewRegistry()
	g.Go(func() error { return runProcessorWith(gctx, cfg, log, reg) })
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
		g.Go(func() error { return demoTraffic(gctx, kc, *rate, &view.sent, log) })
		g.Go(func() error { return view.follow(gctx, kc) })
		if f, ok := stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			g.Go(func() error { return view.live(gctx, stdout) })
		} else {
			g.Go(func() error { view.print(gctx, stdout, 5*time.Second); return nil })
		}
	}
	return g.Wait()
}

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
