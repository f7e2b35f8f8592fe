package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/repeatrate/repeatrate/alert"
)

func alertCommand(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	return configured(ctx, "alert", args, getenv, stderr, runAlertOnly)
}

// loadRules reads and validates the rules file against the identity retention: a mistake stops
// the start with every error, each naming its rule and field.
func loadRules(path string, retention time.Duration) (alert.Rules, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return alert.Rules{}, fmt.Errorf("alert rules: %w", err)
	}
	rs, err := alert.Parse(b)
	if err == nil {
		err = rs.CheckRetention(retention)
	}
	if err != nil {
		return alert.Rules{}, fmt.Errorf("alert rules %s: %w", path, err)
	}
	return rs, nil
}

// runAlertOnly is `repeatrate alert`: the evaluator alone, as a subscriber of the snapshot topics,
// with its metrics on the HTTP address.
func runAlertOnly(ctx context.Context, cfg Config, log *zap.Logger) error {
	if cfg.AlertRules == "" {
		return errors.New("alert: --alert-rules is required")
	}
	rules, err := loadRules(cfg.AlertRules, cfg.Retention)
	if err != nil {
		return err
	}
	kc, rdb, err := openClients(cfg)
	if err != nil {
		return err
	}
	defer rdb.Close()
	w := kc.writer(cfg.Kafka.AlertsTopic)
	defer w.Close()
	reg := prometheus.NewRegistry()
	g, gctx := errgroup.WithContext(ctx)
	if _, err := startAlerting(gctx, g, cfg, rules, kc, rdb, w, reg, log); err != nil {
		return err
	}
	if cfg.HTTPAddr != "" {
		srv := &http.Server{Addr: cfg.HTTPAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	err = g.Wait()
	log.Info("stopped", zap.Error(err))
	return err
}

// startAlerting starts the alert subscriber and evaluator on g: the subscriber reads the snapshot,
// suite and alerts topics whole and hands updates to the evaluator through a channel of one
// (it blocks while the evaluator works, which holds back nothing but its own reads); both end
// with ctx, and neither returns an error before: a Kafka, Redis or sink failure is retried and
// counted, never the end of g (inside run, of the processor). It returns the subscriber, whose
// Degraded tells what it is retrying.
func startAlerting(ctx context.Context, g *errgroup.Group, cfg Config, rules alert.Rules, kc *kafkaClients,
	rdb redis.UniversalClient, w *kafka.Writer, reg prometheus.Registerer, log *zap.Logger) (*alert.Subscriber, error) {
	sinks := []alert.Sink{alert.NewKafka(w)}
	if cfg.AlertmanagerURL != "" {
		longest := time.Duration(0)
		for _, r := range rules.Rules {
			longest = max(longest, r.ResendInterval)
		}
		sinks = append(sinks, alert.NewAlertmanager(cfg.AlertmanagerURL, longest, 30*time.Second))
	}
	if cfg.AlertWebhookURL != "" {
		wh, err := alert.NewWebhook(cfg.AlertWebhookURL, []byte(cfg.AlertWebhookSecret), 30*time.Second, time.Now)
		if err != nil {
			return nil, err
		}
		sinks = append(sinks, wh)
	}
	names := make([]string, len(sinks))
	for i, s := range sinks {
		names[i] = s.Name()
	}
	store, err := alert.NewRedis(rdb, cfg.Redis.KeyPrefix, names)
	if err != nil {
		return nil, err
	}
	metrics := alert.NewMetrics(reg)
	ev, err := alert.NewEvaluator(alert.EvaluatorConfig{Rules: rules}, store, sinks, time.Now, log.Named("alert"), metrics)
	if err != nil {
		return nil, err
	}
	sub := &alert.Subscriber{Brokers: cfg.Kafka.Brokers, Dialer: kc.dialer, Partitions: kc.partitions, Log: log.Named("alert"),
		Metrics: metrics, Topics: []string{cfg.Kafka.SnapshotTopic, cfg.Kafka.SuiteTopic, cfg.Kafka.AlertsTopic}}
	updates := make(chan alert.Update, 1)
	g.Go(func() error { return sub.Run(ctx, updates) })
	g.Go(func() error { return ev.Run(ctx, updates) })
	log.Info("alerting", zap.String("rules", cfg.AlertRules), zap.Int("count", len(rules.Rules)), zap.Strings("sinks", names))
	return sub, nil
}

// alertingDegraded is what /readyz says of alerting: nothing while sub reads every partition
// (or alerting is off), else how many it is retrying, without the topics' names or addresses.
func alertingDegraded(sub *alert.Subscriber) []string {
	if sub == nil {
		return nil
	}
	if n := len(sub.Degraded()); n > 0 {
		return []string{fmt.Sprintf("alerting: kafka subscription retrying (%d partitions or topics)", n)}
	}
	return nil
}
