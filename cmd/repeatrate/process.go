package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"

	"github.com/repeatrate/repeatrate/aggregator"
	"github.com/repeatrate/repeatrate/aggregator/suite"
	"github.com/repeatrate/repeatrate/alert"
	"github.com/repeatrate/repeatrate/consumer"
	"github.com/repeatrate/repeatrate/internal/auth"
	"github.com/repeatrate/repeatrate/readside"
	"github.com/repeatrate/repeatrate/schemas"
	"github.com/repeatrate/repeatrate/schemas/cloudevent"
	"github.com/repeatrate/repeatrate/sink"
)

func runCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return configured(ctx, "run", args, getenv, stderr, runProcessor)
}

// configured runs fn with the configuration of flags, file and environment, and a logger.
func configured(ctx context.Context, name string, args []string, getenv func(string) string, stderr io.Writer,
	fn func(context.Context, Config, *zap.Logger) error) error {
	fs := newFlagSet(name, stderr)
	cfg, err := loadConfigFor(fs, args, getenv, commandSettings[name])
	if err != nil {
		return err
	}
	log, err := newLogger(cfg.LogLevel, stderr)
	if err != nil {
		return err
	}
	defer log.Sync()
	return fn(ctx, cfg, log)
}

// stores are the Redis stores of one namespace and the suite settings they are used with.
type stores struct {
	rates    *aggregator.Redis
	suites   *suite.Redis
	suiteCfg suite.Config
	decoder  *cloudevent.Decoder
}

// storeConfig is what the rates and suite stores of namespace state are opened with, from cfg.
func storeConfig(state aggregator.State, cfg Config) aggregator.RedisConfig {
	// One chain of pending tokens for both stores: Seal then vouches for the suite writes too.
	return aggregator.RedisConfig{Prefix: state.Namespace, Retention: cfg.Retention, Epoch: state.Epoch, Group: cfg.Kafka.GroupID,
		Pending: aggregator.NewPending(), WaitReplicas: cfg.Redis.WaitReplicas, WaitTimeout: cfg.Redis.WaitTimeout,
		ComputeCalls: cfg.Redis.ComputeCalls, BucketCacheBytes: int64(cfg.Redis.BucketCacheBytes)}
}

func openStores(ctx context.Context, rdb redis.UniversalClient, state aggregator.State, cfg Config) (stores, error) {
	var s stores
	rcfg := storeConfig(state, cfg)
	var err error
	if state.Layout != aggregator.Layout10 {
		if rcfg.Fingerprint, err = aggregator.OpenFingerprint(ctx, rdb, state.Namespace); err != nil {
			return s, err
		}
	}
	if s.rates, err = aggregator.NewRedis(rdb, rcfg); err != nil {
		return s, err
	}
	if s.suiteCfg, err = cfg.Suite.aggregator(); err != nil {
		return s, err
	}
	if s.suites, err = suite.NewRedis(rdb, rcfg, s.suiteCfg); err != nil {
		return s, err
	}
	s.decoder, err = cloudevent.NewDecoder(cloudevent.DecoderConfig{
		MaxMessageBytes: cfg.Limits.MaxMessageBytes,
		Limits:          schemas.Limits{MaxPredictionBytes: cfg.Limits.MaxPredictionBytes, MaxFutureSkew: cfg.Limits.MaxFutureSkew},
	})
	return s, err
}

func newLogger(level string, w io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, err
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core), nil
}

// runProcessor runs the processor until ctx ends, then shuts down in order: stop fetching, finish
// and commit the batch in hand, flush the writers, close Redis.
func runProcessor(ctx context.Context, cfg Config, log *zap.Logger) error {
	return runProcessorWith(ctx, cfg, log, prometheus.NewRegistry())
}

// runProcessorWith is runProcessor registering its metrics on reg, which dev's view reads.
func runProcessorWith(ctx context.Context, cfg Config, log *zap.Logger, reg *prometheus.Registry) error {
	log.Info("starting", zap.Strings("brokers", cfg.Kafka.Brokers), zap.String("group", cfg.Kafka.GroupID),
		zap.Strings("inputs", cfg.Kafka.InputTopics), zap.Strings("redis", cfg.Redis.Addrs),
		zap.Bool("kafka_tls", cfg.Kafka.TLS.Enabled), zap.String("kafka_sasl", cfg.Kafka.SASL.Mechanism),
		zap.Bool("redis_tls", cfg.Redis.TLS.Enabled), zap.Bool("redis_auth", cfg.Redis.Password != ""),
		zap.Duration("retention", cfg.Retention))
	for _, w := range insecureWarnings(cfg.Kafka, &cfg.Redis) {
		log.Warn(w)
	}
	redis.SetLogger(redisLog{log.Named("redis")})
	// A mistake in the rules file stops the start before any connection.
	var rules alert.Rules
	if cfg.AlertRules != "" {
		var err error
		if rules, err = loadRules(cfg.AlertRules, cfg.Retention); err != nil {
			return err
		}
	}
	kc, rdb, err := openClients(cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rt := prometheus.NewCounter(prometheus.CounterOpts{Name: "repeatrate_redis_roundtrips_total",
		Help: "Redis round trips: commands sent alone plus pipelines."})
	reg.MustRegister(rt)
	rdb.AddHook(roundTrips{rt})
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		return explainRedis(cfg.Redis, err)
	}
	// A connection to Kafka that cannot work fails here with its cause.
	if err := kc.checkConnection(ctx); err != nil {
		return err
	}
	if told, err := aggregator.CheckEviction(ctx, rdb); err != nil {
		return err
	} else if !told {
		log.Info("redis does not tell its eviction policy; it must be noeviction, or evicted state goes unnoticed")
	}
	// Topics first: the state check below asks the group's committed offsets of the input topics.
	if cfg.Kafka.CreateTopics {
		if err := kc.ensureTopics(ctx, topicSpecs(cfg)); err != nil {
			return err
		}
	}
	// Every output must fit its topic, or its partition would block (docs/semantics.md#limits).
	if err := kc.checkOutputLimits(ctx, []string{cfg.Kafka.SnapshotTopic, cfg.Kafka.SuiteTopic, cfg.Kafka.AlertsTopic, cfg.Kafka.DLQTopic}, log); err != nil {
		return err
	}
	committed, err := kc.committed(ctx, cfg.Kafka.GroupID, cfg.Kafka.InputTopics, log)
	if err != nil {
		return err
	}
	state, err := aggregator.OpenStateIn(ctx, rdb, cfg.Redis.KeyPrefix, len(committed) > 0, aggregator.Layout(cfg.Redis.StateLayout))
	if err != nil {
		return err
	}
	log.Info("state", zap.String("namespace", state.Namespace), zap.String("epoch", state.Epoch), zap.Int("layout", int(state.Layout)))
	if state.Layout == aggregator.Layout10To11 {
		log.Warn("the namespace is migrating from state layout 10 to 11: every call carries its observations in both layouts until `repeatrate migrate` has finished")
	} else if int(state.Layout) != cfg.Redis.StateLayout {
		log.Warn("the namespace keeps the state layout it was created in; redis.state_layout applies to namespaces created from now on (`repeatrate migrate` moves one from layout 10 to 11 while the processors run)",
			zap.Int("layout", int(state.Layout)), zap.Int("state_layout", cfg.Redis.StateLayout))
	}
	st, err := openStores(ctx, rdb, state, cfg)
	if err != nil {
		return err
	}

	metrics := consumer.NewMetrics(reg)
	registerPair(reg, "repeatrate_computed_calls_total", "Apply calls the processor computed itself (redis.compute_calls), by result: stored, or refused because their aggregate changed after it was read, its TTL stamp fell due by Redis's clock, or Redis had lost store.lua (apply.lua ran them). Counted per attempt: a retried batch's calls count again.",
		"result", [2]string{"stored", "refused"}, st.rates.ComputedCalls)
	registerPair(reg, "repeatrate_computed_calls_left_total", "Apply calls apply.lua ran with redis.compute_calls on because the processor did not compute them, by reason: off_path (more than 1000 records, or read and found off the computed path: a new aggregate, a reassessment that moves the winner or grows the horizon, the window sums moved on from a minute this processor did not leave them at or an hour of minutes or more before, an hour that holds winners expiring, a prune of more than 300 minutes or into the hour's window, garbage collection, compaction, a new index group, a due TTL stamp), unread (in a batch left unread after one that computed fewer than half the records it read of aggregates that exist). Counted per attempt: a retried batch's calls count again.",
		"reason", [2]string{"off_path", "unread"}, st.rates.ComputedCallsLeft)
	registerPair(reg, "repeatrate_computed_buckets_total", "Layout 11's packed-store buckets the processor's computed calls met, by where it took them from: redis (read with the call's state), or cache (as the processor's stored calls on the aggregate left them, under the token and write stamp Redis still holds). Counted per attempt.",
		"from", [2]string{"redis", "cache"}, st.rates.BucketReads)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "repeatrate_bucket_cache_bytes",
		Help: "Bytes of layout 11's buckets the processor holds in place of reading them again, as it counts them (their records, and 48 a bucket and 160 an aggregate besides); redis.bucket_cache_bytes bounds them."},
		func() float64 { held, _ := st.rates.BucketCache(); return float64(held) }))
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "repeatrate_bucket_cache_evictions_total",
		Help: "Aggregates whose cached buckets the processor forgot to stay within redis.bucket_cache_bytes: their next call reads them from Redis. Rising steadily, the aggregates in use need a larger bound."},
		func() float64 { _, evicted := st.rates.BucketCache(); return float64(evicted) }))
	snapWriter, suiteWriter := kc.writer(cfg.Kafka.SnapshotTopic), kc.writer(cfg.Kafka.SuiteTopic)
	alertWriter, dlqWriter := kc.writer(cfg.Kafka.AlertsTopic), kc.writer(cfg.Kafka.DLQTopic)
	defer func() {
		// Writers are synchronous, so nothing is buffered; Close only releases connections.
		if err := errors.Join(snapWriter.Close(), suiteWriter.Close(), alertWriter.Close(), dlqWriter.Close()); err != nil {
			log.Warn("close writers", zap.Error(err))
		}
	}()
	// The read side's catalog (index, history, live feed) is recorded after each publish, off the
	// processor's path (README, Read side).
	catalog := readside.NewCatalog(rdb, cfg.Redis.KeyPrefix, cfg.Retention)
	recorder := readside.NewRecorder(sink.NewKafka(snapWriter, suiteWriter, alertWriter), catalog, reg, log.Named("readside"))
	// One receipt clock for the processor and the ingest: a wall clock stepped back does not make
	// either judge valid events "from the future".
	receipt := consumer.NewReceiptClock()
	proc, err := consumer.NewProcessor(consumer.ProcessorConfig{Suite: st.suiteCfg, Receipt: receipt.Now}, st.decoder, st.rates, st.suites,
		recorder,
		consumer.NewDeadLetters(dlqWriter, &consumer.KafkaDeadLetterLog{Client: kc.client(), Topic: cfg.Kafka.DLQTopic}).
			WithRecordLimit(int(dlqWriter.BatchBytes)), time.Now, log.Named("processor"), metrics)
	if err != nil {
		return err
	}
	group, err := consumer.NewGroup(consumer.GroupConfig{
		Brokers: cfg.Kafka.Brokers, GroupID: cfg.Kafka.GroupID, Topics: cfg.Kafka.InputTopics,
		Dialer: kc.dialer, MaxBatch: cfg.Batch.MaxMessages, MaxBatchBytes: cfg.Batch.MaxBytes, Linger: cfg.Batch.Linger,
		CommitDelay: cfg.Batch.CommitDelay, MaxInFlight: cfg.Batch.MaxInFlight, SessionTimeout: cfg.Kafka.Session,
	}, proc, log.Named("consumer"), metrics)
	if err != nil {
		return err
	}

	// Everything that can fail to build is built before anything runs.
	var srv *readside.HTTP
	var alerting *alert.Subscriber // set before the server runs
	if cfg.HTTPAddr != "" {
		tokens, err := auth.NewStore(cfg.HTTP.Tokens)
		if err != nil {
			return err
		}
		if tokens.Len() == 0 {
			log.Warn("no http tokens configured: the read API and pages refuse every request (README, Read side)")
		}
		ing, closeIngest, err := newIngest(cfg, kc, tokens, st.decoder, catalog, receipt.Now, reg, log.Named("ingest"))
		if err != nil {
			return err
		}
		defer closeIngest()
		// The read side lists the alerts any evaluator on this Redis keeps (run's or `repeatrate
		// alert`'s); reading needs no sink, so the name given is only a placeholder.
		alerts, err := alert.NewRedis(rdb, cfg.Redis.KeyPrefix, []string{"read"})
		if err != nil {
			return err
		}
		// Each Redis command a read request sends is charged to its token's read budget.
		rdb.AddHook(readside.ReadCost{})
		srv = readside.NewHTTP(readside.HTTPConfig{Alerts: alertsOfWorkspace{alerts}, Addr: cfg.HTTPAddr, ProbeAddr: cfg.HTTP.ProbeAddr, Pprof: cfg.Pprof, Ready: func(ctx context.Context) error { return errors.Join(rdb.Ping(ctx).Err(), ing.Backlog()) },
			Degraded: func() []string { return alertingDegraded(alerting) },
			Tokens:   tokens, PublicBadges: cfg.HTTP.PublicBadges, Metrics: cfg.HTTP.Metrics, AdminTokenSHA256: cfg.HTTP.AdminTokenSHA256,
			RateLimit: float64(cfg.HTTP.RateLimit), ReadBudget: float64(cfg.HTTP.ReadBudget), MaxReadsInFlight: cfg.HTTP.MaxReadsInFlight, MaxConns: cfg.HTTP.MaxConnections, MaxConnsPerIP: cfg.HTTP.MaxConnectionsPerAddress, Registerer: reg, Catalog: catalog, Suites: st.suites,
			Ingest: ing, IngestMaxBodyBytes: ing.MaxBodyBytes(), OTLPLogs: http.HandlerFunc(ing.ServeOTLP)},
			st.rates, reg, time.Now, log.Named("http"))
	}

	g, gctx := errgroup.WithContext(ctx)
	// Alerting first: it starts nothing when it fails to build.
	if cfg.AlertRules != "" {
		if alerting, err = startAlerting(gctx, g, cfg, rules, kc, rdb, alertWriter, reg, log); err != nil {
			return err
		}
	}
	// The recorder stops once the group has: the group publishes the batches in flight after gctx
	// ends, and the recorder's last write takes them in.
	rctx, stopRecording := context.WithCancel(context.WithoutCancel(gctx))
	defer stopRecording()
	g.Go(func() error { defer stopRecording(); return group.Run(gctx) })
	g.Go(func() error { return recorder.Run(rctx) })
	if srv != nil {
		g.Go(func() error { return srv.Run(gctx) })
		log.Info("http listening", zap.String("addr", cfg.HTTPAddr))
	}
	err = g.Wait()
	if err == nil {
		// The group committed what it processed: this process's batch mark is no longer needed.
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if cerr := st.rates.Close(cctx); cerr != nil {
			log.Warn("remove batch mark", zap.Error(cerr))
		}
		cancel()
	}
	log.Info("stopped", zap.Error(err))
	return err
}

// topicSpecs lists every topic the processor reads or writes, as create_topics creates them.
func topicSpecs(cfg Config) []topicSpec {
	var specs []topicSpec
	for _, t := range cfg.Kafka.InputTopics {
		specs = append(specs, topicSpec{name: t, partitions: 4})
	}
	return append(specs, topicSpec{name: cfg.Kafka.SnapshotTopic, partitions: 4, compacted: true},
		topicSpec{name: cfg.Kafka.SuiteTopic, partitions: 4, compacted: true},
		topicSpec{name: cfg.Kafka.AlertsTopic, partitions: 1},
		topicSpec{name: cfg.Kafka.DLQTopic, partitions: 1})
}

// redisLog sends go-redis's own messages (failed dials, cluster slot reloads) to the JSON log as
// warnings, instead of plain lines on stderr.
type redisLog struct{ log *zap.Logger }

// Printf logs one go-redis message.
func (l redisLog) Printf(_ context.Context, format string, v ...any) {
	l.log.Warn(strings.TrimSpace(fmt.Sprintf(format, v...)))
}

// alertsOfWorkspace lists the alerts of a workspace for the read side's GET /v1/alerts: the
// alert store's records as the read side declares them.
type alertsOfWorkspace struct{ store *alert.Redis }

func (a alertsOfWorkspace) CurrentAlerts(ctx context.Context, ws string, limit int) ([]readside.CurrentAlert, error) {
	cur, err := a.store.CurrentAlerts(ctx, ws, limit)
	out := make([]readside.CurrentAlert, len(cur))
	for i, c := range cur {
		out[i] = readside.CurrentAlert(c)
	}
	return out, err
}

// registerPair registers counter name, labelled label with each of values, read from get: the
// first value's count is get's first result, the second's its second.
func registerPair(reg prometheus.Registerer, name, help, label string, values [2]string, get func() (int64, int64)) {
	for i, v := range values {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: name, Help: help, ConstLabels: prometheus.Labels{label: v},
		}, func() float64 {
			a, b := get()
			return float64([2]int64{a, b}[i])
		}))
	}
}
